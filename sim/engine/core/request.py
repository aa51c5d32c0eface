"""A request's state as the engine sees it.

State machine::

    WAITING ──admit──► PREFILL ──last prompt chunk──► DECODE ──last token──► FINISHED
       ▲                  │                             │
       └──── preempt ─────┴─────────────────────────────┘      (arrival) ──► REJECTED

- WAITING: queued at the replica. A request enters once at arrival; a preempted one returns at
  the head of the queue and later re-prefills its prompt plus the tokens it had generated
  (recompute preemption), so ``prefill_target = num_prompt_tokens + num_generated``.
- PREFILL: admitted (holds a batch slot and the KV blocks of its ``num_computed`` tokens);
  prompt chunks run until ``num_computed == prefill_target``. The iteration that completes the
  prefill emits a token (vLLM's convention).
- DECODE: emits tokens lazily - see :mod:`sim.engine.core.decoding`, the one module that knows how
  many tokens an iteration emits; the ``decode_*`` fields below are its bookkeeping.
- FINISHED / REJECTED: terminal. Every request reaches exactly one of them exactly once;
  ``reason`` says why a request was rejected (one that could never fit in the KV pool).

``segments`` lists the ``(first, last)`` iterations of each run of consecutive iterations in
which the request emitted tokens; token times (TTFT, ITL) are derived from them and the
iteration end times, never stored per token.
"""

from __future__ import annotations

WAITING, PREFILL, DECODE, FINISHED, REJECTED = range(5)
STATUS_NAMES = ("waiting", "prefill", "decode", "finished", "rejected")


class Request:
    """One request. Plain slots (hot record); the replica and the decode tracker own the
    mutations, policies only read."""

    __slots__ = (
        "index", "request_id", "arrival_time", "num_prompt_tokens", "num_output_tokens",
        "status", "num_generated", "num_computed", "prefill_target",
        "decode_base_tokens", "decode_base_generated", "decode_start", "block_phase",
        "finish_iteration", "scheduled_iteration", "num_preemptions", "num_prefill_computed",
        "num_cached_tokens", "block_keys", "output_keys", "kv_keys", "first_scheduled_time",
        "first_token_time", "finish_time", "reason", "segments", "acceptance_rate", "spec_plan", "spec_steps",
        "spec_accepted", "spec_overshoot", "paused_first", "tree_tokens",
        "num_offload_tokens", "load_time", "lora_id",
    )

    def __init__(self, index, request_id, arrival_time, num_prompt_tokens, num_output_tokens):
        self.index = index  # position in the workload: the request's key everywhere
        self.request_id = request_id
        self.arrival_time = arrival_time
        self.num_prompt_tokens = num_prompt_tokens
        self.num_output_tokens = num_output_tokens
        self.status = WAITING
        self.num_generated = 0  # output tokens emitted (valid outside DECODE)
        self.num_computed = 0  # tokens whose KV is in the cache (prefill progress)
        self.prefill_target = num_prompt_tokens  # prompt (+ generated, after a preemption)
        # lazy decode bookkeeping (sim.engine.core.decoding): KV tokens and tokens generated at
        # iteration decode_start, the iteration phase at which it crosses into a new KV
        # block, and the iteration emitting its last token
        self.decode_base_tokens = 0
        self.decode_base_generated = 0
        self.decode_start = -1
        self.block_phase = -1
        self.finish_iteration = -1
        self.scheduled_iteration = -1  # the last iteration that gave it prefill work
        self.num_preemptions = 0
        self.num_prefill_computed = 0  # prefill tokens computed, recomputation included
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache at admission
        self.num_offload_tokens = 0  # ... of which loaded from an offload tier (kv.offload)
        self.lora_id = None  # its LoRA adapter (kv.lora), None: the base model
        self.load_time = 0.0  # seconds it waited for offloaded blocks to load, in all
        # prefix caching (sim.engine.kv.blocks, sim.engine.kv.radix): the keys of its full prompt
        # blocks, or in radix mode of its hash ids' prefixes (None: no token identity, never
        # hits); the cached blocks (radix: tree nodes) it holds references on; radix mode: its
        # leading tokens those nodes cover
        self.block_keys = None
        # the keys its answer's full blocks are cached under when it finishes (its
        # conversation's next turn names them: workloads.prefix.answer_block_keys, radix mode
        # answer_unit_keys); None: its answer is not cached
        self.output_keys = None
        self.kv_keys = ()
        self.tree_tokens = 0
        self.first_scheduled_time = None
        self.first_token_time = None
        self.finish_time = None
        self.reason = ""
        self.segments = []
        self.paused_first = -1  # the prefill-only iteration of its first token (SGLang), or -1
        # speculative decoding (sim.engine.speculation): the request's own acceptance rate
        # (None: the run's), its drawn plan while decoding, verifications and accepted drafts
        self.acceptance_rate = None
        self.spec_plan = None
        self.spec_steps = 0
        self.spec_accepted = 0
        self.spec_overshoot = 0  # accepted drafts beyond its last token (vLLM counts them)

    @property
    def is_finished(self) -> bool:
        return self.status == FINISHED or self.status == REJECTED

    def __repr__(self):
        return (f"Request({self.request_id!r}, {STATUS_NAMES[self.status]}, "
                f"prompt={self.num_prompt_tokens}, output={self.num_output_tokens})")
