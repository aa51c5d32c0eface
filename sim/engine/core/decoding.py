"""Token emission: the one module that knows how many tokens an iteration emits.

Without speculation (:class:`Decodes`) **a decoding request emits exactly one token in every
iteration** from the iteration after its prefill completed until its last token, and writes
that token's KV into its cache. With speculative decoding (:class:`SpecDecodes`) it emits
``1..k+1`` tokens per iteration, drawn in advance (:mod:`sim.engine.speculation.acceptance`;
the tracker lives in :mod:`sim.engine.core.spec_decoding`). Both give the replica the same few
calls; neither does per-token work. Both count in *decode steps*: the replica passes its
decode clock, which equals the iteration index unless a policy paused the decodes in
prefill-only iterations (SGLang; see ``Replica.run_decodes``).

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
    (SGLang's admission reservation, ``sim.engine.presets.sglang`` rule 3), where a scan of the
    running set every iteration cost O(running) (measured: 1.8 ms per iteration at 790
    running).

    A request that started decoding at ``f`` has ``finish_iteration - last`` tokens left after
    decode step ``last``: ``clip`` while ``last < finish_iteration - clip`` (phase A), then one
    fewer each step (phase B). So the sum is ``clip x |A| + sum over B of finish_iteration -
    last x |B|``; a request moves from A to B at a known step, kept in a heap and applied when
    the sum is asked (``last`` never decreases). O(log n) per start, O(1) per stop, amortised
    O(1) per ask. Invariant (tests/test_sglang.py): :meth:`clipped_left` equals the sum over
    the DECODE requests, computed one by one."""

    __slots__ = ("clip", "_moves", "_phase", "_serial", "_num_a", "_num_b", "_fin_b")

    def __init__(self, block_size: int, clip: int):
        Decodes.__init__(self, block_size)  # (super() is not there in a compiled class)
        self.clip = clip
        self._moves = []  # (step it enters phase B, serial, request index, finish_iteration)
        self._phase = {}  # request index -> its serial while in phase A, 0 in phase B
        self._serial = 0
        self._num_a = self._num_b = self._fin_b = 0

    def start(self, r, i: int) -> None:
        Decodes.start(self, r, i)
        self._serial += 1
        self._phase[r.index] = self._serial
        self._num_a += 1
        heappush(self._moves, (r.finish_iteration - self.clip, self._serial, r.index,
                               r.finish_iteration))

    def stop(self, r, last: int) -> None:
        fin = r.finish_iteration
        Decodes.stop(self, r, last)
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


def inter_token_gaps(requests, end, end_iter=None, runs=None):
    """ITL data from token runs: ``((gaps, weights, extra), max_itl)``.

    ``end[j]``: end time of decode step ``j`` (of iteration ``j`` unless a policy paused the
    decodes in some iterations); ``end_iter``: end times of the iterations, for a token emitted
    in a prefill-only iteration (a run ``(-1 - p, -1)``: a point at iteration ``p``; default
    ``end``). Inside a run ``(a, b)`` a request emits once per decode step, so its gaps are
    ``end[j] - end[j-1]`` for ``j`` in ``a+1..b``: the pooled ITL distribution is each step's
    gap weighted by the number of runs covering it (``weights``), plus one ``extra`` gap between
    consecutive runs or points of a request (across a preemption, or from a point to the next
    run). ``max_itl``: each request's largest gap (NaN with fewer than two emissions).
    ``runs``: the requests' runs flattened, as :func:`~sim.engine.core.columns.request_columns`
    gives them (None: read from ``requests`` here).
    """
    end_iter = end if end_iter is None else end_iter
    gap = np.diff(end, prepend=end[0] if len(end) else 0.0)  # gap[j] = end[j] - end[j-1]
    n = len(requests)
    max_itl = np.full(n, np.nan)
    if runs is None:  # (given: request_columns' "runs", read in its pass over the requests)
        segs = list(map(attrgetter("segments"), requests))
        per = np.fromiter(map(len, segs), dtype=np.int64, count=n)
        total = int(per.sum())
        flat = np.fromiter(chain.from_iterable(chain.from_iterable(segs)), dtype=np.int64,
                           count=2 * total)  # the runs' (a, b), request after request
        index = np.fromiter(map(attrgetter("index"), requests), dtype=np.int64, count=n)
    else:
        per, flat, index = runs
        runs = None  # (the caller's copy is its own: freed when it lets go)
    if not len(flat):
        return (gap, np.zeros(len(end), dtype=np.int64), np.zeros(0)), max_itl
    lo, hi = flat[0::2], flat[1::2]
    req = np.repeat(index, per)
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
    del cover  # (at 2.4M steps each such array is 20 MB: freed as soon as read)
    after = req[1:] == req[:-1]  # a run that follows another run of the same request
    extra = first[1:][after] - last[:-1][after]
    np.fmax.at(max_itl, req[1:][after], extra)
    if inner.any():  # each inner run's largest gap, gap[a+1..b]: one reduceat over bounds
        owner = req[inner]
        # (reduceat also reduces between one run's end and the next run's start: a cluster's
        # requests alternate between replicas whose steps lie far apart in ``end``, so those
        # spans summed to O(runs x steps), 0.6 s of a 4-replica 100k run; runs by start
        # bound them by the steps. Either order gives the same maxima)
        if int(np.maximum(li[1:] - hi_[:-1], 0).sum()) > 2 * size:
            order = np.argsort(li, kind="stable")
            li, hi_, owner = li[order], hi_[order], owner[order]
        bounds = np.empty(2 * len(li), dtype=np.int64)
        bounds[0::2], bounds[1::2] = li + 1, hi_ + 1
        np.fmax.at(max_itl, owner, np.maximum.reduceat(np.append(gap, 0.0), bounds)[0::2])
    return (gap, weights, extra), max_itl
