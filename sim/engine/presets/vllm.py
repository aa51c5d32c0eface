"""The vLLM v1 preset (:class:`VLLM`): vLLM's scheduler rule by rule, and its defaults.

Each preset of this package is a policy (see :mod:`sim.engine.core.policies` for the contract)
whose ``engine_defaults`` bring its engine's defaults for every knob the user leaves ``None``
(an explicit ``max_batch_size``, ``chunk_size``, ``block_size``, ``prefix_caching`` ... still
wins), and whose docstring lists its rules with the source they follow. Each rule has a
regression test on a small hand-built scenario (tests/test_presets.py). What the engine cannot
express is said under *Deviations*.
"""

from __future__ import annotations

try:
    import cython
except ImportError:  # interpreted without Cython: its no-op names (sim/cython_shim.py)
    from sim import cython_shim as cython

from ...specs.gpus import get_gpu
from ..core.policies import refuse_unused_knobs
from ..core.replica import Replica
from ..core.request import PREFILL, Request

GIB = 1 << 30


def _device_gib(config) -> float:
    gpu = get_gpu(config.gpu or "h100")
    return gpu.memory_gb * 1e9 / GIB


class VLLM:
    """vLLM v1 (V1 engine scheduler, vLLM v0.10: ``vllm/v1/core/sched/scheduler.py``;
    defaults from ``EngineArgs._set_default_args_v1``, OpenAI server).

    Rules:
    1. running requests first, in running (admission) order: every decode, then each partial
       prefill gets ``min(remaining prompt, budget)`` tokens (chunked prefill is on);
    2. then waiting requests FCFS, each chunked to the remaining budget after its prefix-cache
       hit, while ``len(running) < max_num_seqs`` and its blocks are free (with LoRA, one
       whose adapter can get no GPU slot is skipped, as vLLM v1 does: :mod:`sim.engine.kv.lora`);
    3. a running request that cannot get a block preempts the tail of the running list (the
       newest) by recompute, to the front of the waiting queue, repeatedly, possibly itself;
    4. no waiting request is admitted in a step that preempted;
    5. token budget ``max_num_batched_tokens`` (``chunk_size``) and ``max_num_seqs``
       (``max_batch_size``): 8192 and 1024 on GPUs of >= 70 GiB other than the A100, else 2048
       and 256; ``max_num_batched_tokens >= max_num_seqs``;
    6. block size 16, ``gpu_memory_utilization`` 0.9, block-hash prefix caching on
       (``prefix_caching="block"``: full blocks, hit capped at prompt - 1 token, LRU free queue).

    Deviations: every decode runs every iteration (vLLM spends the budget in running order, so a
    long partial prefill ahead of a decode could delay it one step); no watermark (v1 has none);
    no ``long_prefill_token_threshold`` (off by default); only prompt blocks are cached (the
    workload names prompt tokens only; vLLM also caches full blocks of generated tokens); freed
    blocks all join the LRU queue's tail as in v0.10 (later versions put uncached blocks at its
    head, so cached ones survive longer under pressure).
    """

    quiet_when_decoding = True  # nothing waiting or prefilling: schedule does nothing
    name = "vllm"

    def __init__(self, max_num_batched_tokens=8192):
        self.max_num_batched_tokens = max_num_batched_tokens

    @staticmethod
    def _is_big(config) -> bool:
        return _device_gib(config) >= 70 and "a100" not in get_gpu(config.gpu or "h100").name.lower()

    @classmethod
    def engine_defaults(cls, config) -> dict:
        return {"max_batch_size": 1024 if cls._is_big(config) else 256, "block_size": 16,
                "gpu_memory_utilization": 0.9, "prefix_caching": "block"}

    @classmethod
    def from_config(cls, config):
        refuse_unused_knobs(config, cls.name, ("chunk_size",))
        tokens = config.chunk_size or (8192 if cls._is_big(config) else 2048)
        if tokens < config.max_batch_size:
            raise ValueError(f"chunk_size (max_num_batched_tokens, {tokens}) must be >= "
                             f"max_batch_size (max_num_seqs, {config.max_batch_size})")
        return cls(tokens)

    def knobs(self) -> dict:
        return {"chunk_size": self.max_num_batched_tokens}

    @cython.locals(replica=Replica, r=Request, budget=cython.longlong, chunk=cython.longlong,
                   skip=cython.Py_ssize_t)
    def schedule(self, replica, now):
        # every decode takes 1 + k tokens of the budget (k: speculative lookahead, vLLM's rule)
        budget = (self.max_num_batched_tokens
                  - replica.decodes.count * (1 + replica.num_spec_tokens))
        for r in replica.prefilling:  # rule 1: running partial prefills, in running order
            if budget <= 0:
                break
            if r.status != PREFILL:  # preempted for an earlier request's blocks (rule 3)
                continue
            chunk = min(r.prefill_target - r.num_computed, budget)
            if replica.schedule_chunk(r, chunk):
                budget -= chunk
        if replica.num_preempted_now:  # rule 4
            return
        waiting = replica.waiting
        lora, skip = replica.lora, 0
        while budget > 0 and len(waiting) > skip:  # rule 2
            r = waiting[skip]
            if lora is not None and not lora.ready(r):  # vLLM v1 skips a request whose
                skip += 1  # adapter gets no GPU slot now (kv.lora), and goes on
                continue
            chunk = min(r.prefill_target - replica.prefix_hit(r), budget)
            if not replica.admit(r, chunk):
                break
            budget -= chunk

    def __repr__(self):
        return f"VLLM(max_num_batched_tokens={self.max_num_batched_tokens})"
