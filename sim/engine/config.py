"""``SimConfig``: everything a run needs besides the workload, in one frozen dataclass.

Flat knobs (what users sweep and write in TOML). A knob left ``None`` takes the scheduler's
default (:mod:`sim.engine.core.policies`: a preset brings its engine's defaults; the simple policies
bring ``ENGINE_DEFAULTS``); an explicit knob always wins. Policy knobs (``chunk_size``,
``token_budget``; the tensorrt-llm preset's ``free_gpu_memory_fraction``,
``enable_chunked_context``, ``capacity_scheduler_policy`` and ``context_chunking_policy``) are
validated by the policy, and one set for a policy that does not use it is an error, never
silently ignored (``free_gpu_memory_fraction`` with a scheduler whose memory accounting does
not read it: ``sim.specs.memory.READ_BY``). :meth:`SimConfig.resolved` gives the config with
every knob filled in - the one a run uses and its ``Result`` records. ``kv_blocks=None``:
derived from ``memory_budget(model, gpu)`` (the defaults ``llama-3.1-8b`` on ``h100`` where not
given, as ``sim run`` does: one default for the Python API and the CLI), except where no model
or GPU is in play: a user ``cost_model`` with no ``model``, ``gpu``, ``tensor_parallel`` > 1,
precision other than 2 bytes, draft model or memory fraction (``gpu_memory_utilization``,
``free_gpu_memory_fraction``) gets the cheat sheet's ``KV_BLOCKS_AVAILABLE`` blocks of 16 tokens
(as many tokens at another ``block_size``; :meth:`SimConfig.pool_from_budget`), and its summary
says so (``kv_pool``: ``"cheat sheet"``); its resolved config fills no fraction in (none is
read). ``kv_tokens``: the pool in tokens instead (``kv_tokens // block_size`` blocks), to compare
presets of different block sizes (16; sglang's 1; tensorrt-llm's 32) on the same memory. One way
to size the pool: ``kv_blocks``, ``kv_tokens`` and a memory fraction exclude each other (a given
pool would leave a fraction unread; its resolved config fills none in either).
``cost_model=None``: the roofline model of ``model`` on ``gpu`` (defaults ``"llama-3.1-8b"`` on
``"h100"``).

Precision, from this one place: ``weight_dtype`` and ``kv_dtype`` size the weights, the KV pool
and the largest batch (``memory_budget``) and set the default cost model's bytes moved and
peak (the fp8 peak where the GPU has one). A model that does not fit is an error carrying the
budget's advice (quantize, or add GPUs). A speculative ``draft_model`` shares the GPUs: its
weights come off the budget and each KV block also holds its KV (as vLLM allocates them).
``replicas`` > 1: a cluster of identical replicas (each of :meth:`SimConfig.replica_gpus` GPUs,
with the knobs above) behind ``router`` (:mod:`sim.engine.fleet.routers`,
:mod:`sim.engine.fleet.cluster`). Use ``dataclasses.replace`` for variants; the config is
validated when built.

``usd_per_gpu_hour``, ``gpu_idle_watts``, ``gpu_max_watts``: the price and power terms of the
summary's dollars and joules (:mod:`sim.results.economics`); ``None`` takes the GPU's sourced
ones (:mod:`sim.specs.economics`); they change no timing.

``max_model_len`` (vLLM's ``--max-model-len``, SGLang's ``context_length``): the prompt +
output tokens a request may hold; ``None`` takes the model's context length
(``max_position_embeddings`` of ``model``, or of ``llama-3.1-8b`` when no model is given; no
limit when the model's config does not say). A request over it is rejected at arrival
(:mod:`sim.engine.simulation`). A limit above the model's is an error, as vLLM refuses it
(vllm-project/vllm@18ec6629, vllm/config/model.py, ``_get_and_verify_max_len``: only with
``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``, for a rope-scaled model): give such a model as a config
with its larger ``max_position_embeddings``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import fraction, positive_float, positive_int
from ..constants import KV_BLOCK_SIZE, KV_BLOCKS_AVAILABLE
from ..specs.economics import check_power
from ..specs.memory_terms import check_free_gpu_memory_fraction, check_tensor_parallel
from ..specs.replica_layout import replica_gpus
from .bands import check_bands
from .core.policies import PREFIX_CACHING_MODES
from .engine_overheads import check_engine_overheads, summary_keys
from .fleet.disaggregation import Disaggregation
from .kv.lora import LoRAConfig
from .kv.offload import KVTier
from .kv.tiers import KVTierChain
from .fleet.routers import check_router
from .pool_budget import DEFAULT_GPU, DEFAULT_MODEL, budget_kv_blocks
from .schedulers import POLICIES, POOL_SIZING, naming_unknown_fields, resolve
from .speculation.draft_cost import DraftCost
from .speculation.settings import SpeculativeConfig

WEIGHT_DTYPES = ("fp16", "bf16", "fp8", "int8", "int4", "fp4", "nvfp4", "mxfp4")
KV_DTYPES = ("fp16", "bf16", "fp8")
_TWO_BYTES = ("fp16", "bf16")  # the cheat sheet's pool (KV_BLOCKS_AVAILABLE) is sized for these


@naming_unknown_fields
@dataclass(frozen=True, slots=True)
class SimConfig:
    """Settings of one run; see the module docstring for the defaults."""
    # (seed: the engine's own draws only; a seed with none to take it warns, draws_at_random)

    scheduler: object = "chunked"
    cost_model: object = None
    max_batch_size: int | None = None
    chunk_size: int | None = None
    token_budget: int | None = None
    free_gpu_memory_fraction: float | None = None  # TensorRT-LLM's KV share (its accounting)
    enable_chunked_context: bool | None = None  # TensorRT-LLM's chunked context (tensorrt-llm)
    capacity_scheduler_policy: str | None = None  # TensorRT-LLM's: "guaranteed_no_evict" ...
    context_chunking_policy: str | None = None  # ... and "first_come_first_served" ...
    kv_blocks: int | None = None
    kv_tokens: int | None = None  # the pool in tokens: kv_tokens // block_size blocks
    block_size: int | None = None
    max_model_len: int | None = None  # prompt + output tokens per request; None: the model's
    prefix_caching: object = None  # False ("off") | "block" (vLLM v1) | "radix" (SGLang)
    model: object = None
    gpu: object = None
    gpu_memory_utilization: float | None = None
    tensor_parallel: int = 1
    expert_parallel: int = 1  # a MoE model's experts over the TP GPUs (costs.expert_parallel)
    expert_skew: float = 0.0  # expert routing's Zipf exponent under expert parallelism
    attention_dp: int = 1  # data-parallel attention ranks under EP (costs.dp_attention)
    expert_weight_dtype: str | None = None  # routed experts' own; "checkpoint": the model's
    weight_dtype: str = "fp16"
    kv_dtype: str = "fp16"
    speculative: object = None  # sim.SpeculativeConfig: draft k tokens, verify, accept some
    kv_offload: object = None  # sim.KVTier / KVTierChain: tiers under the prefix cache
    lora: object = None  # sim.LoRAConfig: LoRA adapters' slots, loads, GEMM cost (kv.lora)
    replicas: int = 1  # a cluster: replicas behind `router` (sim.engine.fleet.cluster)
    router: object = "round_robin"  # a name in sim.engine.fleet.routers.ROUTERS or a callable
    disaggregation: object = None  # sim.engine.fleet.disaggregation.Disaggregation: two pools
    closed_loop: object = None  # workloads.ClosedLoop: issue on completions, not arrival_time
    request_path: object = None  # sim.RequestPath: time outside the engine (request_path.py)
    usd_per_gpu_hour: float | None = None  # None: the GPU's sourced price (sim.specs.economics)
    gpu_idle_watts: float | None = None  # None: the GPU's power terms (sim.specs.economics)
    gpu_max_watts: float | None = None
    seed: int = 0  # seeds the engine's own draws (speculative acceptance); in the Result
    progress: bool = False
    check: bool = False  # check the engine's invariants every iteration (core.invariants)
    bands: float | None = None  # run(..., bands=0.9): the error band's runs (sim.engine.bands)
    engine_overheads: object = "none"  # "fitted" | EngineOverheads (sim.engine.engine_overheads)

    def __post_init__(self):
        object.__setattr__(self, "bands", check_bands(self.bands))
        for flag in ("progress", "check"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        for knob in ("tensor_parallel", "replicas"):  # stored as ints (2.0 -> 2)
            object.__setattr__(self, knob, positive_int(knob, getattr(self, knob)))
        for name in ("model", "gpu"):  # '' would silently be the default ('x or DEFAULT')
            if isinstance(value := getattr(self, name), str) and not value.strip():
                raise ValueError(f"{name} must be a preset name, got {value!r} (leave it out "
                                 f"for the default)")
        from ..specs import gpus, models  # a misspelt GPU fails here, not in the run
        gpu = gpus.get_gpu(self.resolved_gpu()) if isinstance(self.gpu, str) else self.gpu
        if self.tensor_parallel > 1 and not callable(self.model):  # the model's heads and the
            check_tensor_parallel(models.get_model(self.resolved_model()), self.tensor_parallel)
            gpus.check_scaleup_domain(gpu or DEFAULT_GPU, self.tensor_parallel)  # GPU's domain
        if (self.expert_parallel, self.expert_skew, self.attention_dp,
                self.expert_weight_dtype) != (1, 0, 1, None):  # (costs.expert_parallel)
            from ..costs.expert_parallel import check_moe_settings
            for knob, value in check_moe_settings(self, WEIGHT_DTYPES).items():
                object.__setattr__(self, knob, value)
        check_router(self.router)
        if self.kv_offload is not None and not isinstance(self.kv_offload,
                                                          (KVTier, KVTierChain)):
            raise TypeError(f"kv_offload must be a sim.KVTier or sim.KVTierChain, got "
                            f"{self.kv_offload!r}")
        if self.lora is not None and not isinstance(self.lora, LoRAConfig):
            raise TypeError(f"lora must be a sim.LoRAConfig, got {self.lora!r}")
        if self.disaggregation is not None:
            if self.lora is not None:
                raise ValueError("lora with disaggregation is not modelled: serve the adapters "
                                 "on one replica or a cluster (replicas=N)")
            if not isinstance(self.disaggregation, Disaggregation):
                raise TypeError(f"disaggregation must be a sim.Disaggregation, got "
                                f"{self.disaggregation!r}")
            if self.replicas != 1:
                raise ValueError(f"replicas={self.replicas} with disaggregation: give the "
                                 f"pools' sizes, Disaggregation(prefill_replicas, "
                                 f"decode_replicas)")
        object.__setattr__(self, "seed", positive_int("seed", self.seed, allow_zero=True))
        for knob in ("usd_per_gpu_hour", "gpu_idle_watts", "gpu_max_watts"):  # dollars, watts
            if getattr(self, knob) is not None:
                object.__setattr__(self, knob, positive_float(
                    knob, getattr(self, knob), allow_zero=knob == "gpu_idle_watts"))
        if (self.gpu_idle_watts, self.gpu_max_watts) != (None, None):
            check_power(self.resolved_gpu(), self.gpu_idle_watts, self.gpu_max_watts)
        for knob in ("max_batch_size", "block_size", "chunk_size", "token_budget", "kv_blocks",
                     "kv_tokens", "max_model_len"):
            if getattr(self, knob) is not None:
                object.__setattr__(self, knob, positive_int(knob, getattr(self, knob)))
        if self.max_model_len is not None:
            self._check_max_model_len()
        for name, allowed in (("weight_dtype", WEIGHT_DTYPES), ("kv_dtype", KV_DTYPES)):
            value = getattr(self, name)
            if not isinstance(value, str) or value.strip().lower() not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
            object.__setattr__(self, name, value.strip().lower())
        if self.gpu_memory_utilization is not None:
            fraction("gpu_memory_utilization", self.gpu_memory_utilization)
        given = self.prefix_caching
        if isinstance(given, str):  # any case, as the scheduler and precisions
            object.__setattr__(self, "prefix_caching", given.strip().lower())
        if self.prefix_caching in ("off", "none", 0):  # the CLI's and TOML's spelling of False
            object.__setattr__(self, "prefix_caching", False)
        if self.prefix_caching is not None and self.prefix_caching not in PREFIX_CACHING_MODES:
            raise ValueError(f"prefix_caching must be one of {PREFIX_CACHING_MODES} or 'off', "
                             f"got {given!r}")
        if self.free_gpu_memory_fraction is not None:
            object.__setattr__(self, "free_gpu_memory_fraction",
                               check_free_gpu_memory_fraction(self.free_gpu_memory_fraction))
            self._check_memory_knob("free_gpu_memory_fraction")
        given = next((k for k in ("kv_blocks", "kv_tokens") if getattr(self, k) is not None), None)
        for knob in ("kv_tokens",) + POOL_SIZING:  # one way to size the pool, never one ignored
            if given not in (None, knob) and getattr(self, knob) is not None:
                raise ValueError(f"{knob}={getattr(self, knob)!r} sizes the KV pool, which "
                                 f"{given}={getattr(self, given)} gives: set one of them")
        if self.speculative is not None and not isinstance(self.speculative, SpeculativeConfig):
            raise TypeError(f"speculative must be a sim.SpeculativeConfig or None, got "
                            f"{self.speculative!r}")
        draft = getattr(self.speculative, "draft_model", None)
        if draft is not None and (self.model is None or not callable(self.model)):
            from ..specs.models import get_model
            target = get_model(self.model or DEFAULT_MODEL)
            if get_model(draft).vocab_size != target.vocab_size:
                raise ValueError(f"draft_model {get_model(draft).name!r} has a vocabulary of "
                                 f"{get_model(draft).vocab_size:,} tokens but model "
                                 f"{target.name!r} has {target.vocab_size:,}: a draft must "
                                 f"share the target's tokenizer (vLLM refuses it too)")
        if self.closed_loop is not None and not (hasattr(self.closed_loop, "num_users")
                                                 and hasattr(self.closed_loop, "think_time")):
            raise TypeError(f"closed_loop must be a workloads.ClosedLoop, got {self.closed_loop!r}")
        object.__setattr__(self, "engine_overheads",
                           check_engine_overheads(self.engine_overheads, self.scheduler))
        if self.request_path is not None:  # (the module loads numpy: not for the CLI's parser)
            from .fleet.request_path import check_request_path
            check_request_path(self.request_path)
        if self.cost_model is not None and not callable(self.cost_model):
            raise TypeError(f"cost_model must be callable(batch) -> seconds, got "
                            f"{self.cost_model!r}")
        resolve(self)  # the policy validates the knobs it uses (last: it is kept by value)

    def _check_max_model_len(self):
        context = self.model_context_length()
        if context and self.max_model_len > context:
            from ..specs.models import get_model
            raise ValueError(f"max_model_len={self.max_model_len:,} is more than the context "
                             f"length of model {get_model(self.resolved_model()).name!r}, "
                             f"{context:,} tokens "
                             f"(max_position_embeddings): vLLM refuses it too (unless "
                             f"VLLM_ALLOW_LONG_MAX_MODEL_LEN=1); for a rope-scaled variant give "
                             f"its config with the larger max_position_embeddings as model")

    def _accounting(self) -> tuple:
        """``(policy class or object, memory accounting)`` of the scheduler: vLLM's unless the
        policy names another (the sglang preset's mem_fraction_static; the tensorrt-llm
        preset's free_gpu_memory_fraction); ``(None, None)`` for an unknown name."""
        sched = self.scheduler
        policy = POLICIES.get(sched.strip().lower()) if isinstance(sched, str) else sched
        return policy, (None if policy is None else getattr(policy, "memory_accounting", "vllm"))

    def _check_memory_knob(self, knob):
        """A memory knob the scheduler's accounting does not read (``READ_BY``) is an error,
        as ``sim memory`` refuses one, never silently ignored."""
        from ..specs.memory import READ_BY
        value = getattr(self, knob)
        policy, accounting = self._accounting()
        if accounting is not None and accounting not in READ_BY[knob]:
            name = getattr(policy, "name", policy)
            raise ValueError(f"{knob}={value!r} is read only by the "
                             f"{' and '.join(READ_BY[knob])} memory accounting, but the {name!r} "
                             f"scheduler sizes its KV pool with {accounting}'s (sim memory "
                             f"--accounting {accounting} shows its terms)")

    def draws_at_random(self) -> bool:
        """Whether the engine draws anything from ``seed``: speculative acceptance, or a
        ``random`` (or user) router over more than one replica. Otherwise a ``seed`` changes
        nothing in the run (``sim.run`` warns; a workload's draws take its generator's)."""
        many = self.replicas > 1 or self.disaggregation is not None
        router = self.router.strip().lower() if isinstance(self.router, str) else self.router
        return self.speculative is not None or (many and (router == "random"
                                                           or callable(router)))

    def resolved_model(self):
        return self.model or DEFAULT_MODEL

    def resolved_max_model_len(self) -> int | None:
        """The prompt + output tokens a request may hold: ``max_model_len``, else the model's
        context length; None when the model's config does not give one (no limit)."""
        if self.max_model_len is not None:
            return self.max_model_len
        return self.model_context_length()

    def model_context_length(self) -> int | None:
        """The model's context length (``max_position_embeddings``; None when not given)."""
        from ..specs.models import get_model
        return get_model(self.resolved_model()).max_position_embeddings or None

    def resolved_gpu(self):
        return self.gpu or DEFAULT_GPU

    def fleet(self) -> tuple:
        """``(replicas, GPUs)`` of the run: ``replicas x`` :meth:`replica_gpus`, or both pools'."""
        if self.disaggregation is not None:
            return self.disaggregation.fleet(self)
        return self.replicas, self.replicas * self.replica_gpus()

    def replica_gpus(self) -> int:  # tensor_parallel x attention_dp (specs.replica_layout)
        return replica_gpus(self.tensor_parallel, self.attention_dp)

    def policy(self):
        """The batching policy object (built anew from a name; a given object as is)."""
        return resolve(self)[1]

    def resolved(self) -> "SimConfig":
        """This config with every knob left ``None`` filled in by the scheduler's defaults."""
        return resolve(self)[0]

    def resolved_kv_blocks(self) -> int:
        if self.kv_blocks is not None:
            return self.kv_blocks
        if self.kv_tokens is not None:
            if self.block_size is None:
                return self.resolved().resolved_kv_blocks()
            if self.kv_tokens < self.block_size:
                raise ValueError(f"kv_tokens={self.kv_tokens:,} is less than one block of "
                                 f"block_size={self.block_size:,} tokens")
            return self.kv_tokens // self.block_size
        # whose memory accounting sizes the pool (_accounting; a
        # policy object with memory_accounting = "tensorrt-llm" carries its own fraction)
        policy, accounting = self._accounting()
        from_budget = self.pool_from_budget()
        if self.block_size is None or (self.gpu_memory_utilization is None
                                       and accounting == "vllm" and from_budget):
            return self.resolved().resolved_kv_blocks()
        if accounting != "vllm" and self.gpu_memory_utilization is not None:
            raise ValueError(
                f"gpu_memory_utilization={self.gpu_memory_utilization!r} is vLLM's setting: the "
                f"{getattr(policy, 'name', policy)!r} scheduler sizes its KV pool with "
                f"{accounting}'s accounting (sim memory --accounting {accounting} shows the "
                f"terms); give kv_blocks to set the pool yourself")
        draft = self.speculative.draft_model if self.speculative is not None else None
        if from_budget:  # (model, gpu and the rest: each given, or its default)
            return budget_kv_blocks(self, policy, accounting, draft)
        # the cheat sheet's pool holds KV_BLOCKS_AVAILABLE blocks of KV_BLOCK_SIZE tokens: as
        # many tokens at any block size (SGLang's page size 1 would otherwise get 1,800 tokens)
        return max(1, KV_BLOCKS_AVAILABLE * KV_BLOCK_SIZE // self.block_size)

    def pool_from_budget(self) -> bool:
        """Whether the KV pool (neither ``kv_blocks`` nor ``kv_tokens`` given) is sized from the
        memory budget of the model on the GPU (each given, or its default, as ``sim run``
        does): always, unless a user ``cost_model`` is given and no model or GPU is in play -
        neither is given, ``tensor_parallel`` is 1, both precisions are 2 bytes, no draft model
        shares the GPUs and no memory fraction (``gpu_memory_utilization``,
        ``free_gpu_memory_fraction``), which only the budget reads, is given: then it is the
        cheat sheet's pool (and the resolved config fills no fraction in: none is read)."""
        return (self.cost_model is None or self.model is not None or self.gpu is not None
                or self.tensor_parallel != 1
                or self.weight_dtype not in _TWO_BYTES or self.kv_dtype not in _TWO_BYTES
                or getattr(self.speculative, "draft_model", None) is not None
                or any(getattr(self, knob) is not None for knob in POOL_SIZING))

    def pool_source(self) -> str:
        """What sized the KV pool, in the summary's words (``kv_pool``): ``"kv_blocks"``,
        ``"kv_tokens"``, ``"memory budget"`` or ``"cheat sheet"``."""
        for knob in ("kv_blocks", "kv_tokens"):
            if getattr(self, knob) is not None:
                return knob
        return "memory budget" if self.pool_from_budget() else "cheat sheet"

    def overheads_summary(self) -> dict:
        """The summary's record of ``engine_overheads`` (none for ``"none"``)."""
        return summary_keys(self)

    def resolved_cost_model(self):
        """The cost model a run prices iterations with: ``cost_model``, else the roofline of
        ``model`` on ``gpu`` at the run's precisions; with speculative decoding, plus the
        draft's cost (:class:`~sim.engine.speculation.draft_cost.DraftCost`; none for
        ``ngram``)."""
        from ..costs.roofline import RooflineCost, shared_roofline
        target = self.cost_model
        if self.expert_skew and target is not None and getattr(
                target, "expert_skew", None) != self.expert_skew:  # (the roofline's alone)
            raise ValueError(f"expert_skew={self.expert_skew:g} is not used by cost_model "
                             f"{target!r}: only the roofline prices the busiest GPU's experts")
        if target is None:
            if self.attention_dp > 1:  # (each data-parallel rank's share of the batch)
                from ..costs.dp_attention import DPAttentionCost as RooflineCost
            target = shared_roofline(  # (one instance per setting: its memo fills once)
                RooflineCost, self.model or DEFAULT_MODEL, self.gpu or DEFAULT_GPU,
                tensor_parallel=self.tensor_parallel, weight_dtype=self.weight_dtype,
                kv_dtype=self.kv_dtype, expert_parallel=self.expert_parallel,
                expert_skew=self.expert_skew, attention_dp=self.attention_dp,
                expert_weight_dtype=self.expert_weight_dtype)
        spec = self.speculative
        if spec is None or spec.method == "ngram":
            return target
        k = spec.num_speculative_tokens
        if spec.draft_model is None:
            return DraftCost(target, k, ratio=spec.draft_cost_ratio)
        draft = shared_roofline(RooflineCost, spec.draft_model, self.gpu or DEFAULT_GPU,
                                tensor_parallel=self.tensor_parallel,
                                weight_dtype=self.weight_dtype, kv_dtype=self.kv_dtype)
        return DraftCost(target, k, draft=draft)


def as_config(config, name="config") -> SimConfig:
    """``config`` if it is a :class:`SimConfig`, a default one for ``None``; anything else (a
    scheduler's name in the config's place, ``run(df, "vllm")``, or a dict) is a ``TypeError``
    that says how to write it, instead of an ``AttributeError`` deep in the run."""
    if config is None:
        return SimConfig()
    if not isinstance(config, SimConfig):
        hint = (f"; for a scheduler write scheduler={config!r}" if isinstance(config, str) else
                "; for a dict write SimConfig(**d) or pass its keys as keywords"
                if isinstance(config, dict) else "")
        raise TypeError(f"{name} must be a sim.SimConfig or None, got {config!r}{hint}")
    return config
