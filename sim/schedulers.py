"""Batching policies: one small class each, passed to the engine (or named on the CLI).

A policy forms one iteration's batch from a :class:`~sim.replica.ReplicaState`:
``schedule(state, now) -> Batch``. Every policy first gives running decodes the KV blocks they
need (preempting the most recently admitted requests when the pool is empty), then admits
waiting requests in FCFS order while a slot (``max_batch_size``) and KV blocks allow.

- :class:`StaticBatching` - admits only when nothing runs: up to ``max_batch_size`` requests,
  prefilled together, decoded until the longest finishes; arrivals meanwhile wait.
- :class:`ContinuousBatching` (Orca) - every iteration, running requests decode one token and
  new prompts are admitted and prefilled whole beside them (optional ``token_budget``: a prompt
  over the budget is still admitted when it is the first of its iteration).
- :class:`ChunkedPrefill` (Sarathi-Serve) - a per-iteration token budget (``chunk_size``) filled
  with all running decodes, then continuing partial prefills, then new prompts, in chunks.
"""

from __future__ import annotations

from .constants import CHUNK_SIZE
from .replica import Batch
from .request import PREFILL
from ._validate import positive_int


def _try_admit(state, now, tokens, prefills, requests) -> bool:
    """Admit the head of the queue to prefill its first ``tokens`` prompt tokens in this
    iteration, if the KV blocks for them are free (admission never preempts)."""
    blocks = -(-tokens // state.block_size)
    if blocks > state.free_blocks:
        return False
    r = state.waiting[0]
    state.free_blocks -= blocks
    state.admit(r, now)
    prefills.append((tokens, 0))
    requests.append(r)
    return True


def _admit_whole_prompts(state, now, prefills, requests, tokens, budget=None):
    """Admit waiting requests FCFS with their whole (re-)prompt while slots, blocks, budget allow."""
    waiting, running = state.waiting, state.running
    while waiting and len(running) < state.max_batch_size:
        need = waiting[0].prefill_target
        if budget is not None and prefills and tokens + need > budget:
            break
        if not _try_admit(state, now, need, prefills, requests):
            break
        tokens += need
    return tokens


class StaticBatching:
    name = "static"

    def schedule(self, state, now) -> Batch:
        prefills, requests, tokens = [], [], 0
        if state.running:
            state.prepare_decodes()
        else:
            tokens = _admit_whole_prompts(state, now, prefills, requests, 0)
        return Batch(state, prefills, requests, tokens)

    def __repr__(self):
        return "StaticBatching()"


class ContinuousBatching:
    name = "continuous"

    def __init__(self, token_budget=None):
        self.token_budget = None if token_budget is None else positive_int("token_budget",
                                                                           token_budget)

    def schedule(self, state, now) -> Batch:
        state.prepare_decodes()
        prefills, requests = [], []
        tokens = _admit_whole_prompts(state, now, prefills, requests, 0, self.token_budget)
        return Batch(state, prefills, requests, tokens)

    def __repr__(self):
        return f"ContinuousBatching(token_budget={self.token_budget})"


class ChunkedPrefill:
    name = "chunked"

    def __init__(self, chunk_size=CHUNK_SIZE):
        self.chunk_size = positive_int("chunk_size", chunk_size)

    def schedule(self, state, now) -> Batch:
        state.prepare_decodes()
        budget = self.chunk_size - state.num_decoding
        prefills, requests, tokens = [], [], 0
        bs = state.block_size
        for r in list(state.prefilling):  # continue partial prefills, oldest first
            if budget <= 0:
                break
            if r.status != PREFILL:  # preempted by an older request's block need
                continue
            chunk = min(r.prefill_target - r.num_computed, budget)
            blocks = -(-(r.num_computed + chunk) // bs) - (-(-r.num_computed // bs))
            if not state.ensure_blocks(r, blocks):
                continue
            prefills.append((chunk, r.num_computed))
            requests.append(r)
            tokens += chunk
            budget -= chunk
        waiting, running = state.waiting, state.running
        while budget > 0 and waiting and len(running) < state.max_batch_size:
            chunk = min(waiting[0].prefill_target, budget)
            if not _try_admit(state, now, chunk, prefills, requests):
                break
            tokens += chunk
            budget -= chunk
        return Batch(state, prefills, requests, tokens)

    def __repr__(self):
        return f"ChunkedPrefill(chunk_size={self.chunk_size})"


SCHEDULERS = {"static": StaticBatching, "continuous": ContinuousBatching,
              "chunked": ChunkedPrefill}


def make_scheduler(scheduler, *, chunk_size=CHUNK_SIZE, token_budget=None):
    """A policy object from a name ("static", "continuous", "chunked") or the object itself."""
    if isinstance(scheduler, str):
        key = scheduler.strip().lower()
        if key == "static":
            return StaticBatching()
        if key == "continuous":
            return ContinuousBatching(token_budget)
        if key == "chunked":
            return ChunkedPrefill(chunk_size)
        raise ValueError(f"scheduler must be one of {sorted(SCHEDULERS)} or a policy object, "
                         f"got {scheduler!r}")
    if not callable(getattr(scheduler, "schedule", None)):
        raise TypeError(f"scheduler must have a schedule(state, now) method, got {scheduler!r}")
    return scheduler
