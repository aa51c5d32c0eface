"""An iteration-level discrete-event LLM-serving simulator, and the cheat-sheet primitives.

Packages, in layer order (each may import only the ones before it; tests/test_layout.py):

- ``sim.checks``, ``sim.constants`` - argument checks; the cheat sheet's constants;
- ``sim.specs`` - model and GPU presets, memory budget, quantization;
- ``sim.cheatsheet`` - the cheat sheet's reference primitives;
- ``sim.costs`` - cost models (simple, roofline, calibrated), kernels, executor, kernel timing;
- ``sim.results`` - ``Result`` (metrics) and plots;
- ``sim.engine`` - the KV pools (``kv``), the replica and its loop (``core``), speculation,
  the engine presets, the fleet (routers, clusters, disaggregation), ``SimConfig``, ``run``;
- ``sim.tools`` - sweeps, calibration in the engine, validation;
- ``sim.cli`` - the ``sim`` command.

The names below are the public API; they stay importable from ``sim`` (each module is
imported when one of its names is first used).
"""

import importlib

from . import native

native.install()  # the compiled engine core where built and current (sim/native.py)

# public name -> the module that defines it; imported on first use (PEP 562), so that
# ``import sim`` and the ``sim`` command load only what they use (``sim run`` never loads the
# sweep, capacity, kernel or cheat-sheet modules)
_PUBLIC = {
    "PrefixCache": "cheatsheet.prefix_cache",
    **dict.fromkeys(("DraftModel", "SpeculativeResult", "expected_tokens_per_step",
                     "speculative_decode", "speculative_speedup"), "cheatsheet.speculative"),
    **dict.fromkeys(("BatchingResult", "simulate_continuous_batching",
                     "simulate_static_batching"), "cheatsheet.step_batching"),
    **dict.fromkeys(("CHUNK_SIZE", "KV_BLOCK_SIZE", "KV_BLOCKS_AVAILABLE"), "constants"),
    "CalibratedCost": "costs.calibrated",
    **dict.fromkeys(("KVCache", "paged_decode_attention", "scaled_dot_product_attention",
                     "softmax", "tiled_softmax_dot", "tiled_softmax_dot_batched"),
                    "costs.kernels"),
    "RooflineCost": "costs.roofline",
    "EngineOverheads": "costs.overheads",
    **dict.fromkeys(("ConstantCost", "LinearCost"), "costs.simple"),
    **dict.fromkeys(("POLICIES", "VLLM", "Batch", "ChunkedPrefill", "ContinuousBatching",
                     "Disaggregation", "Orca", "Sarathi", "SGLang", "SimConfig",
                     "SpeculativeConfig", "StaticBatching", "run", "RequestPath", "KVTier",
                     "KVTierChain", "offload_preset", "LoRAConfig"),
                    "engine"),
    "Result": "results.metrics",
    **dict.fromkeys(("GPU", "get_gpu", "gpu_presets"), "specs.gpus"),
    **dict.fromkeys(("MemoryBudget", "blocks_needed", "kv_cache_bytes", "memory_budget"),
                    "specs.memory"),
    **dict.fromkeys(("ModelConfig", "get_model", "model_presets"), "specs.models"),
    **dict.fromkeys(("dequantize", "quantize"), "specs.quantization"),
    **dict.fromkeys(("Capacity", "max_rate"), "tools.capacity"),
    "sweep": "tools.sweep",
    "plan": "tools.plan",
    "Autoscaler": "engine.fleet.autoscaler",
    "run_autoscaled": "tools.autoscale",
}


def __getattr__(name):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'sim' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next lookup finds it without this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


__version__ = "0.1.0"

__all__ = [
    "run", "SimConfig", "SpeculativeConfig", "Disaggregation", "RequestPath", "KVTier", "Result",
    "KVTierChain", "offload_preset", "LoRAConfig",
    "Batch", "sweep", "max_rate", "Capacity",
    "plan", "Autoscaler", "run_autoscaled",
    "ConstantCost", "LinearCost", "RooflineCost", "CalibratedCost", "EngineOverheads",
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
