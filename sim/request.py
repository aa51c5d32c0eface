"""A request's state as the engine sees it.

State machine: WAITING -> PREFILL (admitted; prompt chunks run) -> DECODE (first token emitted)
-> FINISHED; a preempted request (PREFILL or DECODE) goes back to WAITING at the head of the
queue and later re-prefills its prompt plus the tokens it had generated (recompute). A request
that can never fit in the KV pool is REJECTED at arrival. Every request ends FINISHED or
REJECTED, exactly once.

Decode progress is *lazy*: a request in DECODE stores the iteration ``decode_start`` at which it
emitted a token with ``num_cached`` tokens in its KV cache and ``gen_base`` tokens generated; at
iteration ``i`` it has ``num_cached + (i - decode_start)`` cached tokens and
``gen_base + (i - decode_start)`` output tokens, so nothing is touched per token.
"""

from __future__ import annotations

WAITING, PREFILL, DECODE, FINISHED, REJECTED = range(5)
STATUS_NAMES = ("waiting", "prefill", "decode", "finished", "rejected")


class Request:
    __slots__ = (
        "index", "request_id", "arrival_time", "num_prompt_tokens", "num_output_tokens",
        "status", "num_generated", "num_computed", "prefill_target", "num_cached",
        "gen_base", "decode_start", "phase", "finish_iter", "num_preemptions",
        "first_scheduled_time", "first_token_time", "finish_time", "reason", "segments",
        "prefix_hashes",
    )

    def __init__(self, index, request_id, arrival_time, num_prompt_tokens, num_output_tokens,
                 prefix_hashes=None):
        self.index = index
        self.request_id = request_id
        self.arrival_time = arrival_time
        self.num_prompt_tokens = num_prompt_tokens
        self.num_output_tokens = num_output_tokens
        self.status = WAITING
        self.num_generated = 0  # valid outside DECODE
        self.num_computed = 0  # prompt tokens whose KV is in the cache (prefill progress)
        self.prefill_target = num_prompt_tokens  # prompt (+ generated, after a preemption)
        self.num_cached = 0
        self.gen_base = 0
        self.decode_start = -1
        self.phase = -1
        self.finish_iter = -1
        self.num_preemptions = 0
        self.first_scheduled_time = None
        self.first_token_time = None
        self.finish_time = None
        self.reason = ""
        self.segments = []  # (first, last) iterations of each run of consecutive tokens
        self.prefix_hashes = prefix_hashes

    def __repr__(self):
        return (f"Request({self.request_id!r}, {STATUS_NAMES[self.status]}, "
                f"prompt={self.num_prompt_tokens}, output={self.num_output_tokens})")
