"""The TensorRT-LLM preset: its capacity schedulers (GUARANTEED_NO_EVICT, the default, and
MAX_UTILIZATION) and its micro-batch scheduler, with or without chunked context
(NVIDIA/TensorRT-LLM, Apache-2.0).

Rules (sources: ``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp``
``GuaranteedNoEvictScheduler::impl`` and ``MaxUtilizationScheduler::operator()`` @
02a10fed0dbf5db74c7da035be9c5fbef6d2df7a; ``scheduledBlocksManager.h``
``NoEvictScheduledBlocksManager`` and ``MaxUtilizationScheduledBlocksManager`` @
1ce9149bf3c290610ec8091806d68f6226ce3328; ``kvCacheManager.cpp``
``getRemainingBlocksToCompletion``, ``getNeededBlocksOneStep`` and
``trtGptModelInflightBatching.cpp`` (constructor) @ b35ac1b64368513d215c57d2ed01d62d910df8da;
``microBatchScheduler.cpp`` ``operator()`` and ``setCtxRequestsChunkSize`` @
0a949d3128bfaf4ddedefb0259125622a9ec830f; ``tensorrt_llm/llmapi/llm.py``
``_check_arguments`` @ 4c05a74891e4df8066f08ed4ce14b0972abe4e25):

1. **reservation**: every running request keeps its blocks to completion,
   ``ceil((prompt + max_new_tokens) / tokens_per_block)`` less the blocks it holds; a waiting
   request is admitted only when its own blocks to completion fit in the free blocks less
   what every running request still needs (``enoughAvailableBlocks``: ``needed <=
   available``), so a running request never lacks a block and nothing is ever preempted. The
   simulator knows each request's output length: ``num_output_tokens`` plays
   ``max_new_tokens`` (a client that sends ``max_tokens`` equal to the length it gets);
2. **FCFS, head-of-line**: waiting requests are tried in arrival order and the first that does
   not fit stops the admission for this iteration ("If one requests fails to be scheduled,
   break"); ``max_batch_size`` requests at most (running ones included);
3. **token budget without chunked context**: each running decode takes one token (``1 + k``
   with ``k`` speculative tokens) of ``max_num_tokens`` (``token_budget``), then whole prompts
   are added while they fit ("if batchNumTokens + reqNumTokens > maxNumTokensRuntime:
   break"). A prompt above ``max_num_tokens`` can never run: the LLM API refuses it when it
   is submitted ("The sum of prompt length (...), query length (...) should not exceed
   max_num_tokens", PyTorch backend without ``enable_chunked_prefill``; the C++ micro-batch
   scheduler's check "The number of context tokens (%d) exceeds the limit value (%d)", the
   limit being ``max_num_tokens`` with context FMHA), so it is **rejected at arrival** with
   that reason (after ``max_model_len``'s check; :meth:`TensorRTLLM.reject_reason`);
4. **chunked context** (``enable_chunked_context=True``): after the decodes, the running
   partial prompts (oldest first) and then the new requests that passed rules 1-2 share what
   is left of ``max_num_tokens``, FIRST_COME_FIRST_SERVED (the context chunking policy
   TensorRT-LLM uses when none is set: ``value_or(kFIRST_COME_FIRST_SERVED)``): each in turn
   gets ``min(rest of its prompt, capacity left)``, rounded down to a multiple of the chunk
   unit ``tokens_per_block`` (at most ``max_num_tokens``) when that cuts it (so a later,
   shorter prompt may still fit whole in the remainder); a request given 0 tokens waits (a new
   one is not admitted and reserves nothing, but takes a batch slot in that iteration, as
   TensorRT-LLM counts it). No prompt is too long: one above ``max_num_tokens`` runs over
   several iterations. With ``context_chunking_policy="equal_progress"`` the contexts instead
   take ``unit`` more tokens each in turn, round after round (a context's last step only what
   it has left, a step that would overflow skipped), until a round adds nothing;
5. defaults: ``max_batch_size`` 2,048 and ``max_num_tokens`` 8,192 (the LLM API's and
   ``trtllm-build``'s ``BuildConfig``); chunked context off (``enable_chunked_prefill=False`` in
   the 1.0 LLM API, ``tensorrt_llm/llmapi/llm_args.py`` @ fcd3f31682808ae56118ae43c1d7864a3a945e6f;
   ``enable_chunked_context`` false behind Triton; ``trtllm-bench throughput`` turns it on,
   ``--enable_chunked_context/--disable_chunked_context`` ``default=True`` in
   ``tensorrt_llm/bench/benchmark/throughput.py`` @ 000a01de66f0eab4ab05640711f0253f50f5209c);
   ``tokens_per_block`` 32 (``PluginConfig._tokens_per_block`` in
   ``tensorrt_llm/plugin/plugin.py`` of the 0.17-era releases, which the 1.0 PyTorch backend
   reads through ``build_config.plugin_config``; ``KvCacheConfig.tokens_per_block`` in
   ``tensorrt_llm/llmapi/llm_args.py`` later, also 32); the KV pool from TensorRT-LLM's
   accounting at ``free_gpu_memory_fraction`` 0.9 (:mod:`sim.specs.memory_terms`; the knob of
   ``SimConfig`` and ``sim run --free-gpu-memory-fraction``) unless ``kv_blocks`` is given. The
   policy is the default of the C++ executor, the LLM API
   (``CapacitySchedulerPolicy.GUARANTEED_NO_EVICT``) and the Triton backend
   (``getSchedulerConfigFromParams`` in ``inflight_batcher_llm/src/model_instance_state.cc``,
   triton-inference-server/tensorrtllm_backend @ 90b204cc3cd2b9fc1467205fbe6b270b3e119092, when
   ``batch_scheduler_policy`` is not set);
6. **MAX_UTILIZATION** (``capacity_scheduler_policy="max_utilization"``; the LLM API's
   ``SchedulerConfig``, ``trtllm-bench --scheduler_policy max_utilization``): no reservation;
   requests are taken in arrival order, each needing only this step's blocks
   (``getNeededBlocksOneStep``: a decode the block its next token crosses into, a new prompt
   all of its prompt's blocks); one that does not fit pauses the most recently started
   request younger than it ("we need to start freeing started requests from the end"), which
   frees its blocks and is recomputed later (``pause``: prompt plus generated tokens), until it
   fits or no such request is left, when the scheduling stops. In the simulator the decodes'
   blocks are taken first, pausing the newest (the replica's victim rule: the same request,
   admission being first come first served), then waiting requests are admitted in order
   while their prompt's blocks are free. Every running request started before every waiting
   one (a paused request is the newest when paused and waits at the head of the queue), so a
   waiting request has no younger started request to pause: TensorRT-LLM's walk reduces to
   these two steps (tests/test_tensorrt_llm.py checks the order every iteration). Rules 3-4
   (the token budget, chunked context) apply as under GUARANTEED_NO_EVICT.

The reservation is kept as a running total (O(admitted + finished) per iteration): blocks to
completion are added at admission and taken off as ``replica.finished`` grows, and with no
prefix cache ``free - sum(to completion - held) == num_blocks - sum(to completion)`` (the pool's
invariant: running requests hold every used block). A replica where that does not hold -
prefix caching (shared blocks), a prefill pool handing requests off, a decode pool receiving
them (its waiting requests are preempted ones), anything preempted - is read TensorRT-LLM's way,
summing over the running requests (O(running) per iteration with requests waiting).

Deviations: decodes above ``max_num_tokens`` still all run; a request preempted (in a
disaggregated decode pool, below, or paused under MAX_UTILIZATION) whose prompt plus generated
tokens exceed ``max_num_tokens`` re-prefills whole, first in its iteration, without chunked
context (TensorRT-LLM's ``pause`` keeps at most ``max_input_len`` of them); the
reservation includes the ``k`` lookahead slots of speculative decoding (the
simulator's draft slots hold blocks), and draft tokens take no chunk tokens
(``fitDraftTokens`` is not modelled); block reuse (on by default in the LLM API) is off by default here (``prefix_caching`` may turn
the simulator's on); in disaggregated pools the decode side's KV transfers take blocks outside
the reservation, so preemption is possible there; ``beneficialToSkip`` (waiting for a prefix
another context is computing) is not modelled. Under MAX_UTILIZATION: the admission stops at
the first waiting request given no chunk (TensorRT-LLM's micro-batch may still fit a later,
shorter one), and a continuing chunk takes its blocks as it runs (TensorRT-LLM holds the whole
prompt's from its first chunk): a new prompt is admitted, as there, only within the blocks left
once every running prompt has all of its own (``_prompts_owed``), but the decodes may take
those meanwhile and pause a prompt that TensorRT-LLM would have kept.
"""

from __future__ import annotations

import weakref

from ...checks import positive_int
from ...results.metrics import MAX_NUM_TOKENS as MAX_NUM_TOKENS_REASON
from ...specs.memory_terms import (TRTLLM_FREE_GPU_MEMORY_FRACTION, TRTLLM_MAX_NUM_TOKENS,
                                  check_free_gpu_memory_fraction)
from ..core.policies import refuse_unused_knobs
from ..core.request import PREFILL
from .tensorrt_llm_chunking import CONTEXT_CHUNKING_POLICIES, equal_progress_chunks, fcfs_chunk

MAX_NUM_TOKENS = TRTLLM_MAX_NUM_TOKENS  # BuildConfig.max_num_tokens
MAX_BATCH_SIZE = 2048  # BuildConfig.max_batch_size
TOKENS_PER_BLOCK = 32  # PluginConfig.tokens_per_block / KvCacheConfig.tokens_per_block
FREE_GPU_MEMORY_FRACTION = TRTLLM_FREE_GPU_MEMORY_FRACTION  # KvCacheConfig's default
# CapacitySchedulerPolicy's values (the LLM API's SchedulerConfig), the first the default
CAPACITY_SCHEDULER_POLICIES = ("guaranteed_no_evict", "max_utilization")


def _one_of(name, given, choices) -> str:
    value = given.strip().lower() if isinstance(given, str) else given
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {given!r}")
    return value


class TensorRTLLM:
    """TensorRT-LLM (GUARANTEED_NO_EVICT): prompts join the decodes FCFS, whole or (chunked
    context) in chunks, only when every running request's KV to completion stays reserved;
    nothing is preempted."""

    name = "tensorrt-llm"
    quiet_when_decoding = True  # nothing waiting or prefilling: schedule returns at once
    memory_accounting = "tensorrt-llm"  # the KV pool: free_gpu_memory_fraction of what is free
    free_gpu_memory_fraction = FREE_GPU_MEMORY_FRACTION

    def __init__(self, max_num_tokens=MAX_NUM_TOKENS, free_gpu_memory_fraction=None,
                 enable_chunked_context=False, capacity_scheduler_policy="guaranteed_no_evict",
                 context_chunking_policy=None):
        self.max_num_tokens = positive_int("max_num_tokens", max_num_tokens)
        if free_gpu_memory_fraction is not None:
            self.free_gpu_memory_fraction = check_free_gpu_memory_fraction(
                free_gpu_memory_fraction)
        if not isinstance(enable_chunked_context, bool):
            raise TypeError(f"enable_chunked_context must be True or False, got "
                            f"{enable_chunked_context!r}")
        self.enable_chunked_context = enable_chunked_context
        self.capacity_scheduler_policy = _one_of("capacity_scheduler_policy",
                                                 capacity_scheduler_policy,
                                                 CAPACITY_SCHEDULER_POLICIES)
        self.max_utilization = self.capacity_scheduler_policy == "max_utilization"
        if context_chunking_policy is not None and not enable_chunked_context:
            raise ValueError(f"context_chunking_policy={context_chunking_policy!r} chooses how "
                             f"prompts are cut: it needs enable_chunked_context=True")
        self.context_chunking_policy = None if not enable_chunked_context else _one_of(
            "context_chunking_policy", context_chunking_policy or CONTEXT_CHUNKING_POLICIES[0],
            CONTEXT_CHUNKING_POLICIES)
        self.equal_progress = self.context_chunking_policy == "equal_progress"
        self._replica = None  # weak reference to the replica the state below belongs to
        self._reserved = {}  # index -> blocks to completion, of the requests it admitted
        self._total = 0  # sum(self._reserved.values())
        self._seen = 0  # replica.finished entries already taken off
        self._exact = False  # sum over the running requests (see the module docstring)

    @classmethod
    def engine_defaults(cls, config) -> dict:
        # gpu_memory_utilization is vLLM's: the pool comes from free_gpu_memory_fraction
        # (rule 5), and a value given for it is refused (SimConfig.resolved_kv_blocks)
        return {"max_batch_size": MAX_BATCH_SIZE, "block_size": TOKENS_PER_BLOCK,
                "gpu_memory_utilization": None, "prefix_caching": False}

    @classmethod
    def from_config(cls, config):
        refuse_unused_knobs(config, cls.name, ("token_budget", "free_gpu_memory_fraction",
                                               "enable_chunked_context",
                                               "capacity_scheduler_policy",
                                               "context_chunking_policy"))
        fraction = config.free_gpu_memory_fraction  # (not beside kv_blocks: SimConfig)
        chunked, policy = config.enable_chunked_context, config.capacity_scheduler_policy
        return cls(config.token_budget or MAX_NUM_TOKENS, fraction,
                   False if chunked is None else chunked,
                   CAPACITY_SCHEDULER_POLICIES[0] if policy is None else policy,
                   config.context_chunking_policy)

    def knobs(self) -> dict:
        """The knobs it uses, as ``SimConfig`` fields (the fraction only when given: with
        ``kv_blocks`` none sizes the pool)."""
        return {"token_budget": self.max_num_tokens,
                "free_gpu_memory_fraction": vars(self).get("free_gpu_memory_fraction"),
                "enable_chunked_context": self.enable_chunked_context,
                "capacity_scheduler_policy": self.capacity_scheduler_policy,
                "context_chunking_policy": self.context_chunking_policy}

    def reject_reason(self, r):
        """Rule 3: why an arriving request can never run (None: it can)."""
        if self.enable_chunked_context or r.num_prompt_tokens <= self.max_num_tokens:
            return None
        return (f"{MAX_NUM_TOKENS_REASON}: a prompt of {r.num_prompt_tokens:,} tokens exceeds "
                f"max_num_tokens {self.max_num_tokens:,} without chunked context (TensorRT-LLM "
                f"refuses it; enable_chunked_context=True would run it in chunks)")

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

    def _admit(self, replica, r, tokens, blocks) -> bool:
        if not replica.admit(r, tokens):  # no batch slot
            return False
        if not self._exact and not self.max_utilization:
            self._reserved[r.index] = blocks
            self._total += blocks
        return True

    def schedule(self, replica, now):
        budget = self.max_num_tokens - replica.decodes.count * (1 + replica.num_spec_tokens)
        if self.equal_progress:
            return self._schedule_equal_progress(replica, budget)
        if self.max_utilization:
            return self._schedule_max_utilization(replica, budget)
        if self.enable_chunked_context:
            return self._schedule_chunks(replica, budget)
        waiting = replica.waiting
        if not waiting:
            return
        available = self._available(replica)
        first = True
        while waiting:
            r = waiting[0]
            need = r.prefill_target - replica.prefix_hit(r)
            if need > budget and not (first and need > self.max_num_tokens):
                break  # rule 3 (a re-prefill over max_num_tokens goes first: a deviation)
            blocks = self.to_completion(replica, r)
            if blocks > available:  # rule 2: the head does not fit, nobody behind it goes
                break
            if not self._admit(replica, r, need, blocks):  # no batch slot
                break
            available -= blocks
            budget -= need
            first = False

    def _schedule_chunks(self, replica, capacity):
        """Rule 4: running partial prompts, then new requests, share ``capacity`` FCFS."""
        unit = min(replica.block_size, self.max_num_tokens)  # (chunkUnitSize, at most it)
        for r in replica.prefilling:  # their blocks to completion are reserved (rule 1)
            if capacity <= 0:
                return
            chunk = fcfs_chunk(r.prefill_target - r.num_computed, capacity, unit)
            if chunk and replica.schedule_chunk(r, chunk):
                capacity -= chunk
        waiting = replica.waiting
        if capacity <= 0 or not waiting:
            return
        available = self._available(replica)
        slots = replica.max_batch_size - len(replica.running)
        chosen = []  # (request, chunk, blocks): rules 1-2 pass them, the chunk may be 0
        for r in waiting:  # (read now, admitted below: admission changes the queue)
            if slots <= 0 or capacity <= 0:
                break
            blocks = self.to_completion(replica, r)
            if blocks > available:  # rule 2
                break
            available -= blocks
            slots -= 1
            chunk = fcfs_chunk(r.prefill_target - replica.prefix_hit(r), capacity, unit)
            capacity -= chunk
            if chunk:
                chosen.append((r, chunk, blocks))
        for r, chunk, blocks in chosen:
            if not self._admit(replica, r, chunk, blocks):
                break

    def _schedule_equal_progress(self, replica, capacity):
        """Rule 4 with EQUAL_PROGRESS: every context that passes the capacity scheduler (rules
        1-2, or rule 6's one-step blocks) is read first, then ``capacity`` is dealt out."""
        if capacity <= 0:
            return
        contexts = list(replica.prefilling)
        rests = [r.prefill_target - r.num_computed for r in contexts]
        new = []  # (request, blocks to completion)
        slots = replica.max_batch_size - len(replica.running)
        if replica.waiting and slots > 0:
            mu = self.max_utilization
            available = (replica.blocks.num_free - self._prompts_owed(replica) if mu
                         else self._available(replica))
            for r in replica.waiting:  # (read now, admitted below)
                rest = r.prefill_target - replica.prefix_hit(r)
                blocks = -(-rest // replica.block_size) if mu else self.to_completion(replica, r)
                if blocks > available:  # rule 2 (rule 6: its prompt's blocks)
                    break
                available -= blocks
                new.append((r, blocks))
                rests.append(rest)
                if len(new) == slots:
                    break
        chunks = equal_progress_chunks(rests, capacity, min(replica.block_size,
                                                            self.max_num_tokens))
        paused = replica.num_preempted_now
        for r, chunk in zip(contexts, chunks):
            if chunk and r.status == PREFILL:  # (rule 6: a later chunk may pause the newest)
                replica.schedule_chunk(r, chunk)
        if replica.num_preempted_now > paused:
            return  # a paused request, older than those read, goes first next iteration
        for (r, blocks), chunk in zip(new, chunks[len(contexts):]):
            if not chunk and self.max_utilization:
                break  # (none younger may start before it: the deviation under rule 6)
            if chunk and not self._admit(replica, r, chunk, blocks):
                break

    def _schedule_max_utilization(self, replica, capacity):
        """Rule 6: this step's blocks, not those to completion; the pool short, the most
        recently started requests younger than the one waiting are paused (recomputed)."""
        unit = min(replica.block_size, self.max_num_tokens)
        chunked = self.enable_chunked_context
        if chunked:
            for r in replica.prefilling:  # (their blocks were taken at their first chunk)
                if capacity <= 0:
                    return
                if r.status != PREFILL:  # paused for an older request's blocks
                    continue
                chunk = fcfs_chunk(r.prefill_target - r.num_computed, capacity, unit)
                if chunk and replica.schedule_chunk(r, chunk):
                    capacity -= chunk
        waiting, blocks = replica.waiting, replica.blocks
        bs = replica.block_size
        free = blocks.num_free - self._prompts_owed(replica)  # (the running prompts' first)
        first = True
        while waiting and capacity > 0:
            r = waiting[0]
            rest = r.prefill_target - replica.prefix_hit(r)
            if chunked:
                tokens = fcfs_chunk(rest, capacity, unit)
                if not tokens:
                    break
            elif rest > capacity and not (first and rest > self.max_num_tokens):
                break  # rule 3 (a re-prefill over max_num_tokens goes first: a deviation)
            else:
                tokens = rest
            # the whole prompt's blocks, at its first chunk; none to pause for it: every running
            # request started before it (the module docstring, rule 6)
            need = -(-rest // bs)
            if need > free or not replica.admit(r, tokens):
                break
            free -= need
            capacity -= tokens
            first = False

    @staticmethod
    def _prompts_owed(replica) -> int:
        """Rule 6: the blocks the running prompts still lack (their whole prompt's less those
        they hold): TensorRT-LLM takes a prompt's blocks at its first chunk, so what is free
        for a new prompt is what is left after them."""
        bs, held = replica.block_size, replica.held_blocks
        return sum(-(-r.prefill_target // bs) - held(r) for r in replica.prefilling
                   if r.status == PREFILL)

    def __repr__(self):
        return (f"TensorRTLLM(max_num_tokens={self.max_num_tokens}, "
                f"free_gpu_memory_fraction={self.free_gpu_memory_fraction}, "
                f"enable_chunked_context={self.enable_chunked_context}, "
                f"capacity_scheduler_policy={self.capacity_scheduler_policy!r})")
