"""An iteration-level discrete-event LLM-serving simulator, and the cheat-sheet primitives.

Packages, in layer order (each may import only the ones before it; tests/test_layout.py):

- ``sim.checks``, ``sim.constants`` - argument checks; the cheat sheet's constants;
- ``sim.specs`` - model and GPU presets, memory budget, quantization;
- ``sim.cheatsheet`` - the cheat sheet's reference primitives;
- ``sim.costs`` - cost models (simple, roofline, calibrated), kernels, executor, kernel timing;
- ``sim.results`` - ``Result`` (metrics) and plots;
- ``sim.engine`` - requests, KV blocks, batch snapshot, replica, policies, ``SimConfig``, ``run``;
- ``sim.tools`` - sweeps, calibration in the engine, validation;
- ``sim.cli`` - the ``sim`` command.

The names below are the public API; they stay importable from ``sim``.
"""

from .cheatsheet.prefix_cache import PrefixCache
from .cheatsheet.speculative import (DraftModel, SpeculativeResult, expected_tokens_per_step,
                                     speculative_decode, speculative_speedup)
from .cheatsheet.step_batching import (BatchingResult, simulate_continuous_batching,
                                       simulate_static_batching)
from .constants import CHUNK_SIZE, KV_BLOCK_SIZE, KV_BLOCKS_AVAILABLE
from .costs.calibrated import CalibratedCost
from .costs.kernels import (KVCache, paged_decode_attention, scaled_dot_product_attention,
                            softmax, tiled_softmax_dot, tiled_softmax_dot_batched)
from .costs.roofline import RooflineCost
from .costs.simple import ConstantCost, LinearCost
from .engine import (POLICIES, VLLM, Batch, ChunkedPrefill, ContinuousBatching, Disaggregation,
                     Orca, Sarathi, SGLang, SimConfig, SpeculativeConfig, StaticBatching,
                     run)
from .results.metrics import Result
from .specs.gpus import GPU, get_gpu, gpu_presets
from .specs.memory import MemoryBudget, blocks_needed, kv_cache_bytes, memory_budget
from .specs.models import ModelConfig, get_model, model_presets
from .specs.quantization import dequantize, quantize
from .tools.capacity import Capacity, max_rate
from .tools.sweep import sweep

__version__ = "0.1.0"

__all__ = [
    "run", "SimConfig", "SpeculativeConfig", "Disaggregation", "Result", "Batch", "sweep", "max_rate", "Capacity",
    "ConstantCost", "LinearCost", "RooflineCost", "CalibratedCost",
    "POLICIES", "StaticBatching", "ContinuousBatching", "ChunkedPrefill", "VLLM", "Sarathi",
    "Orca", "SGLang",
    "CHUNK_SIZE", "KV_BLOCK_SIZE", "KV_BLOCKS_AVAILABLE",
    "BatchingResult", "simulate_continuous_batching", "simulate_static_batching",
    "GPU", "get_gpu", "gpu_presets",
    "KVCache", "scaled_dot_product_attention", "softmax", "tiled_softmax_dot",
    "tiled_softmax_dot_batched", "paged_decode_attention",
    "MemoryBudget", "blocks_needed", "kv_cache_bytes", "memory_budget",
    "ModelConfig", "get_model", "model_presets",
    "PrefixCache", "dequantize", "quantize",
    "DraftModel", "SpeculativeResult", "expected_tokens_per_step", "speculative_decode",
    "speculative_speedup",
]
