"""A radix-mode replica's verbs for an offload tier hit (:mod:`sim.engine.kv.radix_tiers`).

:func:`admit_loading` admits a waiting request whose match continues into the tiers: it
references its GPU path, takes pages for the loaded tokens and waits off the batch
(``num_loading``, ``num_in_transit``) for the chain's load time (less what its prefill hides,
with layer-wise overlap); :func:`land` puts the landed tokens into the tree and the request in
the running set, prefilling from there. :class:`~sim.engine.core.handoff.KVHandoff`'s
``_admit_loading`` and ``land`` call them in radix mode (block mode: their own).

Invariant (tests/test_radix_tiers.py, ``check=True``): the pages a loading request holds are
counted free by nobody and held by no running request: ``num_in_transit`` accounts for them.
"""

from __future__ import annotations

import numpy as np

from .queues import _set_running
from .request import PREFILL


def admit_loading(rep, r, nodes: int, loaded: int) -> bool:
    """Radix mode: admit waiting ``r`` whose first ``nodes`` nodes are cached on the GPU and
    the ``loaded`` tokens after them in the tiers (False, nothing changed, when pages are
    short): it references its GPU path, takes pages for the loaded tokens and waits off the
    batch until they land (:func:`land`)."""
    blocks, bs, keys = rep.blocks, rep.block_size, r.block_keys
    tier = rep.tier
    cached = nodes * blocks.unit
    need = loaded // bs
    if need > blocks.num_free or nodes and need + rep.prefix_pinned(r) > blocks.num_free:
        return False
    rep._dequeue(r)
    rep._hits.pop(r, None)
    rep._pins.pop(r, None)
    span = np.array(keys[nodes:nodes - (-loaded // blocks.unit)], dtype=object)  # (.tolist)
    latency = max(tier.tiers[tier._tier_of(c)].latency for c in span.tolist())
    if tier.prefetch_policy is None:  # (before its GPU path's use stores, which may evict)
        seconds = tier.load(span, rep.now)
    else:  # its lower tiers' nodes prefetched into the first, waited for per the policy
        wait = tier.last_wait  # (the _tier_hit just asked decided it)
        seconds = wait + tier.load(span, rep.now + wait, prefetched=True)
    held = list(keys[:nodes])
    blocks.acquire(held)
    if tier.prefill is not None:  # layer-wise overlap: only the load its compute cannot hide
        seconds = max(latency, seconds - tier.prefill(r, r.prefill_target - cached - loaded))
    blocks.allocate(need)
    r.kv_keys = held
    r.tree_tokens = cached
    r.status = PREFILL
    r.num_computed = cached + loaded
    r.scheduled_iteration = -1
    if r.first_scheduled_time is None:
        r.first_scheduled_time = rep.now
        r.num_cached_tokens = r.num_computed
        r.num_offload_tokens = loaded
    r.load_time += seconds
    rep.num_loading += 1
    rep.num_in_transit += 1
    rep.on_load(r, seconds, cached)
    return True


def land(rep, r) -> None:
    """Radix mode: ``r``'s loaded tokens have landed: they enter the tree, and ``r`` joins the
    running set, prefilling from there."""
    rep.num_loading -= 1
    rep.num_in_transit -= 1
    rep._insert(r)
    _set_running(rep.running, r.index, r)
    rep.prefilling += (r,)
