"""TensorRT-LLM's chunked context: how the contexts of an iteration share what the decodes leave
of ``max_num_tokens`` (rule 4 of :mod:`sim.engine.presets.tensorrt_llm`).

Source: NVIDIA/TensorRT-LLM ``cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp``
``setCtxRequestsChunkSize`` @ 0a949d3128bfaf4ddedefb0259125622a9ec830f; the unit is the KV
block (``chunkUnitSize = tokensPerBlock``, ``trtGptModelInflightBatching.cpp`` @
b35ac1b64368513d215c57d2ed01d62d910df8da), FIRST_COME_FIRST_SERVED when no policy is set.

Invariants (tests/test_tensorrt_llm_chunking.py): the chunks sum to at most the capacity; each
is at most its context's rest; every context gets all of its rest when the rests fit the
capacity; a chunk short of its rest is a multiple of the unit.
"""

from __future__ import annotations

# ContextChunkingPolicy's values (the LLM API's SchedulerConfig), the first the default
CONTEXT_CHUNKING_POLICIES = ("first_come_first_served", "equal_progress")


def fcfs_chunk(rest: int, capacity: int, unit: int) -> int:
    """Rule 4, FIRST_COME_FIRST_SERVED: the tokens a context with ``rest`` prompt tokens left
    gets of ``capacity``: all of them if they fit, else ``capacity`` rounded down to a
    multiple of ``unit`` (``setCtxRequestsChunkSize<kFIRST_COME_FIRST_SERVED>``)."""
    if rest <= capacity:
        return rest
    return capacity // unit * unit if capacity > 0 else 0


def equal_progress_chunks(rests, capacity: int, unit: int) -> list:
    """Rule 4, EQUAL_PROGRESS: the tokens each context (``rests``: prompt tokens left, in
    order) gets of ``capacity``: all if they all fit, else ``unit`` more to each in turn,
    round after round (a context's last step only what it has left), skipping a step that
    would overflow, until a round adds nothing (``setCtxRequestsChunkSize<kEQUAL_PROGRESS>``)."""
    if sum(rests) <= capacity:
        return list(rests)
    chunks, total, added = [0] * len(rests), 0, True
    while total < capacity and added:
        added = False
        for i, rest in enumerate(rests):
            step = min(chunks[i] + unit, rest) - chunks[i]
            if step and total + step <= capacity:
                chunks[i] += step
                total += step
                added = True
    return chunks
