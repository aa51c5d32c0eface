"""An iteration-level discrete-event LLM-serving simulator, and the cheat-sheet primitives."""

from .batching import BatchingResult, simulate_continuous_batching, simulate_static_batching
from .constants import CHUNK_SIZE, KV_BLOCK_SIZE, KV_BLOCKS_AVAILABLE
from .gpus import GPU, get_gpu, gpu_presets
from .kernels import KVCache, scaled_dot_product_attention, softmax, tiled_softmax_dot
from .memory import MemoryBudget, blocks_needed, kv_cache_bytes, memory_budget
from .models import ModelConfig, get_model, model_presets
from .prefix_cache import PrefixCache
from .quantization import dequantize, quantize
from .speculative import (DraftModel, SpeculativeResult, expected_tokens_per_step,
                          speculative_decode, speculative_speedup)

__version__ = "0.1.0"

__all__ = [
    "CHUNK_SIZE", "KV_BLOCK_SIZE", "KV_BLOCKS_AVAILABLE",
    "BatchingResult", "simulate_continuous_batching", "simulate_static_batching",
    "GPU", "get_gpu", "gpu_presets",
    "KVCache", "scaled_dot_product_attention", "softmax", "tiled_softmax_dot",
    "MemoryBudget", "blocks_needed", "kv_cache_bytes", "memory_budget",
    "ModelConfig", "get_model", "model_presets",
    "PrefixCache", "dequantize", "quantize",
    "DraftModel", "SpeculativeResult", "expected_tokens_per_step", "speculative_decode",
    "speculative_speedup",
]
