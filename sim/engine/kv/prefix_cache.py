"""vLLM v1's block-hash prefix cache as a KV pool (``prefix_caching="block"``).

:class:`PrefixCachingBlockManager` is :class:`~sim.engine.kv.blocks.BlockManager` plus what
caching needs: a key per cached full block, reference counts, and one LRU queue of free blocks
whose keys survive until reused; :class:`PrefixLookup` is a waiting request's lookup, kept
between asks. Its layout and invariants: the class docstring (tests/test_prefix_caching.py).
Compiled (sim/native.py), both are C types (prefix_cache.pxd): their methods cannot be set on
the class, a Python subclass overrides them (the offloading pools, the tests' ``_Watched``).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from . import key_ops
from .blocks import BlockManager


class PrefixCachingBlockManager(BlockManager):
    """The pool with vLLM v1's block-hash prefix caching (``prefix_caching="block"``).

    Only full blocks are cached. A block's key chains its parent's key and its tokens
    (:func:`workloads.prefix_block_keys`), interned as an id (:func:`workloads.prefix.
    block_key_ids`): a request's keys are an integer array, and the per-key state lives in one
    array indexed by id, so every operation on a request's keys is a few vectorised passes, not
    a Python call per key (Mooncake's prompts hold ~750 keys each). ``_state[k]`` is the
    reference count of cached key ``k`` (requests holding it) when positive, ``-serial`` when it
    is cached with no reference (free, in the run of the queue with that serial), 0 when it is
    not cached. Free blocks form one LRU queue (head = next reused): cached blocks with no
    reference keep their key there until the head reaches them (eviction), so a later request -
    or a preempted one coming back - can still hit them; anonymous free blocks (never cached, or
    freed without a key) sit in runs of counts. A request frees its blocks tail first:
    anonymous blocks, then its keyed blocks in reverse order, so a sequence's last blocks are
    evicted before its first (vLLM's free order).

    The queue is a deque of runs: ``[count]`` anonymous blocks, or ``[serial, keys, pos]`` the
    cached blocks one release freed (an id array, in eviction order), the first ``pos`` already
    gone. A hit that takes a free key out of the queue only sets its state to a count, and the
    entry, whose key no longer holds ``-serial``, is skipped when the head reaches it (O(1) per
    key, where an ordered dict's deletions and resizes cost O(queue)). Such a hit marks its
    entries' runs stale (``_stale``, their serials); a run not marked holds only live entries,
    so the head evicts its next blocks without reading their state.

    A key leaves the cache only by an eviction and enters it only by a registration, so a
    waiting request's :class:`PrefixLookup` keeps its hit while neither happened
    (``num_evictions``, ``additions``) and resumes the walk from it while no eviction did; the
    free blocks among the hit change only with references (``ref_changes``) and evictions.
    Evictions happen almost every iteration once the pool is full, and only those of the hit's
    keys shrink it: the pool logs the keys it evicted (the last ``num_blocks`` or more), and a
    lookup asked again checks those evicted since its last ask against its hit (O(evicted), not
    O(prompt), where fewer: a blocked queue head is asked every iteration; measured on the
    Mooncake trace, 2.6 keys evicted between asks against a walk of ~2,000 ids). A chained key names its whole
    prefix, so a key id sits at one block position in every prompt that holds it; ``_pos``
    records it (position + 1, set once) for the keys of the hits checked so far, and the check
    finds an evicted key's position there. Should an id sit at two positions, the lookup that
    finds it placed elsewhere walks from its first key at every ask after an eviction.

    Invariants (tests/test_prefix_caching.py): ``num_free`` = the live entries' blocks, and
    each key whose state is negative has exactly one live entry; a queued run whose serial is
    not in ``_stale`` has no stale entry; ``num_free + distinct blocks
    held == num_blocks``; a lookup answers what :meth:`hits` and :meth:`pinned` from the first
    key answer. The arrays grow to hold the ids of every :meth:`lookup` (a request is looked up
    before it is admitted); the other methods take ids a lookup has seen, or below
    ``num_keys``, or given to :meth:`cache_answer` (which makes room too: a finished
    request's answer blocks, named by its conversation's next turn, which may not have been
    looked up yet). It costs 8 bytes per id up to the largest seen (state and position), per
    replica.
    """

    __slots__ = ("_queue", "_state", "_serial", "_entries", "num_evictions", "ref_changes",
                 "additions", "_pos", "_log", "_log_size", "_stale")

    def __init__(self, num_blocks: int, block_size: int, num_keys: int = 0):
        super().__init__(num_blocks, block_size)
        self._queue = deque([[self.num_blocks]])
        self._state = np.zeros(num_keys, dtype=np.int32)
        self._pos = np.zeros(num_keys, dtype=np.int32)  # a placed key's block position + 1
        self._log = []  # the evicted keys, in eviction order: arrays or lists, oldest first
        self._log_size = 0
        self._serial = 0
        self._entries = 0  # keyed entries in the queue, stale ones included
        self._stale = set()  # serials of the queued runs with stale entries
        self.num_evictions = 0  # a cached prefix only shrinks by evictions
        self.ref_changes = 0  # acquires and releases: which cached blocks are free changes
        self.additions = 0  # registrations: a cached prefix only grows by them

    def lookup(self, keys) -> PrefixLookup:
        """A lookup of the id array ``keys`` (room made for its ids)."""
        self._make_room(keys)
        return PrefixLookup(keys)

    def _make_room(self, keys) -> None:
        top = key_ops.top(keys)
        size = len(self._state)
        if top > size:  # grow geometrically: ids arrive in first-appearance order
            grow = np.zeros(max(top, 2 * size) - size, dtype=np.int32)
            self._state = np.concatenate((self._state, grow))
            self._pos = np.concatenate((self._pos, grow))

    def cache_answer(self, keys):
        """:meth:`register` of a finished request's answer blocks (``keys``: ids its
        conversation's next turn names, which no lookup may have seen yet: room made)."""
        self._make_room(keys)
        return self.register(keys)

    def hits(self, keys, start: int, limit: int) -> int:
        """How many of ``keys[:limit]`` are cached from the first on, given that the first
        ``start`` are."""
        return key_ops.hits(self._state, keys, start, limit)

    def pinned(self, keys, hit: int) -> int:
        """How many of the cached ``keys[:hit]`` are free (taking them uses free blocks; the
        radix pool's method of the same name answers the same question)."""
        return key_ops.count_free(self._state, keys, hit)

    def refresh(self, look, limit: int) -> int:
        """``look``'s hit (:meth:`hits` of its keys from 0 up to ``limit``): kept while nothing
        was cached and none of its keys evicted since it was last asked, cut at its first key
        evicted since, resumed from its end (or the cut) after additions, walked again from the
        first key when the evictions since are no longer logged."""
        evictions, additions = self.num_evictions, self.additions
        hit = look.hit
        start = hit
        if look.evictions != evictions:
            cut = self._cut(look, evictions - look.evictions) if look.evictions >= 0 else -1
            if cut < 0:  # not known: walk from the first key
                look.pin_state = None
                start = 0
            elif cut < hit:  # keys[cut] was evicted: the hit ends there unless re-added
                look.pin_state = None
                start = cut
                if look.additions == additions:
                    look.hit = hit = min(cut, limit)
                    look.evictions, look.limit = evictions, limit
                    return hit
            look.evictions = evictions
        if look.additions == additions and look.limit == limit and start == hit:
            return hit
        look.hit = hit = self.hits(look.keys, min(start, limit), limit)
        look.evictions, look.additions, look.limit = evictions, additions, limit
        return hit

    def _cut(self, look, n: int) -> int:
        """The first of ``look``'s ``hit`` keys among the last ``n`` evicted (``hit`` if none;
        -1 when they are not all logged, key positions are ambiguous, or a walk costs less:
        measured 0.23 us per evicted key checked, a walk 1.3 us + 2.2 ns per key, and a
        recount of the free keys as much)."""
        hit = look.hit
        if not hit:
            return 0
        placed = look.placed
        if n > self._log_size or n > 16 + len(look.keys) // 32 or placed < hit and (
                placed < 0 or not self._place(look, hit)):
            return -1
        return key_ops.cut(self._log, self._pos, look.keys, n, hit)

    def _place(self, look, upto: int) -> bool:
        """Record the block positions of ``look``'s keys up to ``upto``; False (and ``look``
        walks from the first key from then on: ``placed`` -1) when one of them was placed at
        another position. A placed position never changes. (A request's keys are distinct, as
        every method of the pool assumes: a chained key names its whole prefix.)"""
        if not key_ops.place(self._pos, look.keys, look.placed, upto):
            look.placed = -1
            return False
        look.placed = upto
        return True

    def refresh_pinned(self, look) -> int:
        """:meth:`pinned` of ``look``'s current hit (call :meth:`refresh` first), kept while no
        reference changed and none of the hit's keys was evicted."""
        state = (self.ref_changes, look.hit)
        if look.pin_state != state:
            look.pin_state = state
            look.pinned = self.pinned(look.keys, look.hit)
        return look.pinned

    def acquire(self, keys) -> None:
        """Take a reference on each cached block of ``keys`` (a hit): a free one leaves the
        queue (its entry goes stale)."""
        self.ref_changes += 1
        if not len(keys):
            return
        self.num_free -= key_ops.acquire(self._state, keys, self._stale)  # (their entries'
        # runs join the stale)

    def register(self, keys):
        """Blocks just filled with the tokens ``keys`` name become cached (reference 1);
        returns the keys registered (a content already cached stays in an anonymous block)."""
        new = key_ops.register(self._state, keys)
        if len(new):
            self.additions += 1
        return new

    def allocate(self, n: int) -> None:
        """Take ``n`` free blocks from the head of the LRU queue, evicting cached ones."""
        if n > self.num_free or n < 0:
            raise RuntimeError(f"allocating {n} KV blocks with {self.num_free} free")
        self.num_free -= n
        entries, evicted = key_ops.take(self._queue, self._state, self._stale, n)
        self._entries -= entries
        for live in evicted:  # they reached the head: evicted
            self.num_evictions += len(live)
            self._logged(live)

    def _logged(self, evicted) -> None:
        """Log keys just evicted (the last ``num_blocks`` at least are kept: an iteration's)."""
        self._log.append(evicted)
        self._log_size += len(evicted)
        if self._log_size > 2 * self.num_blocks + 64:  # drop the older half (amortised O(1))
            log = self._log
            keep, i = 0, len(log)
            while keep < self.num_blocks:
                i -= 1
                keep += len(log[i])
            del log[:i]
            self._log_size = keep

    def free(self, n: int) -> None:
        """Return ``n`` anonymous blocks to the tail of the queue."""
        if n < 0 or self.num_free + n > self.num_blocks:
            raise RuntimeError(f"freeing {n} KV blocks with {self.num_free} of "
                               f"{self.num_blocks} free")
        if not n:
            return
        queue = self._queue
        if queue and len(queue[-1]) == 1:  # a run of anonymous blocks: extend it
            queue[-1][0] += n
        else:
            queue.append([n])
        self.num_free += n

    def release(self, keys, num_anonymous: int) -> None:
        """A request frees its blocks: ``num_anonymous`` anonymous ones, then its cached
        ``keys`` in reverse order (a key whose count drops to 0 joins the queue's tail)."""
        self.ref_changes += 1
        self.free(num_anonymous)
        if len(keys):  # (the keys left with no reference: a new run of the queue)
            unused = key_ops.release(self._state, keys, self._serial + 1)
            if len(unused):
                serial = self._serial = self._serial + 1
                self._queue.append([serial, unused, 0])
                self._entries += len(unused)
                self.num_free += len(unused)
                if self._entries > 2 * self.num_blocks + 64:
                    self._compact()

    def _compact(self):
        """Drop stale entries (keys taken by hits since they were freed)."""
        state = self._state
        queue = deque()
        for item in self._queue:
            if len(item) == 3:
                serial, keys, pos = item
                keys = keys[pos:]
                item = [serial, keys[state[keys] == -serial], 0]
                if not len(item[1]):
                    continue
            queue.append(item)
        self._queue = queue
        self._stale.clear()
        self._entries = sum(len(item[1]) for item in queue if len(item) == 3)

    @property
    def num_cached(self) -> int:
        return int(np.count_nonzero(self._state))


class PrefixLookup:
    """A waiting request's lookup in a :class:`PrefixCachingBlockManager`, kept between asks
    (a blocked queue head is asked every iteration): its keys, its hit (``hit`` leading keys
    cached, capped at ``limit``) as of the pool's ``evictions`` and ``additions`` (-1: never
    computed), the free keys among the hit (``pinned``) as of ``pin_state`` (the pool's
    ``ref_changes`` and the hit; None after one of the hit's keys was evicted), and how many of
    its first keys have their positions in the pool's ``_pos`` (``placed``; -1: one of them was
    placed at another position, so evictions are never checked against this lookup)."""

    __slots__ = ("keys", "evictions", "additions", "hit", "limit", "pin_state", "pinned",
                 "placed")

    def __init__(self, keys):
        self.keys = keys
        self.evictions = self.additions = -1
        self.hit = self.limit = self.pinned = self.placed = 0
        self.pin_state = None
