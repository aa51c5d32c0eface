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
``simulation`` (``run``).

May import: ``sim.checks``, ``sim.constants``, ``sim.specs``, ``sim.costs`` (the default
roofline), ``sim.results`` (the ``Result`` it returns) and ``workloads`` (validation). Never
plotting, the CLI, the tools, Dask, or anything that writes files.
"""

from .batch import Batch
from .config import SimConfig
from .disaggregation import Disaggregation
from .policies import ChunkedPrefill, ContinuousBatching, StaticBatching
from .presets import VLLM, Orca, Sarathi
from .sglang import SGLang
from .schedulers import POLICIES
from .simulation import run
from .speculation import SpeculativeConfig

__all__ = ["run", "SimConfig", "Disaggregation", "Batch", "POLICIES", "StaticBatching",
           "ContinuousBatching", "ChunkedPrefill", "VLLM", "Sarathi", "Orca", "SGLang",
           "SpeculativeConfig"]
