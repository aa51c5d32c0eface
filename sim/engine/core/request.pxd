# The compiled layout of sim/engine/core/request.py's Request (sim/native.py): the same
# attributes as its __slots__, the integer ones as C 64-bit integers (token counts, iteration
# indices, statuses), the times as C doubles, the rest Python objects.
cdef class Request:
    cdef public long long index, num_prompt_tokens, num_output_tokens, status
    cdef public long long num_generated, num_computed, prefill_target
    cdef public long long decode_base_tokens, decode_base_generated, decode_start, block_phase
    cdef public long long finish_iteration, scheduled_iteration, num_preemptions
    cdef public long long num_prefill_computed, num_cached_tokens, num_offload_tokens
    cdef public long long spec_steps, spec_accepted, spec_overshoot, paused_first, tree_tokens
    cdef public double arrival_time, load_time
    cdef public object request_id, block_keys, output_keys, kv_keys, first_scheduled_time
    cdef public object first_token_time, finish_time, reason, segments, acceptance_rate
    cdef public object spec_plan, lora_id
