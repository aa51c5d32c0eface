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
not which. :class:`~sim.engine.kv.prefix_cache.PrefixCachingBlockManager` adds what caching
needs (a key per cached block, reference counts, the LRU queue of free blocks whose keys survive
until reused); :class:`~sim.engine.kv.radix.RadixBlockManager` is SGLang's radix tree.
"""

from __future__ import annotations

from ...checks import positive_int



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
        # admission watermark of the policies that keep it free (sim.engine.core.policies)
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
