"""Disaggregation's verbs on a replica: a request's KV leaves one replica for another.

:class:`KVHandoff` is a base class of :class:`~sim.engine.core.replica.Replica`, used by
:mod:`sim.engine.fleet.disaggregation`: a prefill replica hands a request off when its prefill
completes (:meth:`KVHandoff._hand_off`) and frees its blocks when the KV has left
(:meth:`KVHandoff.release`); a decode replica takes blocks for a transfer on its way
(:meth:`KVHandoff.reserve`) and starts the request decoding when it lands
(:meth:`KVHandoff.receive`).

The same verbs land the blocks an offload tier loads (:mod:`sim.engine.kv.offload`): a request
admitted with a tier hit holds its blocks off the batch while they load
(:meth:`KVHandoff._admit_loading`, counted in ``num_loading`` and ``num_in_transit``) and
continues its prefill when they land (:meth:`KVHandoff.land`; tests/test_offload.py).

Invariant (tests/test_disaggregation.py): ``num_free + blocks held + blocks of the
``num_in_transit`` transfers leaving or reaching this replica == num_blocks``.
"""

from __future__ import annotations

from . import radix_loads
from .queues import _del_running, _set_running
from .request import DECODE, PREFILL


class KVHandoff:
    """A replica's KV hand-off verbs (see the module docstring)."""

    def _hand_off(self, r, now) -> None:
        """``r`` completed its prefill here and decodes elsewhere: it leaves the running set
        (its batch slot is free) but keeps its blocks until :meth:`release` (its KV is being
        sent); status DECODE-bound (``DECODE``, tracked by no replica meanwhile)."""
        r.status = DECODE
        _del_running(self.running, r.index)
        self.num_in_transit += 1
        self.on_prefilled(r, now)

    def release(self, r) -> None:
        """A handed-off request's KV has left: free the blocks it held here."""
        self._free_blocks(r, self.blocks_of(r.num_computed))
        self.num_in_transit -= 1

    def reserve(self, num_blocks: int) -> bool:
        """Take ``num_blocks`` free blocks for a KV transfer on its way here (False, nothing
        taken, when fewer are free)."""
        if num_blocks > self.blocks.num_free:
            return False
        self.blocks.allocate(num_blocks)
        self.num_in_transit += 1
        return True

    def stand_by(self) -> None:
        """The batch just formed is empty and will not run (the engine sleeps until a KV
        transfer frees or brings blocks): no iteration is in flight."""
        self._decodes_reserved = -1

    def receive(self, r) -> None:
        """``r``'s KV (``r.num_computed`` tokens, blocks taken with :meth:`reserve`) has
        arrived: it joins the running set and decodes from the next iteration this replica
        forms (the one after the iteration in flight, if any)."""
        in_flight = self._decodes_reserved == self.clock
        self.num_in_transit -= 1
        _set_running(self.running, r.index, r)
        r.kv_keys = ()
        r.tree_tokens = 0
        r.output_keys = None  # its prompt's blocks are not cached here: neither is its answer
        self.decodes.start(r, self.clock if in_flight else self.clock - 1)
        if self.num_spec_tokens:
            self.decodes.flush()

    def _admit_loading(self, r, nodes, loaded) -> bool:
        """Block mode with an offload tier: admit waiting ``r`` whose ``nodes`` leading blocks
        are cached on the GPU and the ``loaded`` after them in the tier: it references the
        first, takes blocks for the others and waits off the batch while they load (False,
        nothing changed, when the blocks are short). It holds them as anonymous blocks until
        :meth:`land` caches them under its keys. Its prefill tokens this iteration: none (a
        policy counts the chunk it asked for against its budget: a deviation)."""
        if self.radix:  # (the radix tree's: tokens, not blocks)
            return radix_loads.admit_loading(self, r, nodes, loaded)
        blocks, bs, keys = self.blocks, self.block_size, r.block_keys
        free = blocks.num_free
        if loaded > free or nodes and loaded + nodes > free and \
                loaded + self.prefix_pinned(r) > free:
            return False
        self._dequeue(r)
        self._hits.pop(r, None)
        # (made recent: not evicted now; a chain queues it on its link behind earlier loads;
        # loaded before its GPU hit's use is stored, which may evict what it loads)
        tier = self.tier
        span = keys[nodes:nodes + loaded]
        overlap = getattr(tier, "prefill", None)
        if overlap is not None:  # (the tiers it reads, before the load promotes them)
            latency = max(tier.tiers[tier._tier_of(k)].latency for k in span.tolist())
        seconds = tier.load(span, self.now)
        if overlap is not None:  # layer-wise: only the load its prefill's compute cannot hide
            rest = r.prefill_target - (nodes + loaded) * bs
            seconds = max(latency, seconds - overlap(r, rest))
        held = keys[:nodes]
        blocks.acquire(held)
        blocks.allocate(loaded)
        r.kv_keys = held
        r.status = PREFILL
        r.num_computed = (nodes + loaded) * bs
        r.scheduled_iteration = -1
        if r.first_scheduled_time is None:
            r.first_scheduled_time = self.now
            r.num_cached_tokens = r.num_computed
            r.num_offload_tokens = loaded * bs
        r.load_time += seconds
        self.num_loading += 1
        self.num_in_transit += 1
        self.on_load(r, seconds, nodes * bs)
        return True

    def land(self, r, start) -> None:
        """``r``'s blocks from the tier have landed: its tokens ``start..num_computed`` become
        cached under its keys and it joins the running set, prefilling from there."""
        if self.radix:
            return radix_loads.land(self, r)
        self.num_loading -= 1
        self.num_in_transit -= 1
        self._register(r, start, r.num_computed)
        _set_running(self.running, r.index, r)
        self.prefilling += (r,)
