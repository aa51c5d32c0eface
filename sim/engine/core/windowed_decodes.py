"""Decodes of a model with windowed or linear layers: each decode's blocks from its layer pool
(:class:`~sim.engine.kv.layer_groups.LayerPool`), not one block per ``block_size`` tokens.

:class:`~sim.engine.core.decoding.Decodes` finds the blocks all decodes need at step ``i`` in
``by_phase[i % block_size]``: every decode crosses into a new block once per ``block_size``
steps. Here a decode writing its ``c``-th token needs ``held(c) - held(c - 1)`` blocks, which
is positive where a block boundary is crossed, negative where a local layer's window leaves a
block behind (the pool gets it back in the same reservation), and 0 otherwise, at steps that
follow no single phase. Each decode registers its next change (``LayerPool.next_change``) at
the step it falls on; :meth:`blocks_needed` sums the changes registered at a step, after
registering the next change of every decode whose change came before it (lazily, as the
clock advances: O(changes), not O(decodes), per step). ``by_phase`` reads 1 at every phase so
the replica asks :meth:`blocks_needed` every step (its writes are ignored).

Invariants (tests/test_layer_pool.py): ``blocks_needed(i)`` equals the sum over DECODE
requests of ``held(c_r(i)) - held(c_r(i) - 1)``; :meth:`held_blocks` and :meth:`finish` are
``held`` of the tokens in the cache, so the pool's ``num_free + held == num_blocks`` holds.
"""

from __future__ import annotations

from heapq import heappop, heappush

from .decoding import ClippedDecodes, Decodes


class _EveryPhase:
    """``by_phase`` of windowed decodes: every step may need blocks (writes ignored)."""

    __slots__ = ()

    def __getitem__(self, phase):
        return 1

    def __setitem__(self, phase, value):
        pass


class _Windowed:
    """The windowed tracker's methods, over :class:`Decodes` or :class:`ClippedDecodes`."""

    __slots__ = ()

    def _setup(self, layers):
        self.layers = layers
        self.by_phase = _EveryPhase()
        self._at = {}  # step -> {request index: (request, blocks it takes (< 0: frees))}
        self._delta = {}  # step -> the sum of those blocks
        self._steps = []  # heap of steps with registered changes
        self._step_of = {}  # request index -> the step of its registered change

    def start(self, r, i: int) -> None:
        super().start(r, i)
        self._register(r, r.decode_base_tokens)

    def stop(self, r, last: int) -> None:
        s = self._step_of.pop(r.index, None)
        if s is not None:
            _, delta = self._at[s].pop(r.index)
            self._delta[s] -= delta
        super().stop(r, last)

    def _register(self, r, c):
        """Register ``r``'s first change after it holds ``c`` tokens, if before it finishes."""
        last = r.decode_base_tokens + r.finish_iteration - r.decode_start  # its last token's
        c2 = self.layers.next_change(c, last)
        if c2 is None:
            return
        step = r.decode_start + c2 - r.decode_base_tokens
        held = self.layers.held
        delta = held(c2) - held(c2 - 1)
        at = self._at.get(step)
        if at is None:
            at = self._at[step] = {}
            self._delta[step] = 0
            heappush(self._steps, step)
        at[r.index] = (r, delta)
        self._delta[step] += delta
        self._step_of[r.index] = step

    def blocks_needed(self, i: int) -> int:
        """Blocks all decodes take (net of those their windows free) at step ``i``."""
        steps = self._steps
        while steps and steps[0] < i:
            s = heappop(steps)
            del self._delta[s]
            for r, _ in self._at.pop(s).values():
                del self._step_of[r.index]
                self._register(r, r.decode_base_tokens + s - r.decode_start)
        return self._delta.get(i, 0)

    def held_blocks(self, r, i: int, reserved: bool) -> int:
        c = r.decode_base_tokens + i - r.decode_start
        return self.layers.held(c if reserved else c - 1)

    def finish(self, r, i: int) -> int:
        held = self.layers.held(r.decode_base_tokens + i - r.decode_start)
        self.stop(r, i)
        return held


_SLOTS = ("layers", "_at", "_delta", "_steps", "_step_of")


class WindowedDecodes(_Windowed, Decodes):
    """:class:`Decodes` of a layer pool (see the module docstring)."""

    __slots__ = _SLOTS

    def __init__(self, block_size: int, layers):
        super().__init__(block_size)
        self._setup(layers)


class WindowedClippedDecodes(_Windowed, ClippedDecodes):
    """:class:`ClippedDecodes` (SGLang's admission reservation) of a layer pool."""

    __slots__ = _SLOTS

    def __init__(self, block_size: int, clip: int, layers):
        super().__init__(block_size, clip)
        self._setup(layers)
