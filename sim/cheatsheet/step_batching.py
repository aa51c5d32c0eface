"""Step-level static vs continuous batching (no SimPy, no costs): the cheat sheet's comparison.

Requests are given as output lengths. Every step, each occupied slot emits one token; a request
of length ``n`` finishes at the end of the ``n``-th step it occupies a slot.

- static: take the next ``batch_size`` requests and run until the longest finishes;
- continuous: a slot freed at step ``t`` is refilled (FCFS) at step ``t + 1``.

``utilization`` = busy slot-steps / (batch_size x steps). Example: ``[10, 1, 1, 1]`` with batch 2
takes 11 steps static and 10 continuous.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..checks import positive_int


@dataclass(frozen=True, slots=True)
class BatchingResult:
    steps: int
    finish_steps: list  # per request, the (1-based) step that emits its last token
    start_steps: list  # per request, the (1-based) step that emits its first token
    busy_slot_steps: int
    batch_size: int

    @property
    def utilization(self) -> float:
        return self.busy_slot_steps / (self.batch_size * self.steps) if self.steps else 0.0


def _lengths(requests) -> list:
    return [positive_int(f"requests[{i}]", n) for i, n in enumerate(requests)]


def simulate_static_batching(requests, batch_size) -> BatchingResult:
    lengths = _lengths(requests)
    b = positive_int("batch_size", batch_size)
    steps, starts, finishes = 0, [], []
    for i in range(0, len(lengths), b):
        group = lengths[i:i + b]
        starts += [steps + 1] * len(group)
        finishes += [steps + n for n in group]
        steps += max(group)
    return BatchingResult(steps, finishes, starts, sum(lengths), b)


def simulate_continuous_batching(requests, batch_size) -> BatchingResult:
    lengths = _lengths(requests)
    b = positive_int("batch_size", batch_size)
    free_at = [0] * min(b, len(lengths))  # heap: step after which each slot is free
    starts, finishes = [], []
    for n in lengths:
        start = heapq.heappop(free_at) + 1
        starts.append(start)
        finishes.append(start + n - 1)
        heapq.heappush(free_at, start + n - 1)
    return BatchingResult(max(finishes, default=0), finishes, starts, sum(lengths), b)
