"""The state of one serving replica: queue, running set, paged KV pool, and the iteration step.

Invariants (checked by the tests):
- ``free_blocks + blocks held by running requests == kv_blocks``; never below 0;
- every running request is in ``running`` (admission order, oldest first) and is PREFILL or
  DECODE; ``prefilling`` holds the PREFILL ones in admission order;
- a DECODE request emits one token in every iteration until ``finish_iter``; it needs a new KV
  block at the iterations ``i`` with ``i % block_size == phase``, so the blocks that decodes need
  at iteration ``i`` are ``count_by_phase[i % block_size]``: O(1), not O(running).

Per-iteration work is O(admitted + finished + preempted), never O(running) (see STYLE.md).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .request import DECODE, FINISHED, PREFILL, REJECTED, WAITING


class Batch:
    """What one engine iteration computes; the only argument of a cost model.

    ``prefills``: ``(num_new_tokens, num_cached_tokens)`` per request running (part of) its
    prefill; ``num_decode_tokens``: requests decoding one token each, which attend over
    ``decode_context_tokens`` tokens in all. :meth:`items` gives ``(tokens, context_length)``
    per request (context = tokens attended over, including the new ones).
    """

    __slots__ = ("iteration", "prefills", "prefill_requests", "num_prefill_tokens",
                 "num_decode_tokens", "decode_context_tokens", "_state")

    def __init__(self, state, prefills, prefill_requests, num_prefill_tokens):
        self.iteration = state.iteration
        self.prefills = prefills
        self.prefill_requests = prefill_requests
        self.num_prefill_tokens = num_prefill_tokens
        self.num_decode_tokens = state.num_decoding
        self.decode_context_tokens = state.context_offset + state.num_decoding * state.iteration
        self._state = state

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens

    @property
    def num_requests(self) -> int:
        return len(self.prefills) + self.num_decode_tokens

    @property
    def prefill_context_tokens(self) -> int:
        return sum(new + cached for new, cached in self.prefills)

    @property
    def context_tokens(self) -> int:
        return self.decode_context_tokens + self.prefill_context_tokens

    def decode_context_lengths(self) -> np.ndarray:
        """Context length of each decoding request (computed on demand: O(running))."""
        i = self.iteration
        return np.array([r.num_cached + i - r.decode_start for r in self.decode_requests()],
                        dtype=np.int64)

    def decode_requests(self) -> list:
        """The requests decoding this iteration (on demand: O(running))."""
        return [r for r in self._state.running.values() if r.status == DECODE]

    def items(self) -> list:
        out = [(new, new + cached) for new, cached in self.prefills]
        out += [(1, int(c)) for c in self.decode_context_lengths()]
        return out

    def __repr__(self):
        return (f"Batch(iteration={self.iteration}, prefill_tokens={self.num_prefill_tokens} in "
                f"{len(self.prefills)}, decodes={self.num_decode_tokens})")


class ReplicaState:
    def __init__(self, kv_blocks, block_size, max_batch_size):
        self.kv_blocks = kv_blocks
        self.block_size = block_size
        self.max_batch_size = max_batch_size
        self.free_blocks = kv_blocks
        self.waiting = deque()
        self.running = {}  # index -> Request, admission order
        self.prefilling = []  # PREFILL requests in admission order
        self.num_decoding = 0
        self.context_offset = 0  # sum(num_cached - decode_start) over DECODE requests
        self.count_by_phase = [0] * block_size
        self.finish_at = {}  # iteration -> [Request]
        self.iteration = 0
        self.num_preempted_now = 0  # preemptions while forming the current batch
        self.decodes_prepared = -1  # iteration whose decode blocks are already taken
        self.finished = []
        self.on_finish = None  # optional callback(request, now), e.g. closed-loop clients

    # -- helpers the policies use ---------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def held_blocks(self, r) -> int:
        """Blocks ``r`` holds at the start of the current iteration."""
        if r.status == DECODE:
            i = self.iteration
            held = -(-(r.num_cached + i - 1 - r.decode_start) // self.block_size)
            if self.decodes_prepared == i and r.phase == i % self.block_size:
                held += 1  # its block for this iteration was already taken
            return held
        return -(-r.num_computed // self.block_size)

    def prepare_decodes(self):
        """Give this iteration's decodes the blocks they cross into, preempting if none are free."""
        need = self.count_by_phase[self.iteration % self.block_size]
        while need > self.free_blocks:
            victim = self._last_running()
            if victim.status == DECODE and victim.phase == self.iteration % self.block_size:
                need -= 1
            self.preempt(victim)
        self.free_blocks -= need
        self.decodes_prepared = self.iteration

    def ensure_blocks(self, r, blocks) -> bool:
        """Take ``blocks`` for running request ``r``, preempting the most recently admitted
        requests when needed; False when ``r`` itself had to be preempted."""
        while blocks > self.free_blocks:
            victim = self._last_running()
            self.preempt(victim)
            if victim is r:
                return False
        self.free_blocks -= blocks
        return True

    def _last_running(self):
        return self.running[next(reversed(self.running))]

    def admit(self, r, now):
        """Move the head of the queue into the running set (PREFILL)."""
        self.waiting.popleft()
        r.status = PREFILL
        if r.first_scheduled_time is None:
            r.first_scheduled_time = now
        self.running[r.index] = r
        self.prefilling.append(r)

    def preempt(self, r):
        """Recompute preemption: free all of ``r``'s blocks, back to the head of the queue."""
        self.free_blocks += self.held_blocks(r)
        if r.status == DECODE:
            last = self.iteration - 1
            r.num_generated = r.gen_base + last - r.decode_start
            r.segments.append((r.decode_start, last))
            self._stop_decoding(r)
        else:
            self.prefilling.remove(r)
        del self.running[r.index]
        r.status = WAITING
        r.num_computed = 0
        r.prefill_target = r.num_prompt_tokens + r.num_generated
        r.num_preemptions += 1
        self.num_preempted_now += 1
        self.waiting.appendleft(r)

    def _stop_decoding(self, r):
        self.count_by_phase[r.phase] -= 1
        self.context_offset -= r.num_cached - r.decode_start
        self.num_decoding -= 1
        r.finish_iter = -1

    def reject(self, r, reason):
        r.status = REJECTED
        r.reason = reason
        r.finish_time = None
        self.finished.append(r)

    # -- the iteration's effects ----------------------------------------------------------
    def postprocess(self, batch, now):
        i = self.iteration
        bs = self.block_size
        completed = False
        for (new, _cached), r in zip(batch.prefills, batch.prefill_requests):
            if r.status != PREFILL:  # cannot happen: a batch member is never preempted after it
                continue             # joined (victims are always admitted later than it)
            r.num_computed += new
            if r.num_computed < r.prefill_target:
                continue
            completed = True
            r.num_generated += 1  # the prefill's iteration emits a token
            if r.first_token_time is None:
                r.first_token_time = now
            if r.num_generated >= r.num_output_tokens:
                r.segments.append((i, i))
                self.free_blocks += -(-r.num_computed // bs)
                del self.running[r.index]
                self._finish(r, now)
                continue
            r.status = DECODE
            r.num_cached = r.num_computed
            r.gen_base = r.num_generated
            r.decode_start = i
            r.phase = (i + (-r.num_cached) % bs + 1) % bs
            r.finish_iter = i + r.num_output_tokens - r.num_generated
            self.count_by_phase[r.phase] += 1
            self.context_offset += r.num_cached - i
            self.num_decoding += 1
            self.finish_at.setdefault(r.finish_iter, []).append(r)
        if completed:
            self.prefilling = [r for r in self.prefilling if r.status == PREFILL]
        done = self.finish_at.pop(i, None)
        if done:
            for r in done:
                if r.status == DECODE and r.finish_iter == i:
                    self.free_blocks += -(-(r.num_cached + i - r.decode_start) // bs)
                    r.num_generated = r.num_output_tokens
                    r.segments.append((r.decode_start, i))
                    self._stop_decoding(r)
                    del self.running[r.index]
                    self._finish(r, now)
        self.iteration = i + 1

    def _finish(self, r, now):
        r.status = FINISHED
        r.finish_time = now
        self.finished.append(r)
        if self.on_finish is not None:
            self.on_finish(r, now)

    def used_blocks(self) -> int:
        return self.kv_blocks - self.free_blocks
