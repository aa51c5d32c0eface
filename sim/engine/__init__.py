"""The engine core: the SimPy process, the replica and its KV pool, requests and policies.

Modules: ``request`` (the request state machine), ``decoding`` (how many tokens an iteration
emits: the lazy decode bookkeeping and ITL from token runs), ``blocks`` (the KV block pool, the
one owner of KV accounting), ``batch`` (the immutable snapshot a cost model prices),
``replica`` (queue, running set and the verbs policies act through), ``policies`` (the policy
contract and our simple policies), ``presets`` (vLLM, Sarathi, Orca rule by rule),
``sglang`` (SGLang's scheduler: prefill-only iterations on the decode clock),
``schedulers`` (the table of names and knob resolution), ``speculation`` (speculative decoding:
settings, acceptance draws, the draft's cost), ``config`` (``SimConfig``), ``records`` (results
columns), ``routers`` (which replica serves a request), ``clients`` (closed-loop users),
``cluster`` (replicas behind a router),
``disaggregation`` (prefill and decode pools joined by KV-transfer links),
``request_path`` (the client's time outside the engine: front end, tokeniser),
``events`` (the SimPy environment and the engine's pre-made events, in SimPy's order),
``simulation`` (``run``).

May import: ``sim.checks``, ``sim.constants``, ``sim.specs``, ``sim.costs`` (the default
roofline), ``sim.results`` (the ``Result`` it returns) and ``workloads`` (validation). Never
plotting, the CLI, the tools, Dask, or anything that writes files.
"""

import importlib

# public name -> its module, imported on first use (PEP 562): the CLI's parser reads the
# scheduler and router names without loading the simulation (pandas, SimPy) for ``--help``
_PUBLIC = {"Batch": "batch", "SimConfig": "config", "Disaggregation": "disaggregation",
           "ChunkedPrefill": "policies", "ContinuousBatching": "policies",
           "StaticBatching": "policies", "VLLM": "presets", "Orca": "presets",
           "Sarathi": "presets", "SGLang": "sglang", "POLICIES": "schedulers",
           "run": "simulation", "SpeculativeConfig": "speculation",
           "RequestPath": "request_path"}


def __getattr__(name):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
    globals()[name] = value
    return value


__all__ = ["run", "SimConfig", "Disaggregation", "Batch", "POLICIES", "StaticBatching",
           "ContinuousBatching", "ChunkedPrefill", "VLLM", "Sarathi", "Orca", "SGLang",
           "SpeculativeConfig", "RequestPath"]
