"""The engine's side of a replica: form an iteration's batch, apply it when it ends.

:class:`Iteration` is a base class of :class:`~sim.engine.core.replica.Replica`. Each
iteration, :meth:`Iteration.form_batch` reserves the blocks every decode crosses into
(preempting victims if the pool is short), calls the policy, which adds prefill work through
the replica's verbs, and snapshots the batch for the cost model; :meth:`Iteration.postprocess`
applies its effects when the iteration ends (prefill progress, tokens, finishes, freed blocks);
:meth:`Iteration.skip_decodes` applies a fast-forwarded stretch of pure-decode iterations at
once (:mod:`sim.engine.core.fastforward`).

Invariants (tests/test_replica.py, tests/test_engine.py): per-iteration work is O(admitted +
finished + preempted), never O(running); after ``n`` rounds of ``form_batch`` and
``postprocess`` of pure-decode iterations the state equals that after ``skip_decodes(n)``.
"""

from __future__ import annotations

try:
    import cython
except ImportError:  # interpreted without Cython: its no-op names (sim/cython_shim.py)
    from sim import cython_shim as cython

import numpy as np

from .batch import Batch, make_batch
from .decoding import Decodes, emits_single_token
from .queues import _del_running, _set_running
from .request import DECODE, FINISHED, PREFILL, REJECTED, Request


class Iteration:
    """A replica's iteration steps (see the module docstring)."""

    @cython.locals(r=Request)
    def reject(self, r, reason: str) -> None:
        r.status = REJECTED
        r.reason = reason
        r.finish_time = None
        self.finished.append(r)

    @cython.locals(r=Request)
    def _run(self, r) -> None:
        """``r`` joins the running set (``dict.__setitem__``: a policy's view refuses it)."""
        if cython.compiled:  # (the C call; the bound descriptor is a Python call)
            cython.cast(dict, self.running)[r.index] = r
        else:
            _set_running(self.running, r.index, r)

    def _unrun(self, index) -> None:
        """Request ``index`` leaves the running set (``dict.__delitem__``)."""
        if cython.compiled:
            del cython.cast(dict, self.running)[index]
        else:
            _del_running(self.running, index)

    @cython.locals(i=cython.longlong, need=cython.longlong, decodes=Decodes)
    def _reserve_decode_blocks(self, i):
        decodes, blocks = self.decodes, self.blocks
        need = decodes.blocks_needed(i)  # blocks the decodes cross into now
        while need > blocks.num_free:
            self.preempt(self.select_victim(self))  # a decode victim takes its need back
            need = decodes.blocks_needed(i)
        if self.caching:
            blocks.allocate(need)
        else:
            blocks.num_free -= need  # BlockManager.allocate, inlined (hot): need <= num_free

    def batch(self, detail: bool = False) -> Batch:
        """Snapshot of this iteration's work; ``detail``: include which requests prefill and
        each decode's id and context length (O(running)). Decodes count only when they run
        this iteration (not in a policy's prefill-only iteration)."""
        i, c = self.iteration, self.clock
        d = self.decodes
        prefill_ids = ids = lengths = None
        running = self.decoding
        if detail:
            prefill_ids = tuple([r.index for r in self._prefill_reqs])
            decoding = [r for r in self.running.values() if r.status == DECODE] if running \
                else []
            ids = tuple([r.index for r in decoding])
            lengths = np.array([d.context_length(r, c) for r in decoding], dtype=np.int64)
            lengths.flags.writeable = False
        return make_batch(i, tuple(self._prefills), self._prefill_tokens,
                          d.count if running else 0, d.context_tokens(c) if running else 0,
                          prefill_ids, ids, lengths, self.num_spec_tokens)

    def run_decodes(self) -> None:
        """For a policy with ``pauses_decodes``: the running decodes run this iteration (their
        blocks reserved now, preempting - SGLang's retraction - while the pool is short);
        without this call the iteration is prefill-only and the decodes wait."""
        if not self.on_demand_decodes or self.decoding:
            return
        self.decoding = True
        c = self.clock
        if self.decodes.blocks_needed(c):
            self._reserve_decode_blocks(c)
        self._decodes_reserved = c

    @cython.locals(c=cython.longlong, k=cython.longlong, d=Decodes)
    def form(self, schedule, now) -> None:
        """Form this iteration's work without its snapshot: give every decode the block it
        crosses into (preempting victims - never a decode that already has its block - while
        the pool is short), let ``schedule(self, now)`` (the policy) add prefill work; the
        batch's decode totals are then ``batch_decodes`` requests over ``batch_context``
        tokens (none when its decodes do not run). A policy with ``pauses_decodes`` decides
        itself: :meth:`run_decodes`."""
        self.now = now
        self.num_preempted_now = 0
        c = self.clock
        d = self.decodes
        if self.on_demand_decodes:
            self.decoding = False
            self._decodes_reserved = -1
            schedule(self, now)
            if self.decoding:
                self.batch_decodes = d.count
                self.batch_context = d.context_tokens(c)
            else:
                self.batch_decodes = self.batch_context = 0
            return
        k = self.num_spec_tokens  # the decode tracker's totals read inline (hot)
        if d.need[c & d.mask] if k else d.by_phase[c % self.block_size]:
            self._reserve_decode_blocks(c)
        self._decodes_reserved = c
        schedule(self, now)  # (may preempt decodes: their totals are read after it)
        self.batch_decodes = d.count
        self.batch_context = int(d.ctx[c & d.mask]) if k else d.context_offset + d.count * c

    def form_batch(self, schedule, now, detail: bool = False) -> Batch:
        """One iteration's batch: :meth:`form`, then its snapshot as :meth:`batch` takes it
        (``detail``: with the per-request fields)."""
        self.form(schedule, now)
        if detail:
            return self.batch(True)
        return make_batch(self.iteration, tuple(self._prefills), self._prefill_tokens,
                          self.batch_decodes, self.batch_context, None, None, None,
                          self.num_spec_tokens)

    def skip_decodes(self, n: int, need: int, last_start: float) -> None:
        """Apply ``n`` pure-decode iterations at once (the engine's fast-forward): nothing
        waits, nothing prefills, no decode finishes before the last of them or is preempted
        within them, and their decode blocks (``need`` in all) were free. Decode progress is
        lazy, so all that changes is the clocks and the pool: the state equals that after
        ``n`` rounds of :meth:`form_batch` and :meth:`postprocess`, the last one formed at
        ``last_start`` - except the finishes of the last one, if any: the caller's
        :meth:`finish_decodes` then (``clock - 1``)."""
        if self.caching:
            self.blocks.allocate(need)
        else:
            self.blocks.num_free -= need  # BlockManager.allocate, inlined: the caller checked
        if self.num_spec_tokens:  # SpecDecodes' ring entries of these steps freed
            d = self.decodes
            steps = np.arange(self.clock, self.clock + n) & d.mask
            d.ctx[steps] = 0
            d.need[steps] = 0
            if d.clip:  # (tokens left: read at the clock after their step)
                d.left[(steps - 1) & d.mask] = 0
        self.now = last_start
        self.num_preempted_now = 0
        self.decoding = True  # (a policy that pauses decodes ran them: run_decodes)
        self._decodes_reserved = self.clock + n - 1
        self.clock += n
        self.iteration += n

    @cython.locals(r=Request, i=cython.longlong, c=cython.longlong, bs=cython.longlong,
                   new=cython.longlong, running=cython.bint, completed=cython.bint,
                   j=cython.longlong, decodes=Decodes, reqs=list, prefills=list)
    def postprocess(self, now) -> None:
        """The iteration ended at ``now``: apply its prefill progress, emit tokens, finish
        requests and free their blocks; the decode clock advances if the decodes ran."""
        i, c = self.iteration, self.clock
        bs = self.block_size
        decodes = self.decodes
        running = self.decoding
        completed = False
        reqs, prefills = self._prefill_reqs, self._prefills
        for j, r in enumerate(reqs):  # (compiled, a C loop: a zip is a Python call)
            new = prefills[j][0]
            r.num_computed += new
            r.num_prefill_computed += new
            if self.radix and r.block_keys:
                self._insert(r)
            if r.num_computed < r.prefill_target:
                continue
            completed = True
            r.num_generated += 1  # the prefill's iteration emits a token
            if r.first_token_time is None:
                r.first_token_time = now
            if r.num_generated >= r.num_output_tokens:
                if running:
                    emits_single_token(r, c)
                else:  # a prefill-only iteration: a token outside the decode clock
                    r.segments.append((-1 - i, -1))
                if r.output_keys is not None and self.caching:
                    self._cache_answer(r)
                self._free_blocks(r, -(-r.num_computed // bs) if self.layers is None
                                  else self.layers.held(r.num_computed))
                self._unrun(r.index)
                self._finish(r, now)
                continue
            if self.on_prefilled is not None:  # disaggregation: hand its KV off
                self._hand_off(r, now)
                continue
            if running:
                decodes.start(r, c)
            else:  # its first token came in a prefill-only iteration: decodes from step c
                decodes.start(r, c - 1)
                r.paused_first = i
        if completed:
            self.prefilling = tuple([r for r in self.prefilling if r.status == PREFILL])
            if self.num_spec_tokens:  # the decodes started now: their vectors into the rings
                decodes.flush()
        if running:
            if c in decodes.finish_at:
                self.finish_decodes(c, now)
            if self.num_spec_tokens:  # SpecDecodes' ring entries of this step freed (hot)
                j = c & decodes.mask
                decodes.ctx[j] = 0
                decodes.need[j] = 0
                if decodes.clip:  # (tokens left: read at the clock after their step)
                    decodes.left[(c - 1) & decodes.mask] = 0
            self.clock = c + 1
        else:
            self.paused.append(i)
        if self._prefill_reqs:
            self._prefill_reqs = []
            self._prefills = []
            self._prefill_tokens = 0
        self.iteration = i + 1

    @cython.locals(r=Request, c=cython.longlong, freed=cython.longlong, decodes=Decodes)
    def finish_decodes(self, c, now) -> None:
        """The decodes emitting their last token at decode step ``c`` (ended at ``now``)
        finish: their blocks are freed (entries of requests preempted since are skipped)."""
        decodes = self.decodes
        freed = 0
        for r in decodes.finish_at.pop(c):
            if r.status == DECODE and r.finish_iteration == c:  # else preempted since
                if self.caching:
                    if r.output_keys is not None:
                        self._cache_answer(r)
                    self._free_blocks(r, decodes.finish(r, c))
                else:
                    freed += decodes.finish(r, c)
                self._unrun(r.index)
                self._finish(r, now)
        self.blocks.free(freed)

    @cython.locals(r=Request)
    def _finish(self, r, now):
        r.status = FINISHED
        r.finish_time = now
        self.finished.append(r)
        if self.lora is not None:
            self.lora.release(r)
        if self.on_finish is not None:
            self.on_finish(r, now)
