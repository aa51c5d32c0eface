"""The SGLang preset: SGLang's scheduler rule by rule (``python/sglang/srt/managers/
scheduler.py`` ``get_next_batch_to_run`` / ``update_running_batch`` and ``schedule_policy.py``
``PrefillAdder``, v0.4-era defaults).

Rules:
1. **prefill priority**: each step, if a prefill batch can be formed it runs *alone* (mixed
   chunks are off by default) and the running decodes wait; otherwise every running request
   decodes. The engine pauses the decodes through ``pauses_decodes`` and
   :meth:`~sim.engine.core.replica.Replica.run_decodes` (a decode clock: a paused iteration emits
   no decode token);
2. the prefill batch: the chunked request first (**one chunked request at a time**: a request
   that does not fit the remaining ``chunked_prefill_size`` (``chunk_size``) is truncated to it
   and continued next step), then waiting requests FCFS while the chunk budget, the
   ``max_prefill_tokens`` input budget (``token_budget``, 16,384) and a batch slot last;
3. **reservation**: a new request is admitted only while its prompt plus
   ``min(output tokens left, 4096)`` is below the tokens free after reserving, for every running
   request, ``min(output tokens left, 4096) x new_token_ratio``;
4. ``new_token_ratio`` starts at 0.7, decays by (0.7 - 0.1) / 600 per decode step to 0.1;
5. **retraction**: when a decode step lacks KV for its new tokens, running requests are retracted
   (recompute preemption) fewest output tokens first (ties: longest prompt first), and
   ``new_token_ratio`` becomes ``min(1, (decoded tokens + 20 x running) / output tokens)`` over
   those left;
6. defaults: page size 1 (``block_size=1``), ``chunked_prefill_size`` by GPU memory (2,048
   below 35 GiB, 4,096 below 60, 8,192 below 160 - A100, H100, H200 - else 16,384), and
   the KV pool from SGLang's accounting (``mem_fraction_static`` x device memory - weights,
   :mod:`sim.specs.memory_terms`) unless ``kv_blocks`` is given; ``max_batch_size`` 1,024.

7. the radix prefix cache (``prefix_caching="radix"``, :mod:`sim.engine.kv.radix`): a waiting
   request's cached prefix is served (capped at prompt - 1), its computed prompt enters the tree
   after each chunk, unreferenced leaves are evicted least recently used first; the free tokens
   of rule 3 include the evictable ones, less those the request's own hit references.

Deviations: ``max_running_requests`` is derived from the pool by SGLang (1,024 here); the
admission's reservation is kept by the replica's decode tracker (``clip_left``:
:class:`~sim.engine.core.decoding.ClippedDecodes`, or under speculation a ring of
:class:`~sim.engine.core.decoding.SpecDecodes`), not read request by request as SGLang's loop does
(same sum), and a retraction reads every running request (as SGLang's does). In clusters and disaggregated pools every replica runs its own
copy of the policy (sim.engine.fleet.cluster).
"""

from __future__ import annotations

try:
    import cython
except ImportError:  # interpreted without Cython: its no-op names (sim/cython_shim.py)
    from sim import cython_shim as cython

from ...specs.memory_terms import sglang_defaults
from ..core.policies import refuse_unused_knobs
from ..core.replica import Replica
from ..core.request import DECODE, PREFILL, Request
from .vllm import _device_gib

CLIP_MAX_NEW_TOKENS = 4096  # SGLang's CLIP_MAX_NEW_TOKENS_ESTIMATION
INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO, DECAY_STEPS = 0.7, 0.1, 600
RETRACT_DECODE_STEPS = 20
MAX_PREFILL_TOKENS = 16384


def chunked_prefill_size(config) -> int:
    """SGLang's default for the run's GPU and TP (``ServerArgs._handle_gpu_memory_settings``)."""
    return sglang_defaults(_device_gib(config) * 1024, config.tensor_parallel)[0]


class SGLang:
    """SGLang's scheduler (see the module docstring for the rules and deviations)."""

    name = "sglang"
    pauses_decodes = True
    quiet_when_decoding = True  # nothing waiting or prefilling: the decodes run (rule 1)
    memory_accounting = "sglang"  # the KV pool: mem_fraction_static x device - weights
    clip_left = CLIP_MAX_NEW_TOKENS  # the replica keeps rule 3's sum (decoding.ClippedDecodes)

    def __init__(self, chunked_prefill_size=8192, max_prefill_tokens=MAX_PREFILL_TOKENS):
        self.chunked_prefill_size = chunked_prefill_size
        self.max_prefill_tokens = max_prefill_tokens
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.decay = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / DECAY_STEPS
        self.chunked = None  # the request being prefilled chunk by chunk

    @classmethod
    def engine_defaults(cls, config) -> dict:
        # gpu_memory_utilization is vLLM's: the pool comes from mem_fraction_static (rule 6),
        # and a value given for it is refused (SimConfig.resolved_kv_blocks), not ignored
        return {"max_batch_size": 1024, "block_size": 1, "gpu_memory_utilization": None,
                "prefix_caching": "radix"}

    @classmethod
    def from_config(cls, config):
        refuse_unused_knobs(config, cls.name, ("chunk_size", "token_budget"))
        return cls(config.chunk_size or chunked_prefill_size(config),
                   config.token_budget or MAX_PREFILL_TOKENS)

    def knobs(self) -> dict:
        return {"chunk_size": self.chunked_prefill_size, "token_budget": self.max_prefill_tokens}

    @cython.locals(replica=Replica, r=Request)
    def _left(self, replica, r) -> int:
        return min(r.num_output_tokens - replica.num_generated(r), self.clip_left)

    def _reserved(self, replica) -> int:
        """Rule 3's tokens to reserve before ``new_token_ratio``: the running requests' output
        tokens left, each clipped; the decodes' sum kept by the replica (``clip_left``:
        O(prefilling) here), else - a replica built without it - read request by request."""
        clipped = getattr(replica.decodes, "clipped_left", None)
        if clipped is None:
            return sum(self._left(replica, x) for x in replica.running.values())
        total = clipped(replica.clock - 1)
        for x in replica.prefilling:  # (a loop, not a generator: compiled, a C loop)
            total += self._left(replica, x)
        return total

    def schedule(self, replica, now):
        if self._prefill(replica):  # rule 1: a prefill batch runs alone
            return
        replica.run_decodes()
        if replica.num_preempted_now:  # rule 5: retracted
            running = list(replica.running.values())
            out = sum(r.num_output_tokens for r in running)
            done = sum(replica.num_generated(r) for r in running)
            self.new_token_ratio = min(1.0, (done + RETRACT_DECODE_STEPS * len(running))
                                       / out) if out else INIT_NEW_TOKEN_RATIO
        else:  # rule 4
            self.new_token_ratio = self._decayed(self.new_token_ratio)

    def decoded_quietly(self, replica, n) -> None:
        """``n`` iterations in which nothing waited or prefilled ran without a ``schedule``
        call (the engine's fast-forward): do what those calls would have done - no prefill
        batch, the decodes ran without a retraction (rule 1), ``new_token_ratio`` decayed once
        per step (rule 4)."""
        self.chunked = None
        ratio = self.new_token_ratio
        for _ in range(n):
            if ratio == MIN_NEW_TOKEN_RATIO:
                break
            ratio = self._decayed(ratio)
        self.new_token_ratio = ratio

    def _decayed(self, ratio) -> float:
        """Rule 4: ``new_token_ratio`` after one decode step."""
        return max(ratio - self.decay, MIN_NEW_TOKEN_RATIO)

    @cython.locals(replica=Replica, r=Request, budget=cython.longlong, inputs=cython.longlong,
                   progressed=cython.bint, left=cython.longlong, chunk=cython.longlong,
                   need=cython.longlong, total=cython.longlong, free=cython.longlong,
                   reserved=cython.double, rem_total=cython.double)
    def _prefill(self, replica) -> bool:
        """Form the prefill batch (rules 2-3); True if it holds any work."""
        budget, inputs = self.chunked_prefill_size, self.max_prefill_tokens
        progressed = False
        r = self.chunked
        self.chunked = None
        # the chunked request, then (an offload tier) requests whose KV landed, oldest first
        for r in (r,) if replica.tier is None else (r,) + replica.prefilling:
            if r is None or r.status != PREFILL or replica.is_scheduled(r) or budget <= 0:
                continue
            left = r.prefill_target - r.num_computed
            chunk = min(left, budget)
            if replica.schedule_chunk(r, chunk):
                progressed = True
                budget -= chunk
                inputs -= chunk
                if chunk < left:
                    self.chunked = r
                    return True
        waiting = replica.waiting
        if not waiting or budget <= 0:
            return progressed
        free = replica.blocks.num_free * replica.block_size
        reserved = self.new_token_ratio * self._reserved(replica)
        rem_total = free - reserved
        while waiting and budget > 0 and inputs > 0:
            if len(replica.running) >= replica.max_batch_size:
                break
            r = waiting[0]
            # its prompt and outputs, plus the cached tokens its hit takes out of the evictable
            # ones (SGLang locks the matched nodes before checking); no hit without hash ids
            if r.block_keys is None or not replica.caching:
                need = r.prefill_target
                total = need + self._left(replica, r)
            else:
                need = r.prefill_target - replica.prefix_hit(r)
                total = (need + self._left(replica, r)
                         + replica.prefix_pinned(r) * replica.block_size)
            if total >= rem_total and (replica.running or progressed):  # rule 3
                break
            chunk = min(need, budget)
            if not replica.admit(r, chunk):
                break
            progressed = True
            budget -= chunk
            inputs -= chunk
            rem_total -= total
            if chunk < need:  # rule 2: one chunked request at a time
                self.chunked = r
                break
        return progressed

    @staticmethod
    def select_victim(replica):
        """Rule 5: the running decode with the fewest output tokens (ties: the longest prompt);
        the newest request when none decodes."""
        decoding = [r for r in replica.running.values() if r.status == DECODE]
        if not decoding:
            running = replica.running
            return running[next(reversed(running))]
        return min(decoding, key=lambda r: (replica.num_generated(r), -r.num_prompt_tokens))

    def __repr__(self):
        return (f"SGLang(chunked_prefill_size={self.chunked_prefill_size}, "
                f"max_prefill_tokens={self.max_prefill_tokens})")
