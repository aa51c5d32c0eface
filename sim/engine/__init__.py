"""The engine: the SimPy process, the replica and its KV pool, requests, policies, the fleet.

Sub-packages, in layer order (each may import only those before it; tests/test_layout.py):

- ``kv`` - the KV pools: blocks, the block-hash prefix cache, the radix tree, prefix hits;
- ``core`` - requests, the replica and its iteration loop (the SimPy process), decoding,
  the batch snapshot, the policy contract, events, records, fast-forward, invariants;
- ``speculation`` - speculative decoding's settings, acceptance draws and draft price;
  ``presets`` - vLLM, Sarathi, Orca, SGLang, TensorRT-LLM rule by rule; ``bands`` (module) -
  error bands, the runs at the cost model's measured error; ``engine_overheads`` (module) -
  the setting of the engine's time outside the roofline (all on ``core``, independent of
  each other);
- ``schedulers`` (module) - the table of scheduler names and knob resolution;
- ``fleet`` - routers, clusters, disaggregated pools, closed-loop clients, the request path;
- ``config`` (module) - ``SimConfig``, every knob of a run;
- ``simulation`` (module) - ``run(workload, config) -> Result``.

May import: ``sim.checks``, ``sim.constants``, ``sim.specs``, ``sim.costs`` (the default
roofline), ``sim.results`` (the ``Result`` it returns) and ``workloads`` (validation). Never
plotting, the CLI, the tools, Dask, or anything that writes files.
"""

import importlib

# public name -> its module, imported on first use (PEP 562): the CLI's parser reads the
# scheduler and router names without loading the simulation (pandas, SimPy) for ``--help``
_PUBLIC = {"Batch": "core.batch", "SimConfig": "config", "Disaggregation": "fleet.disaggregation",
           "ChunkedPrefill": "core.policies", "ContinuousBatching": "core.policies",
           "StaticBatching": "core.policies", "VLLM": "presets.vllm", "Orca": "presets.orca",
           "Sarathi": "presets.sarathi", "SGLang": "presets.sglang", "POLICIES": "schedulers",
           "run": "simulation", "SpeculativeConfig": "speculation.settings", "KVTier": "kv.offload",
           "KVTierChain": "kv.tiers", "offload_preset": "presets.offload",
           "RequestPath": "fleet.request_path", "LoRAConfig": "kv.lora"}


def __getattr__(name):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = ["run", "SimConfig", "Disaggregation", "Batch", "POLICIES", "StaticBatching",
           "ContinuousBatching", "ChunkedPrefill", "VLLM", "Sarathi", "Orca", "SGLang",
           "SpeculativeConfig", "RequestPath", "KVTier", "KVTierChain", "offload_preset",
           "LoRAConfig"]
