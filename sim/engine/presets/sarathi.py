"""The Sarathi-Serve preset (:class:`Sarathi`): stall-free batching, chunked prefills under a
token budget with decodes first (Vidur's ``SarathiReplicaScheduler``); rules and deviations in
its docstring, each rule tested in tests/test_presets.py."""

from __future__ import annotations

from ..core.policies import ChunkedPrefill


class Sarathi(ChunkedPrefill):
    """Sarathi-Serve (Agrawal et al., OSDI'24; Vidur's ``SarathiReplicaScheduler``):
    stall-free batching.

    Rules:
    1. token budget ``chunk_size`` (default ``CHUNK_SIZE`` = 512) per iteration, decodes first
       (one token each), then the partial prefill(s), then new prompts chunked to fit;
    2. a new prompt is admitted only when blocks for its whole prompt plus a watermark (1 % of
       the pool) are free;
    3. ``max_batch_size`` 128 (Vidur's ``batch_size_cap``), block size 16, no prefix caching;
    4. under block pressure the newest running request is preempted by recompute.

    Deviations: Vidur takes the whole prompt's blocks at admission; here the admission check is
    the same but blocks are taken chunk by chunk, so growing decodes may use the rest meanwhile;
    Vidur also preempts when no block is free even for decodes not crossing into a new block;
    ``gpu_memory_utilization`` is vLLM's 0.9 (Vidur's replica default is 0.8).
    """

    name = "sarathi"

    @classmethod
    def engine_defaults(cls, config) -> dict:
        return {"max_batch_size": 128, "block_size": 16, "gpu_memory_utilization": 0.9,
                "prefix_caching": False}

    def __repr__(self):
        return f"Sarathi(chunk_size={self.chunk_size})"
