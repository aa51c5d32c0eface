"""Token emission: the one module that knows how many tokens an iteration emits.

Without speculation (:class:`Decodes`) **a decoding request emits exactly one token in every
iteration** from the iteration after its prefill completed until its last token, and writes
that token's KV into its cache. With speculative decoding (:class:`SpecDecodes`) it emits
``1..k+1`` tokens per iteration, drawn in advance (:mod:`sim.engine.speculation.settings`). Both give
the replica the same few calls; neither does per-token work. Both count in *decode steps*: the
replica passes its decode clock, which equals the iteration index unless a policy paused the
decodes in prefill-only iterations (SGLang; see ``Replica.run_decodes``).

Decode progress is *lazy* (nothing is touched per token). When a request's prefill completes at
iteration ``f`` with ``c`` tokens in its KV cache and ``g`` tokens generated,
:meth:`Decodes.start` records ``decode_start = f``, ``decode_base_tokens = c``,
``decode_base_generated = g``; at iteration ``i`` it then attends over ``c + i - f`` tokens
(the new one included) and has generated ``g + (i - f)`` tokens. Its last token comes at
``finish_iteration = f + n_out - g``. It crosses into a new KV block at the iterations with
``i % block_size == block_phase``, so the blocks all decodes need at iteration ``i`` are
``by_phase[i % block_size]``; the requests emitting their last token at ``i`` are
``finish_at[i]``.

Invariants (tests/test_decoding.py):
- ``count == sum(by_phase) ==`` number of DECODE requests;
- ``context_tokens(i) == sum`` over DECODE requests of ``context_length(r, i)`` (O(1));
- each DECODE request is in ``finish_at[r.finish_iteration]`` (entries of requests preempted
  since are skipped when popped: their ``finish_iteration`` was reset to -1).

:func:`inter_token_gaps` turns each request's runs of consecutive emitting iterations
(``Request.segments``) and the iteration end times into ITL values without materialising one
value per token.
"""

from __future__ import annotations

from heapq import heappop, heappush
from itertools import chain
from operator import attrgetter

import numpy as np

from .request import DECODE


class Decodes:
    """The DECODE requests of one replica, tracked lazily (O(1) per start, stop and query)."""

    __slots__ = ("block_size", "count", "context_offset", "by_phase", "finish_at")

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.count = 0
        self.context_offset = 0  # sum(decode_base_tokens - decode_start) over DECODE requests
        self.by_phase = [0] * block_size
        self.finish_at = {}  # iteration -> [Request]

    def start(self, r, i: int) -> None:
        """``r``'s prefill completed at iteration ``i`` (that iteration emitted a token): it
        decodes from iteration ``i + 1``."""
        bs = self.block_size
        r.status = DECODE
        r.decode_base_tokens = r.num_computed
        r.decode_base_generated = r.num_generated
        r.decode_start = i
        r.block_phase = (i + (-r.num_computed) % bs + 1) % bs
        r.finish_iteration = i + r.num_output_tokens - r.num_generated
        self.by_phase[r.block_phase] += 1
        self.context_offset += r.num_computed - i
        self.count += 1
        self.finish_at.setdefault(r.finish_iteration, []).append(r)

    def stop(self, r, last: int) -> None:
        """``r`` leaves DECODE after emitting its token of iteration ``last`` (finished, or
        preempted before iteration ``last + 1``): record its run of tokens and its progress."""
        r.num_generated = r.decode_base_generated + last - r.decode_start
        record_run(r, last)
        self.by_phase[r.block_phase] -= 1
        self.context_offset -= r.decode_base_tokens - r.decode_start
        self.count -= 1
        r.finish_iteration = -1

    def blocks_needed(self, i: int) -> int:
        """New KV blocks all decodes need at iteration ``i``."""
        return self.by_phase[i % self.block_size]

    @staticmethod
    def generated(r, last: int) -> int:
        """Output tokens DECODE request ``r`` has emitted by the end of iteration ``last``."""
        return r.decode_base_generated + last - r.decode_start

    def context_tokens(self, i: int) -> int:
        """Tokens all decodes attend over at iteration ``i`` (their new tokens included)."""
        return self.context_offset + self.count * i

    @staticmethod
    def context_length(r, i: int) -> int:
        """Tokens ``r`` attends over at iteration ``i`` (its new token included)."""
        return r.decode_base_tokens + i - r.decode_start

    def held_blocks(self, r, i: int, reserved: bool) -> int:
        """Blocks ``r`` holds at the start of iteration ``i``; ``reserved``: this iteration's
        decode blocks were already taken (so ``r`` holds the one it crosses into now)."""
        held = -(-(r.decode_base_tokens + i - 1 - r.decode_start) // self.block_size)
        if reserved and r.block_phase == i % self.block_size:
            held += 1
        return held

    def finish(self, r, i: int) -> int:
        """``r`` emitted its last token at iteration ``i``: stop tracking it; returns the KV
        blocks it held (to free)."""
        held = -(-(r.decode_base_tokens + i - r.decode_start) // self.block_size)
        self.stop(r, i)
        return held


class ClippedDecodes(Decodes):
    """:class:`Decodes` that also keep ``sum over DECODE requests of min(tokens left, clip)``
    (SGLang's admission reservation, ``sim.engine.presets.sglang`` rule 3), where a scan of the running
    set every iteration cost O(running) (measured: 1.8 ms per iteration at 790 running).

    A request that started decoding at ``f`` has ``finish_iteration - last`` tokens left after
    decode step ``last``: ``clip`` while ``last < finish_iteration - clip`` (phase A), then one
    fewer each step (phase B). So the sum is ``clip x |A| + sum over B of finish_iteration -
    last x |B|``; a request moves from A to B at a known step, kept in a heap and applied when
    the sum is asked (``last`` never decreases). O(log n) per start, O(1) per stop, amortised
    O(1) per ask. Invariant (tests/test_sglang.py): :meth:`clipped_left` equals the sum over
    the DECODE requests, computed one by one."""

    __slots__ = ("clip", "_moves", "_phase", "_serial", "_num_a", "_num_b", "_fin_b")

    def __init__(self, block_size: int, clip: int):
        super().__init__(block_size)
        self.clip = clip
        self._moves = []  # (step it enters phase B, serial, request index, finish_iteration)
        self._phase = {}  # request index -> its serial while in phase A, 0 in phase B
        self._serial = 0
        self._num_a = self._num_b = self._fin_b = 0

    def start(self, r, i: int) -> None:
        super().start(r, i)
        self._serial += 1
        self._phase[r.index] = self._serial
        self._num_a += 1
        heappush(self._moves, (r.finish_iteration - self.clip, self._serial, r.index,
                               r.finish_iteration))

    def stop(self, r, last: int) -> None:
        fin = r.finish_iteration
        super().stop(r, last)
        if self._phase.pop(r.index):
            self._num_a -= 1
        else:
            self._num_b -= 1
            self._fin_b -= fin

    def clipped_left(self, last: int) -> int:
        """``sum(min(finish_iteration - last, clip))`` over the DECODE requests: their output
        tokens left after decode step ``last``, each at most ``clip``."""
        moves, phase = self._moves, self._phase
        while moves and moves[0][0] <= last:
            _, serial, index, fin = heappop(moves)
            if phase.get(index) == serial:  # (else it stopped, or started again since)
                phase[index] = 0
                self._num_a -= 1
                self._num_b += 1
                self._fin_b += fin
        return self.clip * self._num_a + self._fin_b - last * self._num_b


class SpecDecodes:
    """The DECODE requests of one replica under speculative decoding, tracked lazily.

    When ``r`` starts decoding after iteration ``f`` with ``c`` KV tokens and ``n`` tokens
    left, its emissions ``e_0..e_{m-1}`` are drawn at once: ``draw(r, n) -> (run, base, over)``
    (:class:`~sim.engine.speculation.settings.EmissionSource`), ``run[j] - base = e_0 + ... + e_{j-1}``.
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

    __slots__ = ("block_size", "k", "count", "finish_at", "draw", "ctx", "need", "mask", "clip",
                 "left", "pending")

    def __init__(self, block_size: int, k: int, draw, clip=None):
        self.block_size = block_size
        self.k = k
        self.draw = draw  # (r, tokens_left) -> (run, base, over): see the class docstring
        self.count = 0
        self.finish_at = {}
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


def record_run(r, last: int) -> None:
    """``r``'s run of emissions ends at decode step ``last``: ``(decode_start, last)``; when its
    first token came in a prefill-only iteration ``p`` (a policy paused the decodes), that
    token is a point ``(-1 - p, -1)`` in iteration units and the run starts one step later."""
    a = r.decode_start
    if r.paused_first >= 0:
        r.segments.append((-1 - r.paused_first, -1))
        r.paused_first = -1
        a += 1
    if last >= a:
        r.segments.append((a, last))


def emits_single_token(r, i: int) -> None:
    """Record a request whose prefill-completing iteration ``i`` emitted its only token."""
    r.segments.append((i, i))


def inter_token_gaps(requests, end, end_iter=None):
    """ITL data from token runs: ``((gaps, weights, extra), max_itl)``.

    ``end[j]``: end time of decode step ``j`` (of iteration ``j`` unless a policy paused the
    decodes in some iterations); ``end_iter``: end times of the iterations, for a token emitted
    in a prefill-only iteration (a run ``(-1 - p, -1)``: a point at iteration ``p``; default
    ``end``). Inside a run ``(a, b)`` a request emits once per decode step, so its gaps are
    ``end[j] - end[j-1]`` for ``j`` in ``a+1..b``: the pooled ITL distribution is each step's
    gap weighted by the number of runs covering it (``weights``), plus one ``extra`` gap between
    consecutive runs or points of a request (across a preemption, or from a point to the next
    run). ``max_itl``: each request's largest gap (NaN with fewer than two emissions).
    """
    end_iter = end if end_iter is None else end_iter
    gap = np.diff(end, prepend=end[0] if len(end) else 0.0)  # gap[j] = end[j] - end[j-1]
    n = len(requests)
    max_itl = np.full(n, np.nan)
    segs = list(map(attrgetter("segments"), requests))
    per = np.fromiter(map(len, segs), dtype=np.int64, count=n)
    total = int(per.sum())
    if not total:
        return (gap, np.zeros(len(end), dtype=np.int64), np.zeros(0)), max_itl
    flat = np.fromiter(chain.from_iterable(chain.from_iterable(segs)), dtype=np.int64,
                       count=2 * total)  # the runs' (a, b), request after request
    lo, hi = flat[0::2], flat[1::2]
    req = np.repeat(np.fromiter(map(attrgetter("index"), requests), dtype=np.int64, count=n),
                    per)
    point = lo < 0
    if point.any():  # tokens of prefill-only iterations: times from the iteration ends
        steps = end if len(end) else np.zeros(1)  # (no decode step ran at all)
        first = np.where(point, end_iter[np.where(point, -1 - lo, 0)],
                         steps[np.maximum(lo, 0)])
        last = np.where(point, first, steps[np.maximum(hi, 0)])
    else:
        first, last = end[lo], end[hi]
    inner = (hi > lo) & ~point  # runs of 2+ emissions: gaps inside the run
    li, hi_ = lo[inner], hi[inner]
    size = len(end) + 1
    cover = np.bincount(li + 1, minlength=size) - np.bincount(hi_ + 1, minlength=size)
    weights = np.cumsum(cover)[:-1]
    after = req[1:] == req[:-1]  # a run that follows another run of the same request
    extra = first[1:][after] - last[:-1][after]
    np.fmax.at(max_itl, req[1:][after], extra)
    if inner.any():  # each inner run's largest gap, gap[a+1..b]: one reduceat over bounds
        bounds = np.empty(2 * len(li), dtype=np.int64)
        bounds[0::2], bounds[1::2] = li + 1, hi_ + 1
        np.fmax.at(max_itl, req[inner], np.maximum.reduceat(np.append(gap, 0.0), bounds)[0::2])
    return (gap, weights, extra), max_itl
