"""``SimConfig``: everything a run needs besides the workload, in one frozen dataclass.

Flat knobs (what users sweep and write in TOML). A knob left ``None`` takes the scheduler's
default (:mod:`sim.engine.policies`: a preset brings its engine's defaults; the simple policies
bring ``ENGINE_DEFAULTS``); an explicit knob always wins. Policy knobs (``chunk_size``,
``token_budget``) are validated by the policy, and one set for a policy that does not use it is
an error, never silently ignored. :meth:`SimConfig.resolved` gives the config with every knob
filled in - the one a run uses and its ``Result`` records. ``kv_blocks=None``: derived from
``memory_budget(model, gpu)`` when either is given (the other taking its default), else the
cheat sheet's ``KV_BLOCKS_AVAILABLE``. ``cost_model=None``: the roofline model of ``model`` on ``gpu``
(defaults ``"llama-3.1-8b"`` on ``"h100"``). ``replicas`` > 1: a cluster of identical
replicas (each of ``tensor_parallel`` GPUs, with the knobs above) behind ``router``
(:mod:`sim.engine.routers`, :mod:`sim.engine.cluster`). Use ``dataclasses.replace`` for
variants; the config is validated when built.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import fraction, positive_int
from ..constants import KV_BLOCKS_AVAILABLE
from .disaggregation import Disaggregation
from .policies import PREFIX_CACHING_MODES
from .routers import check_router
from .schedulers import resolve

DEFAULT_MODEL, DEFAULT_GPU = "llama-3.1-8b", "h100"  # for the roofline and the memory budget


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Settings of one run; see the module docstring for the defaults."""

    scheduler: object = "chunked"
    cost_model: object = None
    max_batch_size: int | None = None
    chunk_size: int | None = None
    token_budget: int | None = None
    kv_blocks: int | None = None
    block_size: int | None = None
    prefix_caching: object = None  # False ("off") | "block" (vLLM v1's block-hash cache)
    model: object = None
    gpu: object = None
    gpu_memory_utilization: float | None = None
    tensor_parallel: int = 1
    replicas: int = 1  # a cluster: replicas behind `router` (sim.engine.cluster)
    router: object = "round_robin"  # a name in sim.engine.routers.ROUTERS or a callable
    disaggregation: object = None  # sim.engine.disaggregation.Disaggregation: two pools
    closed_loop: object = None  # workloads.ClosedLoop: issue on completions, not arrival_time
    seed: int = 0  # recorded in the Result; the engine has no randomness of its own yet
    progress: bool = False

    def __post_init__(self):
        positive_int("tensor_parallel", self.tensor_parallel)
        positive_int("replicas", self.replicas)
        check_router(self.router)
        if self.disaggregation is not None:
            if not isinstance(self.disaggregation, Disaggregation):
                raise TypeError(f"disaggregation must be a sim.Disaggregation, got "
                                f"{self.disaggregation!r}")
            if self.replicas != 1:
                raise ValueError(f"replicas={self.replicas} with disaggregation: give the "
                                 f"pools' sizes, Disaggregation(prefill_replicas, "
                                 f"decode_replicas)")
        positive_int("seed", self.seed, allow_zero=True)
        for knob in ("max_batch_size", "block_size", "chunk_size", "token_budget", "kv_blocks"):
            if getattr(self, knob) is not None:
                positive_int(knob, getattr(self, knob))
        if self.gpu_memory_utilization is not None:
            fraction("gpu_memory_utilization", self.gpu_memory_utilization)
        if self.prefix_caching in ("off", "none", 0):  # the CLI's and TOML's spelling of False
            object.__setattr__(self, "prefix_caching", False)
        if self.prefix_caching == "radix":
            raise ValueError("prefix_caching='radix' (SGLang's radix cache) is not built yet; "
                             "use 'block' (vLLM's rules) or False")
        if self.prefix_caching is not None and self.prefix_caching not in PREFIX_CACHING_MODES:
            raise ValueError(f"prefix_caching must be one of {PREFIX_CACHING_MODES} or 'off', "
                             f"got {self.prefix_caching!r}")
        resolve(self)  # the policy validates the knobs it uses
        if self.closed_loop is not None and not (hasattr(self.closed_loop, "num_users")
                                                 and hasattr(self.closed_loop, "think_time")):
            raise TypeError(f"closed_loop must be a workloads.ClosedLoop, got {self.closed_loop!r}")
        if self.cost_model is not None and not callable(self.cost_model):
            raise TypeError(f"cost_model must be callable(batch) -> seconds, got "
                            f"{self.cost_model!r}")

    def resolved_model(self):
        return self.model or DEFAULT_MODEL

    def resolved_gpu(self):
        return self.gpu or DEFAULT_GPU

    def fleet(self) -> tuple:
        """``(replicas, GPUs)`` of the run: ``replicas x tensor_parallel``, or both pools'."""
        if self.disaggregation is not None:
            return self.disaggregation.fleet(self)
        return self.replicas, self.replicas * self.tensor_parallel

    def policy(self):
        """The batching policy object (built anew from a name; a given object as is)."""
        return resolve(self)[1]

    def resolved(self) -> "SimConfig":
        """This config with every knob left ``None`` filled in by the scheduler's defaults."""
        return resolve(self)[0]

    def resolved_kv_blocks(self) -> int:
        if self.kv_blocks is not None:
            return self.kv_blocks
        if self.block_size is None or self.gpu_memory_utilization is None:
            return self.resolved().resolved_kv_blocks()
        if self.model is not None or self.gpu is not None:  # the other takes its default
            from ..specs.gpus import get_gpu
            from ..specs.memory import memory_budget
            model, gpu = self.model or DEFAULT_MODEL, self.gpu or DEFAULT_GPU
            budget = memory_budget(model, get_gpu(gpu).memory_gb,
                                   tensor_parallel=self.tensor_parallel,
                                   gpu_memory_utilization=self.gpu_memory_utilization,
                                   block_size=self.block_size)
            if not budget.fits:
                raise ValueError(f"model {model!r} on gpu {gpu!r}: {budget.advice}")
            return budget.kv_blocks
        return KV_BLOCKS_AVAILABLE

    def resolved_cost_model(self):
        if self.cost_model is not None:
            return self.cost_model
        from ..costs.roofline import RooflineCost
        return RooflineCost(self.model or DEFAULT_MODEL, self.gpu or DEFAULT_GPU,
                            tensor_parallel=self.tensor_parallel)
