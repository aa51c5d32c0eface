"""The KV block pool of one replica: the single owner of KV accounting.

The pool has ``num_blocks`` blocks of ``block_size`` tokens (vLLM's paged KV cache). Every
change to the number of free blocks goes through :class:`BlockManager`; policies never touch
it (they act through the replica's verbs, which call it).

Invariants (tests/test_blocks.py, and the engine's brute-force trace test):
- ``0 <= num_free <= num_blocks``; ``num_free + blocks held by running requests == num_blocks``;
- a request holds ``ceil(tokens in its KV cache / block_size)`` blocks; it gets them when its
  tokens are scheduled (a prefill chunk, or a decode crossing into a new block) and returns
  them all when it finishes or is preempted (recompute: nothing is kept).

Without prefix caching blocks are counted, not named: the simulation needs how many are free,
not which. :class:`PrefixCachingBlockManager` adds what caching needs: a key per cached block,
reference counts, and the LRU queue of free blocks whose keys survive until reused.
"""

from __future__ import annotations

from collections import deque
from itertools import compress, filterfalse, islice, repeat, takewhile
from operator import add, eq, not_, sub

from ..checks import positive_int


def _drain(iterator) -> None:
    """Run ``iterator`` to its end at C speed (``map`` of a bound method over keys)."""
    deque(iterator, maxlen=0)


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` tokens: ``ceil(tokens / block_size)``."""
    return -(-tokens // block_size)


class BlockManager:
    """A pool of ``num_blocks`` KV blocks of ``block_size`` tokens."""

    __slots__ = ("num_blocks", "block_size", "num_free", "watermark")

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = positive_int("kv_blocks", num_blocks)
        self.block_size = positive_int("block_size", block_size)
        self.num_free = self.num_blocks
        # 1 % of the pool, rounded down (vLLM v0's and Vidur's int(0.01 * blocks)): the
        # admission watermark of the policies that keep it free (sim.engine.policies)
        self.watermark = self.num_blocks // 100

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    @property
    def capacity_tokens(self) -> int:
        """The most tokens one request can ever hold (the whole pool)."""
        return self.num_blocks * self.block_size

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    def allocate(self, n: int) -> None:
        """Take ``n`` free blocks (the caller checked :meth:`can_allocate` or made room)."""
        if n > self.num_free or n < 0:
            raise RuntimeError(f"allocating {n} KV blocks with {self.num_free} free")
        self.num_free -= n

    def free(self, n: int) -> None:
        """Return ``n`` blocks to the pool."""
        if n < 0 or self.num_free + n > self.num_blocks:
            raise RuntimeError(f"freeing {n} KV blocks with {self.num_free} of "
                               f"{self.num_blocks} free")
        self.num_free += n

    def __repr__(self):
        return (f"BlockManager({self.num_free} of {self.num_blocks} blocks free, "
                f"block_size={self.block_size})")


class PrefixCachingBlockManager(BlockManager):
    """The pool with vLLM v1's block-hash prefix caching (``prefix_caching="block"``).

    Only full blocks are cached. A block's key chains its parent's key and its tokens
    (:func:`workloads.prefix_block_keys`); ``_ref`` maps every cached key to its reference count
    (requests holding it). Free blocks form one LRU queue (head = next reused): cached blocks
    with no reference keep their key there until the head reaches them (eviction), so a later
    request - or a preempted one coming back - can still hit them; anonymous free blocks (never
    cached, or freed without a key) sit in runs of counts. A request frees its blocks tail
    first: anonymous blocks, then its keyed blocks in reverse order, so a sequence's last blocks
    are evicted before its first (vLLM's free order).

    The queue is a deque of runs: ``[count]`` anonymous blocks, or ``[serial, keys, pos]`` the
    cached blocks one release freed, in eviction order, the first ``pos`` already gone.
    ``_freed[key]`` is the serial of the run holding a free cached key's live entry, so a hit
    that takes a key out of the queue only deletes it from ``_freed`` and the entry is skipped
    when the head reaches it (O(1), where an ordered dict's deletions and resizes cost O(queue)
    - measured 9 s of a 46 s Mooncake run), and evictions and releases work on whole slices at
    C speed. A lookup is two calls, so callers can resume a walk: :meth:`hits` from a known
    prefix, :meth:`pinned` only when the admission check needs it.

    The change log ``_log`` lists, in order, every key evicted or whose reference count went
    0 -> 1 (a hit took it) or 1 -> 0 (released): the only events that shrink a cached prefix
    or change which of its blocks are free. A waiting request's :class:`PrefixLookup` is
    brought up to date from the entries since its last ask (:meth:`refresh`,
    :meth:`refresh_pinned`) instead of walking its keys again; the log is cut when it passes
    ``2 * num_blocks + 1024`` entries, and a lookup older than the cut starts over.

    Invariants (tests/test_prefix_caching.py): ``num_free`` = the live entries' blocks;
    ``num_free + distinct blocks held == num_blocks``; a key is in ``_freed`` iff its reference
    count is 0; a refreshed lookup answers what :meth:`hits` and :meth:`pinned` from the first
    key answer.
    """

    __slots__ = ("_queue", "_freed", "_ref", "_serial", "_entries", "num_evictions",
                 "ref_changes", "additions", "_log", "_log_start")

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self._queue = deque([[self.num_blocks]])
        self._freed = {}
        self._ref = {}
        self._serial = 0
        self._entries = 0  # keyed entries in the queue, stale ones included
        self.num_evictions = 0  # a cached prefix only shrinks by evictions (see Replica._hit)
        self.ref_changes = 0  # acquires and releases: which cached blocks are free changes
        self.additions = 0  # registrations: a cached prefix only grows by them
        # the change log: keys evicted, or whose reference count went 0 -> 1 or 1 -> 0, in
        # order; entry i has the global number _log_start + i (PrefixLookup reads it)
        self._log = []
        self._log_start = 0

    def hits(self, keys, start: int, limit: int) -> int:
        """How many of ``keys[:limit]`` are cached from the first on, given that the first
        ``start`` are (a C-level walk from there)."""
        return start + len(list(takewhile(self._ref.__contains__, islice(keys, start, limit))))

    def pinned(self, keys, hit: int) -> int:
        """How many of the cached ``keys[:hit]`` are free (taking them uses free blocks; the
        radix pool's method of the same name answers the same question)."""
        return list(map(self._ref.__getitem__, keys[:hit])).count(0) if hit else 0

    def refresh(self, look, limit: int) -> int:
        """``look``'s hit (:meth:`hits` of its keys from 0 up to ``limit``), brought up to date
        from what changed since it was last asked: a cached prefix loses a key only by an
        eviction (in the change log) and grows only from its end, so the hit shrinks to the
        first key of the old prefix the log names that is no longer cached, else the walk
        resumes from its end: O(log since) + O(growth) at C speed, where a walk from 0 cost
        46 us per ask on Mooncake's 600-block prompts (measured)."""
        keys = look.keys
        seen = look.seen
        end = self._log_start + len(self._log)
        if seen == end and limit == look.limit and look.additions == self.additions:
            return look.hit  # nothing changed since the last ask
        if seen < self._log_start or limit < look.limit:
            hit = self.hits(keys, 0, limit)
            look.prefix = None  # (built on the next ask: most requests are asked once)
        else:
            hit = look.hit
            changed = self._log[seen - self._log_start:]
            if changed and hit:
                gone = look.prefix_set().intersection(
                    filterfalse(self._ref.__contains__, changed))
                if gone:  # keys[:hit] are all still cached; keys[hit] is not
                    hit = min(map(look.index().__getitem__, gone))
                    look.prefix.difference_update(keys[hit:look.hit])
            if hit == look.hit:  # nothing of the prefix evicted: resume from its end
                hit = self.hits(keys, hit, limit)
                if look.prefix is not None:
                    look.prefix.update(keys[look.hit:hit])
        look.seen = end
        look.additions = self.additions
        look.hit = hit
        look.limit = limit
        return hit

    def refresh_pinned(self, look) -> int:
        """:meth:`pinned` of ``look``'s current hit (call :meth:`refresh` first), kept as the
        set of its free keys and updated from the change log (keys whose count crossed 0, or
        evicted) and the keys the hit grew or shrank by."""
        hit, keys, free = look.hit, look.keys, look.free
        ref = self._ref
        if look.pin_seen < 0:  # the first ask: a count (most requests are asked once)
            look.pin_seen = self._log_start + len(self._log)
            look.pin_hit = hit
            return self.pinned(keys, hit)
        if free is None or look.pin_seen < self._log_start:
            head = keys[:hit]
            look.free = free = set(compress(head, map(not_, map(ref.__getitem__, head))))
        else:
            if hit < look.pin_hit:
                free.difference_update(keys[hit:look.pin_hit])
            changed = self._log[look.pin_seen - self._log_start:]
            if changed:
                mine = list(look.prefix_set().intersection(changed))  # (cached: keys[:hit])
                if mine:
                    free.difference_update(mine)
                    free.update(compress(mine, map(not_, map(ref.__getitem__, mine))))
            if hit > look.pin_hit:
                grown = keys[look.pin_hit:hit]
                free.update(compress(grown, map(not_, map(ref.__getitem__, grown))))
        look.pin_seen = self._log_start + len(self._log)
        look.pin_hit = hit
        return len(free)

    def acquire(self, keys) -> None:
        """Take a reference on each cached block of ``keys`` (a hit)."""
        self.ref_changes += 1
        ref = self._ref
        counts = list(map(ref.__getitem__, keys))
        free = list(compress(keys, map(not_, counts)))  # (C-level maps: 2x the list
        if free:  # they leave the queue: their entries go stale   comprehensions, measured)
            _drain(map(self._freed.__delitem__, free))
            self.num_free -= len(free)
            self._log += free
        ref.update(zip(keys, map(add, counts, repeat(1))))

    def register(self, keys) -> list:
        """Blocks just filled with the tokens ``keys`` name become cached (reference 1);
        returns the keys registered (a content already cached stays in an anonymous block)."""
        ref = self._ref
        new = list(filterfalse(ref.__contains__, keys))
        if new:
            self.additions += 1
            ref.update(dict.fromkeys(new, 1))
        return new

    def allocate(self, n: int) -> None:
        """Take ``n`` free blocks from the head of the LRU queue, evicting cached ones."""
        if n > self.num_free or n < 0:
            raise RuntimeError(f"allocating {n} KV blocks with {self.num_free} free")
        queue, freed = self._queue, self._freed
        get = freed.get
        self.num_free -= n
        while n:
            item = queue[0]
            if len(item) == 1:  # a run of anonymous blocks
                count = item[0]
                if count > n:
                    item[0] = count - n
                    return
                queue.popleft()
                n -= count
                continue
            serial, keys, pos = item  # cached blocks: the next n entries, the stale skipped
            chunk = keys[pos:pos + n]
            item[2] = pos = pos + len(chunk)
            if pos == len(keys):
                queue.popleft()
            self._entries -= len(chunk)
            live = list(compress(chunk, map(eq, map(get, chunk), repeat(serial))))
            if live:  # they reach the head: evicted
                _drain(map(freed.__delitem__, live))
                _drain(map(self._ref.__delitem__, live))
                self._log += live
                self.num_evictions += len(live)
                n -= len(live)

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
        if keys:
            ref = self._ref
            rev = keys[::-1]
            counts = list(map(sub, map(ref.__getitem__, rev), repeat(1)))
            ref.update(zip(rev, counts))
            unused = list(compress(rev, map(not_, counts)))
            if unused:
                self._serial += 1
                self._freed.update(dict.fromkeys(unused, self._serial))
                self._queue.append([self._serial, unused, 0])
                self._entries += len(unused)
                self.num_free += len(unused)
                self._log += unused
                if self._entries > 2 * self.num_blocks + 64:
                    self._compact()
        if len(self._log) > 2 * self.num_blocks + 1024:  # older lookups start over
            self._log_start += len(self._log)
            self._log = []

    def _compact(self):
        """Drop stale entries (keys taken by hits since they were freed)."""
        get = self._freed.get
        queue = deque()
        for item in self._queue:
            if len(item) == 3:
                serial, keys, pos = item
                item = [serial, [k for k in keys[pos:] if get(k) == serial], 0]
                if not item[1]:
                    continue
            queue.append(item)
        self._queue = queue
        self._entries = sum(len(item[1]) for item in queue if len(item) == 3)

    @property
    def num_cached(self) -> int:
        return len(self._ref)


class PrefixLookup:
    """A waiting request's lookup in a :class:`PrefixCachingBlockManager`, kept between asks
    (a blocked queue head is asked every iteration): its keys, its hit (``hit`` leading keys
    cached, capped at ``limit``) and the free keys among them, each as of the pool's change-log
    position ``seen`` / ``pin_seen`` (-1: never computed). ``index()`` maps a key to its
    position, built on first need."""

    __slots__ = ("keys", "seen", "additions", "hit", "limit", "prefix", "pin_seen", "pin_hit",
                 "free", "_index")

    def __init__(self, keys):
        self.keys = keys
        self.seen = self.pin_seen = self.additions = -1
        self.hit = self.limit = self.pin_hit = 0
        self.prefix = self.free = None  # the sets of keys[:hit], and of the free ones
        self._index = None

    def prefix_set(self) -> set:
        """The set of ``keys[:hit]``."""
        if self.prefix is None:
            self.prefix = set(self.keys[:self.hit])
        return self.prefix

    def index(self) -> dict:
        if self._index is None:
            self._index = dict(zip(self.keys, range(len(self.keys))))
        return self._index
