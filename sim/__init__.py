"""An iteration-level discrete-event LLM-serving simulator, and the cheat-sheet primitives."""

from .batching import BatchingResult, simulate_continuous_batching, simulate_static_batching
from .calibrated import CalibratedCost
from .constants import CHUNK_SIZE, KV_BLOCK_SIZE, KV_BLOCKS_AVAILABLE
from .costs import ConstantCost, LinearCost
from .engine import SimConfig, run
from .gpus import GPU, get_gpu, gpu_presets
from .kernels import (KVCache, paged_decode_attention, scaled_dot_product_attention, softmax,
                      tiled_softmax_dot, tiled_softmax_dot_batched)
from .memory import MemoryBudget, blocks_needed, kv_cache_bytes, memory_budget
from .metrics import Result
from .models import ModelConfig, get_model, model_presets
from .prefix_cache import PrefixCache
from .quantization import dequantize, quantize
from .roofline import RooflineCost
from .schedulers import ChunkedPrefill, ContinuousBatching, StaticBatching
from .speculative import (DraftModel, SpeculativeResult, expected_tokens_per_step,
                          speculative_decode, speculative_speedup)

__version__ = "0.1.0"

__all__ = [
    "run", "SimConfig", "Result",
    "ConstantCost", "LinearCost", "RooflineCost", "CalibratedCost",
    "StaticBatching", "ContinuousBatching", "ChunkedPrefill",
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
