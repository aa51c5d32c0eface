"""The TensorRT-LLM preset: its default GUARANTEED_NO_EVICT capacity scheduler and its micro-batch
scheduler without chunked context (NVIDIA/TensorRT-LLM, Apache-2.0).

Rules (sources: ``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp``
``GuaranteedNoEvictScheduler::impl`` @ 02a10fed0dbf5db74c7da035be9c5fbef6d2df7a;
``scheduledBlocksManager.h`` ``NoEvictScheduledBlocksManager``;
``kvCacheManager.cpp`` ``getRemainingBlocksToCompletion`` @
b35ac1b64368513d215c57d2ed01d62d910df8da; ``microBatchScheduler.cpp`` @
0a949d3128bfaf4ddedefb0259125622a9ec830f):

1. **reservation**: every running request keeps its blocks to completion,
   ``ceil((prompt + max_new_tokens) / tokens_per_block)`` less the blocks it holds; a waiting
   request is admitted only when its own blocks to completion fit in the free blocks less
   what every running request still needs (``enoughAvailableBlocks``: ``needed <=
   available``), so a running request never lacks a block and nothing is ever preempted. The
   simulator knows each request's output length: ``num_output_tokens`` plays
   ``max_new_tokens`` (a client that sends ``max_tokens`` equal to the length it gets);
2. **FCFS, head-of-line**: waiting requests are tried in arrival order and the first that does
   not fit stops the admission for this iteration ("If one requests fails to be scheduled,
   break");
3. **token budget without chunking**: each running decode takes one token (``1 + k`` with
   ``k`` speculative tokens) of ``max_num_tokens`` (``token_budget``), then whole prompts are
   added while they fit ("if batchNumTokens + reqNumTokens > maxNumTokensRuntime: break");
   ``max_batch_size`` requests at most (running ones included);
4. defaults: ``max_batch_size`` 2,048 and ``max_num_tokens`` 8,192 (the LLM API's and
   ``trtllm-build``'s ``BuildConfig``); chunked context off (``enable_chunked_prefill=False`` in
   the 1.0 LLM API, ``enable_chunked_context`` false behind Triton); ``tokens_per_block`` 32
   (``PluginConfig._tokens_per_block`` in ``tensorrt_llm/plugin/plugin.py`` of the 0.17-era
   releases, which the 1.0 PyTorch backend reads through ``build_config.plugin_config``;
   ``KvCacheConfig.tokens_per_block`` in ``tensorrt_llm/llmapi/llm_args.py`` later, also 32);
   the KV pool from TensorRT-LLM's accounting at ``free_gpu_memory_fraction`` 0.9
   (:mod:`sim.specs.memory_terms`) unless ``kv_blocks`` is given. The policy is the default
   of the C++ executor, the LLM API (``CapacitySchedulerPolicy.GUARANTEED_NO_EVICT``) and the
   Triton backend (``getSchedulerConfigFromParams`` in
   ``inflight_batcher_llm/src/model_instance_state.cc``, triton-inference-server/
   tensorrtllm_backend @ 90b204cc3cd2b9fc1467205fbe6b270b3e119092, when
   ``batch_scheduler_policy`` is not set).

The reservation is kept as a running total (O(admitted + finished) per iteration): blocks to
completion are added at admission and taken off as ``replica.finished`` grows, and with no
prefix cache ``free - sum(to completion - held) == num_blocks - sum(to completion)`` (the pool's
invariant: running requests hold every used block). A replica where that does not hold -
prefix caching (shared blocks), a prefill pool handing requests off, a decode pool receiving
them (its waiting requests are preempted ones), anything preempted - is read TensorRT-LLM's way,
summing over the running requests (O(running) per iteration with requests waiting).

Deviations: a prompt above ``max_num_tokens`` is admitted as the first prompt of its iteration,
beside the decodes (as if ``max_num_tokens`` covered it: a TensorRT-LLM engine without chunked
context serves no prompt above its ``max_num_tokens``, which its builds size for their
``max_input_len``, and ``trtllm-bench`` raises to up to 32,768 by its dataset's lengths,
``tensorrt_llm/bench/build/tuning.py`` ``finetune_setting``); decodes above ``max_num_tokens``
still all run; the
reservation includes the ``k`` lookahead slots of speculative decoding (the simulator's draft
slots hold blocks); block reuse (on by default in the LLM API) is off by default here
(``prefix_caching`` may turn the simulator's on); in disaggregated pools the decode side's
KV transfers take blocks outside the reservation, so preemption is possible there;
``beneficialToSkip`` (waiting for a prefix another context is computing) is not modelled.
"""

from __future__ import annotations

import weakref

from ..checks import positive_int
from ..specs.memory_terms import (TRTLLM_FREE_GPU_MEMORY_FRACTION, TRTLLM_MAX_NUM_TOKENS,
                                  check_free_gpu_memory_fraction)
from .policies import refuse_unused_knobs

MAX_NUM_TOKENS = TRTLLM_MAX_NUM_TOKENS  # BuildConfig.max_num_tokens
MAX_BATCH_SIZE = 2048  # BuildConfig.max_batch_size
TOKENS_PER_BLOCK = 32  # PluginConfig.tokens_per_block / KvCacheConfig.tokens_per_block
FREE_GPU_MEMORY_FRACTION = TRTLLM_FREE_GPU_MEMORY_FRACTION  # KvCacheConfig's default


class TensorRTLLM:
    """TensorRT-LLM (GUARANTEED_NO_EVICT): whole prompts join the decodes FCFS only when every
    running request's KV to completion stays reserved; nothing is preempted."""

    name = "tensorrt-llm"
    quiet_when_decoding = True  # nothing waiting: schedule returns before touching anything
    memory_accounting = "tensorrt-llm"  # the KV pool: free_gpu_memory_fraction of what is free
    free_gpu_memory_fraction = FREE_GPU_MEMORY_FRACTION

    def __init__(self, max_num_tokens=MAX_NUM_TOKENS, free_gpu_memory_fraction=None):
        self.max_num_tokens = positive_int("max_num_tokens", max_num_tokens)
        if free_gpu_memory_fraction is not None:
            self.free_gpu_memory_fraction = check_free_gpu_memory_fraction(
                free_gpu_memory_fraction)
        self._replica = None  # weak reference to the replica the state below belongs to
        self._reserved = {}  # index -> blocks to completion, of the requests it admitted
        self._total = 0  # sum(self._reserved.values())
        self._seen = 0  # replica.finished entries already taken off
        self._exact = False  # sum over the running requests (see the module docstring)

    @classmethod
    def engine_defaults(cls, config) -> dict:
        # gpu_memory_utilization is vLLM's: the pool comes from free_gpu_memory_fraction
        # (rule 4), and a value given for it is refused (SimConfig.resolved_kv_blocks)
        return {"max_batch_size": MAX_BATCH_SIZE, "block_size": TOKENS_PER_BLOCK,
                "gpu_memory_utilization": None, "prefix_caching": False}

    @classmethod
    def from_config(cls, config):
        refuse_unused_knobs(config, cls.name, ("token_budget",))
        return cls(config.token_budget or MAX_NUM_TOKENS)

    def knobs(self) -> dict:
        return {"token_budget": self.max_num_tokens}

    @staticmethod
    def to_completion(replica, r) -> int:
        """Rule 1: the blocks ``r`` holds when it has written its last token's KV
        (``getRemainingBlocksToCompletion`` of a request holding none yet); with speculative
        decoding, plus its ``k`` lookahead slots."""
        return -(-(r.num_prompt_tokens + r.num_output_tokens + replica.num_spec_tokens)
                 // replica.block_size)

    def _available(self, replica) -> int:
        """Blocks free once every running request's blocks to completion are reserved."""
        if self._replica is None or self._replica() is not replica:  # a new run
            self._replica = weakref.ref(replica)
            self._reserved, self._total, self._seen = {}, 0, 0
            self._exact = replica.caching or replica.on_prefilled is not None
        finished, reserved = replica.finished, self._reserved
        if self._seen < len(finished):
            for r in finished[self._seen:]:
                self._total -= reserved.pop(r.index, 0)
            self._seen = len(finished)
        if not self._exact and (len(reserved) != len(replica.running)
                                or replica.num_in_transit
                                or replica.waiting[0].num_preemptions):
            self._exact = True  # something else moved requests: read the running set
        if self._exact:
            return replica.blocks.num_free - sum(
                self.to_completion(replica, r) - replica.held_blocks(r)
                for r in replica.running.values())
        return replica.blocks.num_blocks - self._total

    def schedule(self, replica, now):
        waiting = replica.waiting
        if not waiting:
            return
        available = self._available(replica)
        decodes = replica.decodes.count
        budget = self.max_num_tokens - decodes * (1 + replica.num_spec_tokens)  # rule 3
        first = True
        while waiting:
            r = waiting[0]
            need = r.prefill_target - replica.prefix_hit(r)
            if need > budget and not (first and need > self.max_num_tokens):
                break  # (a prompt over max_num_tokens goes first in its iteration: a deviation)
            blocks = self.to_completion(replica, r)
            if blocks > available:  # rule 2: the head does not fit, nobody behind it goes
                break
            if not replica.admit(r, need):  # no batch slot
                break
            available -= blocks
            budget -= need
            first = False
            if not self._exact:
                self._reserved[r.index] = blocks
                self._total += blocks

    def __repr__(self):
        return (f"TensorRTLLM(max_num_tokens={self.max_num_tokens}, "
                f"free_gpu_memory_fraction={self.free_gpu_memory_fraction})")
