"""The decodes of one replica under speculative decoding (:class:`SpecDecodes`), tracked lazily.

The speculative counterpart of :class:`~sim.engine.core.decoding.Decodes` (its subclass, every
method overridden: the replica's C calls reach it): the same few calls for the replica, no
per-token work; a request emits ``1..k+1`` tokens per iteration, drawn in advance when it
starts decoding (``draw(r, n)``: :mod:`sim.engine.speculation.acceptance`).
The core knows speculation only as this tracker, ``k`` lookahead slots and the draw callable it
is given (:func:`sim.engine.fleet.cluster.new_replica` builds them). Layout and invariants: the
class docstring (tests/test_speculation.py, tests/test_decoding.py).
"""

from __future__ import annotations

try:
    import cython
except ImportError:  # interpreted without Cython: its no-op names (sim/cython_shim.py)
    from sim import cython_shim as cython

import numpy as np

from .decoding import Decodes, record_run
from .request import DECODE


class SpecDecodes(Decodes):
    """The DECODE requests of one replica under speculative decoding, tracked lazily.

    When ``r`` starts decoding after iteration ``f`` with ``c`` KV tokens and ``n`` tokens
    left, its emissions ``e_0..e_{m-1}`` are drawn at once: ``draw(r, n) -> (run, base, over)``
    (:class:`~sim.engine.speculation.acceptance.EmissionSource`), ``run[j] - base = e_0 + ... +
    e_{j-1}``.
    Its ``j``-th verification (iteration ``f + 1 + j``) writes ``slots_j = c + k + 1 + run[j] -
    base`` KV slots (the ``k`` lookahead slots included) and holds ``ceil(slots_j /
    block_size)`` blocks (``ceil(c / block_size)`` before the first): the rejected slots are
    overwritten next iteration and their blocks stay with the request, as vLLM's
    ``allocate_slots`` keeps them. ``r.spec_plan = (run, base, off, over)`` with ``off = c + k
    + 1 - base``: a request's context, blocks held and tokens emitted at any step are read
    from it in O(1).

    The decodes' per-iteration totals live in two ring buffers indexed by iteration (context
    slots, new blocks), so each iteration reads them in O(1); the replica reads and clears the
    entries of its current decode step inline (hot). A request's vectors are added when it
    starts (taken back from its stop iteration on at a preemption), batched: :meth:`start`
    queues it and :meth:`flush` adds the vectors of all the requests queued since in one pass
    (one set of NumPy calls per iteration, not per request; the sums are integers, so the
    rings hold the same values in whatever order they are added). The replica flushes right
    after the starts (the prefills its iteration completed, a received KV transfer): no ring is
    read while a request is queued. Invariants (tests/test_speculation.py):
    ``context_tokens(i)`` and ``blocks_needed(i)`` equal the sums over DECODE requests; a
    request finishes at ``f + m`` having emitted exactly its tokens.
    """

    __slots__ = ("k", "draw", "ctx", "need", "mask", "clip", "left", "pending")

    def __init__(self, block_size: int, k: int, draw, clip=None):
        Decodes.__init__(self, block_size)  # (a Decodes: the replica's typed calls reach it)
        self.k = k
        self.draw = draw  # (r, tokens_left) -> (run, base, over): see the class docstring
        self.ctx = np.zeros(1024, dtype=np.int64)  # iteration & mask -> context slots
        self.need = np.zeros(1024, dtype=np.int64)  # iteration & mask -> new blocks
        self.mask = 1023
        # clip (a policy's clip_left, SGLang's): step & mask -> the decodes' output tokens left
        # after that step, each at most clip (ClippedDecodes' sum, from a third ring: a
        # request's vector is known when it starts); its entry for step s is read while the
        # decode clock is s + 1 and cleared by the replica when the clock passes s + 2
        self.clip = clip
        self.left = np.zeros(1024, dtype=np.int64) if clip else None
        self.pending = []  # started since the last flush: their vectors not in the rings yet

    def _ring_add(self, ring, lo: int, values) -> None:
        """Add ``values`` into ``ring`` at steps ``lo, lo + 1, ...``."""
        start = lo & self.mask
        end = start + len(values)
        if end <= self.mask + 1:
            ring[start:end] += values
        else:
            first = self.mask + 1 - start
            ring[start:] += values[:first]
            ring[:end - self.mask - 1] += values[first:]

    def clipped_left(self, last: int) -> int:
        """The decodes' output tokens left after step ``last``, each at most ``clip``
        (:meth:`ClippedDecodes.clipped_left`'s sum, from the ring)."""
        return int(self.left[last & self.mask])

    def _grow(self, now: int, span: int) -> None:
        size = self.mask + 1
        new = 1 << (span + 1).bit_length()
        live = np.arange(now, now + size)
        for name in ("ctx", "need", "left") if self.clip else ("ctx", "need"):
            old, ring = getattr(self, name), np.zeros(new, dtype=np.int64)
            ring[live & (new - 1)] = old[live & self.mask]
            setattr(self, name, ring)
        self.mask = new - 1

    def start(self, r, i: int) -> None:
        """``r``'s prefill completed at iteration ``i``: draw its emissions and queue it (its
        vectors reach the rings at the next :meth:`flush`)."""
        c, g = r.num_computed, r.num_generated
        run, base, over = self.draw(r, r.num_output_tokens - g)
        m = len(run) - 1
        r.status = DECODE
        r.decode_base_tokens = c
        r.decode_base_generated = g
        r.decode_start = i
        r.spec_plan = (run, base, c + self.k + 1 - base, over)
        r.finish_iteration = i + m
        self.count += 1
        self.pending.append(r)
        self.finish_at.setdefault(i + m, []).append(r)

    def flush(self) -> None:
        """Add the vectors of the requests started since the last flush into the rings: one
        request as :meth:`_add_plan` does, several at once over their concatenated runs
        (``np.add.at`` sums the entries that land on the same step; the same integers)."""
        reqs = self.pending
        for r in reqs:
            if len(r.spec_plan[0]) > self.mask:  # m + 1 steps must fit: grow the rings
                self._grow(r.decode_start, len(r.spec_plan[0]))
        if cython.compiled:  # (a C loop per request: the same integer sums, in any order)
            self.pending = []
            for r in reqs:
                self._add_plan(r, 0, 1)
            return
        if len(reqs) < 2:  # (one start an iteration, the common case below saturation)
            if reqs:
                self._add_plan(reqs.pop(), 0, 1)
            return
        self.pending = []
        bs, mask = self.block_size, self.mask
        plans = [r.spec_plan for r in reqs]
        runs = [plan[0][:-1] for plan in plans]
        ms = np.array([len(run) for run in runs])
        ends = ms.cumsum()
        sums = np.concatenate(runs)
        slots = sums + np.array([plan[2] for plan in plans]).repeat(ms)  # (np.repeat of a
        # list: 2.4x the time, measured)
        held = slots + (bs - 1)
        held //= bs  # blocks held after each verification ...
        before = np.empty_like(held)  # ... and before it
        before[1:] = held[:-1]
        ends -= ms  # where each request's verifications begin
        before[ends] = [-(-r.decode_base_tokens // bs) for r in reqs]
        held -= before
        at = (np.array([r.decode_start + 1 for r in reqs]) - ends).repeat(ms)
        at += np.arange(len(at))
        at &= mask
        np.add.at(self.ctx, at, slots)
        np.add.at(self.need, at, held)
        if self.clip:  # tokens left after steps decode_start + j, each at most clip
            left = np.array([r.num_output_tokens - r.decode_base_generated + plan[1]
                             for r, plan in zip(reqs, plans)]).repeat(ms) - sums
            at -= 1
            at &= mask
            np.add.at(self.left, at, np.minimum(left, self.clip, out=left))

    def _add_plan(self, r, steps: int, sign: int) -> None:
        """Add ``sign`` x ``r``'s vectors from its verification ``steps`` on into the rings
        (``sign`` -1: a preemption takes its future iterations back)."""
        run, base, off, _ = r.spec_plan
        bs, mask = self.block_size, self.mask
        if cython.compiled:  # (the vectors below, element by element: no arrays made)
            rv, ctx, need = run, self.ctx, self.need
            lo = r.decode_start + steps
            prev = self._held(r, steps)
            for j in range(steps, rv.shape[0] - 1):
                x = rv[j] + off  # slots after verification j, and the blocks they hold
                h = (x + bs - 1) // bs
                at = (lo + 1 + j - steps) & mask
                ctx[at] += sign * x
                need[at] += sign * (h - prev)
                prev = h
            if self.clip:
                left, clip = self.left, self.clip
                rem = r.num_output_tokens - r.decode_base_generated + base
                for j in range(steps, rv.shape[0] - 1):
                    x = rem - rv[j]
                    left[(lo + j - steps) & mask] += sign * (x if x < clip else clip)
            return
        slots = run[steps:-1] + off
        held = slots + (bs - 1)
        held //= bs  # blocks held after each verification ...
        need = held.copy()
        need[1:] -= held[:-1]  # ... less those held before it
        need[0] -= self._held(r, steps)
        if sign < 0:
            np.negative(slots, out=slots)
            np.negative(need, out=need)
        lo = r.decode_start + steps
        start = (lo + 1) & mask
        end = start + len(slots)
        if end <= mask + 1:  # (no wrap-around: both rings inline, one bounds check)
            self.ctx[start:end] += slots
            self.need[start:end] += need
        else:
            self._ring_add(self.ctx, lo + 1, slots)
            self._ring_add(self.need, lo + 1, need)
        if self.clip:  # (and its tokens left from step lo on, each at most clip)
            left = np.minimum(r.num_output_tokens - r.decode_base_generated + base
                              - run[steps:-1], self.clip)
            self._ring_add(self.left, lo, left if sign > 0 else np.negative(left, out=left))

    def stop(self, r, last: int) -> None:
        run, base, _, over = r.spec_plan
        steps = last - r.decode_start  # verifications done
        if steps == len(run) - 1:  # finished: its last verification's drafts beyond the end
            emitted = r.num_output_tokens - r.decode_base_generated
            r.spec_overshoot += over
        else:  # preempted: take back its future iterations
            emitted = run.item(steps) - base
            self._add_plan(r, steps, -1)
        r.num_generated = r.decode_base_generated + emitted
        record_run(r, last)
        r.spec_steps += steps
        r.spec_accepted += emitted - steps
        self.count -= 1
        r.finish_iteration = -1
        r.spec_plan = None

    def blocks_needed(self, i: int) -> int:
        return int(self.need[i & self.mask])

    def context_tokens(self, i: int) -> int:
        return int(self.ctx[i & self.mask])

    @staticmethod
    def context_length(r, i: int) -> int:
        run, _, off, _ = r.spec_plan
        return run.item(i - 1 - r.decode_start) + off

    @staticmethod
    def generated(r, last: int) -> int:
        run, base, _, _ = r.spec_plan
        g = r.decode_base_generated
        return g + min(run.item(last - r.decode_start) - base, r.num_output_tokens - g)

    def _held(self, r, j: int) -> int:
        """Blocks ``r`` holds before its verification ``j``."""
        if not j:
            return -(-r.decode_base_tokens // self.block_size)
        run, _, off, _ = r.spec_plan
        return -(-(run.item(j - 1) + off) // self.block_size)

    def held_blocks(self, r, i: int, reserved: bool) -> int:
        return self._held(r, i - r.decode_start - (0 if reserved else 1))

    def finish(self, r, i: int) -> int:
        run, _, off, _ = r.spec_plan  # (_held(r, m), inlined: one call per request)
        held = -(-(run.item(-2) + off) // self.block_size)
        self.stop(r, i)
        return held
