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

from collections import OrderedDict
from itertools import islice, takewhile

from ..checks import positive_int


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
    (requests holding it). Free blocks form one LRU queue, ``_queue`` (head = next reused):
    cached blocks with no reference keep their key there until the head reaches them
    (eviction), so a later request - or a preempted one coming back - can still hit them;
    anonymous free blocks (never cached, or freed without a key) sit in runs of counts.
    A request frees its blocks tail first: anonymous blocks, then its keyed blocks in reverse
    order, so a sequence's last blocks are evicted before its first (vLLM's free order).

    Invariants (tests/test_prefix_caching.py): ``num_free == sum of the queue's blocks``;
    ``num_free + distinct blocks held == num_blocks``; a key is in ``_queue`` iff its reference
    count is 0.
    """

    __slots__ = ("_queue", "_ref", "_serial", "num_evictions", "version")

    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size)
        self._queue = OrderedDict({("free", 0): self.num_blocks})
        self._ref = {}
        self._serial = 1
        self.num_evictions = 0
        self.version = 0  # bumped by every change: a lookup stays valid while it is unchanged

    def lookup(self, keys, limit) -> tuple:
        """``(hit, free_hits)``: how many of ``keys[:limit]`` are cached, from the first on,
        and how many of those are free (taking them uses up free blocks)."""
        ref = self._ref
        hits = list(takewhile(ref.__contains__, islice(keys, limit)))  # C-level walk
        if not hits:
            return 0, 0
        return len(hits), list(map(ref.__getitem__, hits)).count(0)

    def acquire(self, keys) -> None:
        """Take a reference on each cached block of ``keys`` (a hit)."""
        self.version += 1
        ref, queue = self._ref, self._queue
        for k in keys:
            count = ref[k]
            if count == 0:
                del queue[k]
                self.num_free -= 1
            ref[k] = count + 1

    def register(self, keys) -> list:
        """Blocks just filled with the tokens ``keys`` name become cached (reference 1);
        returns the keys registered (a content already cached stays in an anonymous block)."""
        self.version += 1
        ref = self._ref
        new = [k for k in keys if k not in ref]
        ref.update(dict.fromkeys(new, 1))
        return new

    def allocate(self, n: int) -> None:
        """Take ``n`` free blocks from the head of the LRU queue, evicting cached ones."""
        self.version += 1
        if n > self.num_free or n < 0:
            raise RuntimeError(f"allocating {n} KV blocks with {self.num_free} free")
        queue, ref = self._queue, self._ref
        self.num_free -= n
        while n:
            key, count = queue.popitem(last=False)
            if count is None:  # a cached block reaches the head: evict its key
                del ref[key]
                self.num_evictions += 1
                n -= 1
            elif count > n:
                queue[key] = count - n
                queue.move_to_end(key, last=False)
                n = 0
            else:
                n -= count

    def free(self, n: int) -> None:
        """Return ``n`` anonymous blocks to the tail of the queue."""
        if n < 0 or self.num_free + n > self.num_blocks:
            raise RuntimeError(f"freeing {n} KV blocks with {self.num_free} of "
                               f"{self.num_blocks} free")
        if not n:
            return
        queue = self._queue
        tail = next(reversed(queue), None)
        if tail is not None and queue[tail] is not None:  # a run of anonymous blocks: extend
            queue[tail] += n
        else:
            queue[("free", self._serial)] = n
            self._serial += 1
        self.num_free += n

    def release(self, keys, num_anonymous: int) -> None:
        """A request frees its blocks: ``num_anonymous`` anonymous ones, then its cached
        ``keys`` in reverse order (a key whose count drops to 0 joins the queue's tail)."""
        self.version += 1
        self.free(num_anonymous)
        if keys:
            ref = self._ref
            rev = keys[::-1]
            counts = [ref[k] - 1 for k in rev]
            ref.update(zip(rev, counts))
            unused = [k for k, c in zip(rev, counts) if not c]
            self._queue.update(dict.fromkeys(unused))
            self.num_free += len(unused)

    @property
    def num_cached(self) -> int:
        return len(self._ref)
