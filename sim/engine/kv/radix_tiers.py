"""Offload tiers under SGLang's radix prefix cache (HiCache: GPU -> host -> L3 storage).

:class:`RadixTierChain` is a :class:`~sim.engine.kv.tiers.KVTierChain`'s replica-side chain
(:class:`~sim.engine.kv.tiers.TierChain`: the same stores, write policies, demotion, shared
link, load threshold and traffic counters) whose unit is a radix node - one hash id's span of
``unit`` tokens, as SGLang's host pool keeps and evicts whole nodes (``HiRadixCache``).
:class:`TieredRadixBlockManager` is the radix tree feeding it; the replica's verbs for a
tier hit are :mod:`sim.engine.core.radix_loads` (``KVHandoff`` dispatches to them in radix
mode). The model (tests/test_radix_tiers.py):

- **Stores.** ``write_back``: a node the tree evicts (an unreferenced leaf) enters the first
  tier; ``write_through``: a node enters it when its tokens enter the tree (after each prefill
  chunk, SGLang's ``write_backup`` on insert); ``write_through_selective``: once used
  ``write_threshold`` times (its computation and each GPU hit count one: HiCache's
  ``hit_count``). A node stored with fewer tokens than it later holds is updated in place.
- **Hits.** A request whose GPU match ends on a node boundary continues its match into the
  tiers: the following nodes some tier holds, consecutively (the last may be partly filled),
  capped as the GPU match is (``prompt - 1`` tokens, whole pages). A hit shorter than
  ``load_threshold`` tokens is recomputed (HiCache's ``load_back_threshold``, 10 tokens in
  ``hiradix_cache.py``).
- **Loads are asynchronous**: at admission the request references its GPU path, takes pages
  for the loaded tokens and waits off the batch (iterations go on) for the chain's
  ``load`` time (queued on the link, FIFO); when they land its loaded tokens enter the tree
  (:meth:`~sim.engine.kv.prefix_hits.PrefixHits._insert`) and it continues its prefill as a
  running partial prefill.
- **Layer-wise overlap** (``KVTierChain.layer_overlap``; off unless set): the load of layer
  ``i + 1`` runs under the compute of layer ``i``, so the request waits only the part of the
  load its prefill's compute cannot hide: ``max(latency, load - prefill_seconds(rest))``, with
  the rest of its prompt priced alone by the run's cost model (a bound: batched with others
  its prefill takes longer and hides more; the prefill itself is then charged in full). Block
  mode has the same rule (``KVHandoff._admit_loading``).
- **Prefetch policies** (``KVTierChain.prefetch_policy``, SGLang's
  ``--hicache-storage-prefetch-policy``; None: the lower tiers are read at admission and
  waited for): :meth:`RadixTierChain.prefetch`. **Prefetch threshold**
  (``KVTierChain.prefetch_threshold``, 256 in the hicache preset): the hit stops at its
  first lower-tier node when fewer tokens than that remain past it (the matchable prompt,
  ``prompt - 1`` tokens, less the GPU and first-tier match; SGLang's is the whole rest,
  one token more).

- **The first tier keeps the GPU's nodes.** Its copy of a node the tree still holds is never
  evicted (SGLang's ``HiRadixCache.evict_host`` evicts only nodes already evicted from the
  device, ``if not x.evicted: continue``): under write-through that copy is the node's only
  way into the tier (an eviction stores nothing), so dropping it lost the node. When every
  entry is such a copy the store is refused (``write_backup`` finds no host room: the node is
  not backed up), the node reaches no lower tier (HiCache writes to storage only what a host
  write backed up: ``writing_check`` -> ``write_backup_storage``), and a selective policy
  tries again at its next use (HiCache retries at each hit past the threshold).
- **An L3 hit needs host room.** The hit stops at its first lower-tier node unless the first
  tier can take the prompt's rest past the GPU and first-tier match (whole nodes): its free
  entries plus the copies it may evict, the request's own first-tier hit not among them
  (SGLang's ``prefetch_from_storage``: host ``alloc`` for that rest after ``evict_host``,
  the host match protected; nothing prefetched without it). The nodes read from L3 then
  enter the first tier, evicting per its policy (demoted to L3). So an L2 of 1.25 times
  the GPU pool holds mostly the GPU's own copies and serves about half the hits, L3 the
  rest; one the GPU pool's size (``--hicache-ratio 1``, which SGLang refuses) has no room
  and neither serves (``experiments/offload_tiers.py``'s ``hicache_pair``,
  tests/test_hicache_pair.py). Whether all
  its copies are kept is remembered until a node leaves the GPU
  (``TieredRadixBlockManager.departures``), so a full L2 refuses without a scan.

Deviations: a node is a tier entry whatever its fill, so a partly filled node (a prompt's or
answer's end) takes a whole node's capacity, bytes and link time; a kept copy met at the
tier's eviction end moves to its most recent end (HiCache orders host leaves by last access);
an L3 hit is promoted into the first tier as it is read (HiCache prefetches L3 -> L2 while
the request waits: the same total, one queue); L3 is fed by the first tier's evictions
(HiCache writes each node to storage once its host write lands, so its L3 also holds what
its L2 holds: the same hits, more bytes written to L3 there); the host room for an L3 hit
is judged at admission, not at arrival, and HiCache's cap on tokens in flight to the host
(``prefetch_capacity_limit``, 0.8 x (host - device) tokens) is not modelled. Block mode
(:mod:`sim.engine.kv.tiers`) may still drop a block the GPU holds: write-back stores it
again when the GPU evicts it.

Invariant: a tier capacity of 0 holds nothing (bit-identical to no tier); the tokens a hit
loads were computed on the GPU under the same chain keys.
"""

from __future__ import annotations

import heapq

from .radix import RadixBlockManager
from .tiers import TierChain


class RadixTierChain(TierChain):
    """One replica's chain of tiers under the radix tree (see the module docstring)."""

    def __init__(self, setting, node_bytes: float, unit: int, page: int, prefill=None):
        super().__init__(setting, node_bytes, unit, prefill)
        self.unit, self.page = unit, page
        self.tokens = {}  # node -> tokens its tier copy holds (stale once dropped: harmless)
        self.min_tokens = setting.load_threshold
        self.prefetch_policy = getattr(setting, "prefetch_policy", None)
        self.prefetch_threshold = getattr(setting, "prefetch_threshold", 0)
        self.last_wait = 0.0  # the prefetch wait the last radix_hits decided

    def manager(self, kv_blocks, block_size, tier=None):
        """The radix pool that feeds this chain (``Replica`` builds its pool through it)."""
        pool = TieredRadixBlockManager(kv_blocks, block_size, self.unit, self)
        first = self.stores[0]
        first.keep = pool._len.__contains__  # the GPU's nodes stay (HiCache)
        first.keep_version = pool.departures.__int__  # (grows when a node leaves the GPU)
        return pool

    def note(self, nodes, lens) -> None:
        """``nodes`` enter (or may enter) a tier holding ``lens[node]`` tokens each."""
        tokens = self.tokens
        for c in nodes:
            n = lens[c]
            if tokens.get(c, 0) < n:
                tokens[c] = n

    def radix_hits(self, keys, cached: int, nodes: int, limit: int, start: float = 0.0,
                   now: float = 0.0):
        """``(tokens, nodes)`` the tiers hold after a GPU match of ``cached`` tokens over
        ``nodes`` nodes (continued only from a node boundary), at most ``limit`` tokens in
        all; ``(0, 0)`` below the load threshold. With a prefetch policy, of a request that
        arrived at ``start``, asked at ``now``: only the nodes the policy lets it use
        (:meth:`prefetch`; its wait is left in ``last_wait``)."""
        unit = self.unit
        self.last_wait = 0.0
        if self.empty or cached != nodes * unit or cached >= limit:
            return 0, 0
        tokens, n, m = self.tokens, nodes, cached
        took = []
        while m < limit and n < len(keys):
            c = keys[n]
            held = tokens.get(c, 0)
            tier = self._tier_of(c)
            if not held or tier < 0:
                break
            took.append((c, tier, min(held, limit - m)))
            m += took[-1][2]
            n += 1
            if held < unit:
                break
        if self.prefetch_threshold and took:
            m = self._below_threshold(took, cached, limit, m)
        if any(k for _c, k, _t in took):
            m = self._host_room(took, cached, limit, m)
        if self.prefetch_policy is not None and took:
            usable, self.last_wait = self.prefetch(took, start, now)
            m = cached + sum(t for _c, _k, t in took[:usable])
        got = (m - cached) // self.page * self.page
        if self.chunk_blocks > 1:  # whole chunks of the prompt (LMCache's; HiCache has none)
            got = max(0, (cached + got) // (self.chunk_blocks * unit) * self.chunk_blocks
                      * unit - cached)
        if not got or got < self.min_tokens:
            return 0, 0
        return got, -(-got // unit)

    def _below_threshold(self, took, cached: int, limit: int, m: int) -> int:
        """The hit's end (tokens) once ``took`` (cut in place) loses its nodes from the
        first lower-tier one on when fewer than ``prefetch_threshold`` tokens of the prompt
        (its matchable ``limit``) lie past the GPU and first-tier match: SGLang's scheduler
        asks ``prefetch_from_storage`` for the tokens past ``prefix_len + host_hit_length``
        and it prefetches nothing below the threshold."""
        for i, (_c, k, _t) in enumerate(took):
            if k > 0:
                matched = cached + sum(t for _c, _k, t in took[:i])
                if limit - matched < self.prefetch_threshold:
                    del took[i:]
                    return matched
                break
        return m

    def _host_room(self, took, cached: int, limit: int, m: int) -> int:
        """The hit's end (tokens) once ``took`` (cut in place) loses its nodes from the
        first lower-tier one on when the first tier cannot make room for the prompt's rest
        past the GPU and first-tier match (``limit`` less that match, in whole nodes): its
        free entries and the copies it may evict, less the request's own first-tier hit
        (SGLang's ``prefetch_from_storage`` allocates host memory for that rest, after
        ``evict_host`` with the host match protected, and prefetches nothing without it)."""
        i = next(j for j, (_c, k, _t) in enumerate(took) if k > 0)
        matched = cached + sum(t for _c, _k, t in took[:i])
        need = -(-(limit - matched) // self.unit)
        if self.stores[0].room(need, {c for c, _k, _t in took[:i]}):
            return m
        del took[i:]
        return matched

    def prefetch(self, took, start: float, now: float):
        """``(usable, wait)``: how many of the hit's nodes ``took`` (``(node, tier, tokens)``,
        in order) a request arrived at ``start`` may use when admitted at ``now``, and how
        long it waits first. Its nodes below the first tier were prefetched into it from
        ``start`` on (SGLang starts the L3 -> L2 prefetch when a request is queued): after
        their tiers' latency, one node after the other at each tier's read bandwidth (its
        own path, not the GPU link). ``best_effort``: what arrived by ``now``, no wait;
        ``wait_complete``: all, waiting until the last arrived; ``timeout``: all if they
        arrive by the deadline (``prefetch_timeout_base + per_ki_token * tokens / 1024``
        after ``start``), else what arrived by then, waiting until it (SGLang's
        ``can_terminate_prefetch``)."""
        lower = [(i, k, t) for i, (_c, k, t) in enumerate(took) if k > 0]
        if not lower:
            return len(took), 0.0
        tiers, bytes_ = self.tiers, self.block_bytes
        latency = max(tiers[k].latency for _i, k, _t in lower)
        arrive, t = [], start + latency
        for _i, k, _t in lower:
            t += bytes_ / (tiers[k].read_gbps * 1e9)
            arrive.append(t)
        done = arrive[-1]
        policy, setting = self.prefetch_policy, self.setting
        if policy == "wait_complete":
            return len(took), max(0.0, done - now)
        if policy == "timeout":
            tokens = sum(tk for _i, _k, tk in lower)
            deadline = start + setting.prefetch_timeout_base + \
                setting.prefetch_timeout_per_ki_token * tokens / 1024
            if done <= max(now, deadline):
                return len(took), max(0.0, done - now)
            cut = max(now, deadline)
            wait = cut - now
        else:  # best_effort
            cut, wait = now, 0.0
        arrived = sum(1 for a in arrive if a <= cut)
        usable = lower[arrived][0] if arrived < len(lower) else len(took)
        return usable, wait


class TieredRadixBlockManager(RadixBlockManager):
    """The radix tree whose evictions (write-back), insertions (write-through: computed) and
    GPU hits (used) reach a :class:`RadixTierChain`."""

    __slots__ = ("tier", "departures")

    def __init__(self, num_blocks: int, block_size: int, unit: int, tier: RadixTierChain):
        super().__init__(num_blocks, block_size, unit)
        self.tier = tier
        self.departures = _Count()  # nodes that left the tree (evicted or unlinked)

    def unlink(self, c) -> None:
        self.departures.n += 1
        super().unlink(c)

    def acquire(self, nodes) -> None:
        super().acquire(nodes)
        tier = self.tier
        if tier.policy != "write_back" and len(nodes) and not tier.empty:
            tier.note(nodes, self._len)
            tier.used(list(nodes))

    def insert(self, keys, held: list, covered: int, upto: int) -> int:
        tier, lens = self.tier, self._len
        if tier.policy == "write_back" or tier.empty or covered >= upto:
            return super().insert(keys, held, covered, upto)
        span = list(keys[covered // self.unit:-(-upto // self.unit)])
        new = [c for c in span if c not in lens]
        out = super().insert(keys, held, covered, upto)
        tier.note(span, lens)  # (a node it grew: its tier copy grows with it)
        if new:
            tier.computed(new)
        return out

    def _evict_one(self) -> int:
        tier = self.tier
        self.departures.n += 1
        if tier.policy != "write_back" or tier.empty:
            return super()._evict_one()
        heap, lens, ref, kids, stamp = self._heap, self._len, self._ref, self._kids, self._stamp
        while True:  # (the victim _evict_one takes next, found without popping it)
            s, c = heap[0]
            if c in lens and not ref[c] and not kids[c] and stamp[c] == s:
                break
            heapq.heappop(heap)
        tier.note((c,), lens)
        tier.store([c])
        return super()._evict_one()


class _Count:
    """A counter read through ``int()`` (a store's ``keep_version``)."""

    __slots__ = ("n",)

    def __init__(self):
        self.n = 0

    def __int__(self) -> int:
        return self.n
