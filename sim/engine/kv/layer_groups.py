"""The KV pool of a model whose layers are not all full attention: blocks per request counted
per layer kind, so a sliding-window or chunked-local layer holds only its window's blocks and a
linear-attention layer a fixed state (:mod:`sim.specs.layers` names the kinds).

The references: vLLM's hybrid KV cache manager (docs/design/hybrid_kv_cache_manager.md,
https://docs.vllm.ai/en/latest/design/hybrid_kv_cache_manager/, read 2026-12-02) keeps one
block table per KV cache group in one shared block pool, and its per-kind managers
(``vllm/v1/core/single_type_kv_cache_manager.py``) free what a kind no longer reads before each
step: ``SlidingWindowManager`` skips ``max(0, num_computed_tokens - sliding_window + 1)``
tokens, ``ChunkedLocalAttentionManager`` ``num_computed_tokens // attention_chunk_size *
attention_chunk_size``, whole blocks of them returned to the pool; ``MambaManager`` (the
linear-attention state) holds one state per request whatever its length. SGLang's SWA memory
pool (``python/sglang/srt/mem_cache/swa_memory_pool.py``: ``SWAKVPool``,
``SWATokenToKVPoolAllocator``) keeps a full-attention and a sliding-window pool and frees a
request's out-of-window slots as it decodes; its ``HybridLinearKVPool`` / ``MambaPool``
(``memory_pool.py``) hold one linear state per running request.

Units: a *page* is ``block_size`` tokens of ONE attention layer's KV; a pool block is
``pages_per_block`` pages (every attention layer of ``block_size`` tokens: the block the
memory budget sizes, :func:`sim.engine.pool_budget.budget_kv_blocks`). A request that has
``c`` tokens in its cache (the one it writes this step included) holds

- ``full x ceil(c / block_size)`` pages in the full-attention layers;
- ``local x (ceil(c / block_size) - skipped(c - 1) // block_size)`` pages in the local layers,
  ``skipped`` as vLLM's managers above, for ``c - 1`` computed tokens;
- ``state_pages`` for its linear-attention layers' state (``c >= 1``);

and :meth:`LayerPool.held` is those pages in whole blocks, ``ceil(pages / pages_per_block)``
(vLLM rounds each group's blocks; here the request's sum: at most one block more per request).
A model with only full layers holds ``ceil(c / block_size)`` blocks, as the plain pool.

Deviation: the blocks a prefill chunk's tokens leave behind the window are freed at the end of
that chunk (vLLM frees them before the next step: a transient of at most a chunk's blocks per
local layer is not modelled).

Invariants (tests/test_layer_pool.py): :meth:`held` is a pure function of ``c``;
:meth:`next_change` finds exactly the ``c`` where it changes; :meth:`held` never exceeds
:meth:`bound`, which is non-decreasing in ``c`` and sizes :meth:`capacity_tokens`.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field

from ...checks import positive_int


@dataclass(frozen=True, slots=True)
class LayerPool:
    """Blocks a request holds per layer kind (see the module docstring). ``window``: the
    sliding window (tokens), or ``chunk``: the local chunk, for the ``local`` layers."""

    block_size: int
    full: int  # full-attention layers
    local: int = 0  # sliding-window or chunked-local layers
    window: int = 0
    chunk: int = 0
    state_pages: int = 0  # the linear-attention layers' state of one request, in pages
    # c -> held(c), and c -> the first change after c (None: none ever)
    _held: dict = field(default_factory=dict, compare=False, repr=False)
    _next: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        positive_int("block_size", self.block_size)
        for name in ("full", "local", "window", "chunk", "state_pages"):
            positive_int(name, getattr(self, name), allow_zero=True)
        if not self.full + self.local:
            raise ValueError("a layer pool needs at least one attention layer (full or local)")
        if self.local and bool(self.window) == bool(self.chunk):
            raise ValueError(f"local layers need one of window or chunk, got window="
                             f"{self.window}, chunk={self.chunk}")

    @property
    def pages_per_block(self) -> int:
        """Pages in one pool block: one per attention layer."""
        return self.full + self.local

    def skipped_blocks(self, computed: int) -> int:
        """Blocks of a local layer behind its window once ``computed`` tokens are computed."""
        if self.window:
            return max(0, computed - self.window + 1) // self.block_size
        return computed // self.chunk * self.chunk // self.block_size

    def pages(self, c: int) -> int:
        """Pages a request with ``c`` tokens in its cache holds."""
        if c <= 0:
            return 0
        blocks = -(-c // self.block_size)
        local = blocks - self.skipped_blocks(c - 1) if self.local else 0
        return self.full * blocks + self.local * local + self.state_pages

    def held(self, c: int) -> int:
        """Pool blocks a request with ``c`` tokens in its cache holds (memoised)."""
        h = self._held.get(c)
        if h is None:
            h = self._held[c] = -(-self.pages(c) // (self.full + self.local))
        return h

    def bound(self, c: int) -> int:
        """An upper bound of :meth:`held` over ``1..c`` (non-decreasing in ``c``): a local
        layer holds at most ``(span + 2 block_size - 2) // block_size`` blocks of its
        ``span``-token window or chunk."""
        if c <= 0:
            return 0
        bs = self.block_size
        blocks = -(-c // bs)
        span = self.window or self.chunk
        local = min(blocks, (span + 2 * bs - 2) // bs) if self.local else 0
        pages = self.full * blocks + self.local * local + self.state_pages
        return -(-pages // self.pages_per_block)

    def capacity_tokens(self, num_blocks: int) -> int:
        """The most tokens one request can ever hold in ``num_blocks`` blocks (its
        :meth:`bound` fits); unbounded (``sys.maxsize``) when only local layers grow and
        their windows fit."""
        if self.bound(1) > num_blocks:
            return 0
        if not self.full:
            return sys.maxsize if self.bound(sys.maxsize // 2) <= num_blocks else 0
        lo, hi = 1, num_blocks * self.block_size * self.pages_per_block + 1
        while lo < hi:  # the largest c with bound(c) <= num_blocks
            mid = (lo + hi + 1) // 2
            if self.bound(mid) <= num_blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def next_change(self, c: int, limit: int) -> int | None:
        """The smallest ``c2`` in ``c + 1 .. limit`` where ``held(c2) != held(c2 - 1)`` (a
        decode writing its ``c2``-th token takes or frees blocks), or None. Pages change only
        where a block boundary is crossed (``c2 % block_size == 1``) or a local layer's skipped
        blocks grow; candidates are stepped block by block, the first change after ``c``
        memoised."""
        x = self._next.get(c, 0)
        if x == 0:
            x = self._next[c] = self._first_change(c)
        return x if x is not None and x <= limit else None

    def _first_change(self, c: int) -> int | None:
        """The first change after ``c``, or None when there is none: with full layers the
        held blocks grow at least every ``block_size x pages_per_block`` tokens; without,
        past the window they repeat with period ``block_size`` (sliding) or ``lcm(block_size,
        chunk)`` (chunked), so one period without a change means none ever."""
        bs = self.block_size
        end = None if self.full else max(c, self.window) + math.lcm(bs, self.chunk or bs) + 1
        prev = self.held(c)
        x = c + 1
        while end is None or x <= end:
            now = self.held(x)
            if now != prev:
                return x
            step = bs - (x - 1) % bs  # to the next block boundary of the cache
            if self.local:  # ... or of the local layers' skipped tokens
                step = min(step, self._to_skip_change(x))
            x += max(1, step)
        return None

    def _to_skip_change(self, x: int) -> int:
        """Tokens from ``x`` until ``skipped_blocks(x' - 1)`` may next grow."""
        bs = self.block_size
        if self.window:  # skipped(x' - 1) = max(0, x' - window) // bs: first 1 at window + bs
            base = x - self.window
            return bs - base if base < 0 else bs - base % bs
        # chunked: changes where (x' - 1) crosses a chunk boundary
        return self.chunk - (x - 1) % self.chunk
