"""LoRA adapters on a replica, by vLLM's rules: GPU slots, a CPU cache, loads at a bandwidth.

:class:`LoRAConfig` is the setting (``SimConfig(lora=...)``); :class:`AdapterSlots` is one
replica's adapter state, the admission gate every policy goes through
(:meth:`~sim.engine.core.replica.Replica.admit` asks :meth:`AdapterSlots.ready`, then calls
:meth:`AdapterSlots.take` once the request is admitted; a finish or a preemption calls
:meth:`AdapterSlots.release`).

The model (tests/test_lora.py):
- **Slots.** ``max_loras`` GPU slots, each preallocated at ``max_lora_rank`` (vLLM's
  ``LoRAModelManager``): their bytes, :func:`slot_bytes`, come off the KV budget
  (:mod:`sim.engine.pool_budget`). Per slot and GPU::

      bytes = max_lora_rank * sum over layers and targeted projections of (d_in + d_out)
              * bytes per weight value / tensor_parallel

  (A is ``d_in x r``, B is ``r x d_out``; projections q, k, v, o of the attention and gate,
  up, down of the MLP - vLLM's packed qkv / gate_up hold the same values; the ``/ tp`` is an
  approximation: the rank-side factor a sharded layer replicates is not counted).
- **Admission.** A request with a ``lora_id`` whose adapter holds no slot is admitted only when
  a slot is free or holds an adapter no running request uses (then the least recently used
  such adapter is evicted); otherwise it waits (``ready`` is False: the policy sees the
  admission refused, as for blocks). A request without a ``lora_id`` runs on the base model.
- **Loads.** An adapter taken into a slot is loaded: ``size / cpu_gbps`` from the CPU cache
  (the ``max_cpu_loras`` most recently used adapters) or ``size / disk_gbps + size /
  cpu_gbps`` from disk (it then enters the CPU cache, evicting its LRU entry past
  ``max_cpu_loras``); ``size`` is the adapter at its own rank. As vLLM's worker loads the
  step's adapters before its forward pass, the load time is added to the iteration that
  admits the request (:mod:`sim.costs.lora` takes :meth:`AdapterSlots.take_pending`).

Invariants: ``len(gpu) <= max_loras``, ``len(cpu) <= max_cpu_loras``, every adapter a running
request uses holds a slot; the distinct adapters of a batch are never more than ``max_loras``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

VLLM_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed max_lora_rank values
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _count(name, value, low=1):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"lora.{name} must be an integer >= {low}, got {value!r}")
    return value


def _rate(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"lora.{name} must be a number > 0 (GB/s), got {value!r}")
    return float(value)


@dataclass(frozen=True)
class LoRAConfig:
    """LoRA serving settings (vLLM's names). ``max_loras``: GPU slots (adapters in one batch);
    ``max_cpu_loras``: adapters the CPU cache holds (None: ``max_loras``, vLLM's default; must
    be >= ``max_loras``); ``max_lora_rank``: the rank every slot is preallocated at (one of
    :data:`VLLM_RANKS`); ``ranks``: adapter id -> its rank (1..``max_lora_rank``); ``default_rank``: the rank of an id not in
    ``ranks`` (None: ``max_lora_rank`` when ``ranks`` is empty, else an id without a rank is an
    error); ``cpu_gbps`` / ``disk_gbps``: CPU -> GPU and disk -> CPU load bandwidth (GB/s;
    defaults: ~25 GB/s of PCIe 4.0 x16's 32 nominal, ~2 GB/s of an NVMe read with
    safetensors parsing); ``target_modules``: the projections adapted (all of them by
    default)."""

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    ranks: dict = field(default_factory=dict)
    default_rank: int | None = None
    cpu_gbps: float = 25.0
    disk_gbps: float = 2.0
    target_modules: tuple = PROJECTIONS

    def __post_init__(self):
        _count("max_loras", self.max_loras)
        if self.max_lora_rank not in VLLM_RANKS:
            raise ValueError(f"lora.max_lora_rank must be one of {VLLM_RANKS} (vLLM's), got "
                             f"{self.max_lora_rank!r}")
        cpu = self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras
        _count("max_cpu_loras", cpu)
        if cpu < self.max_loras:
            raise ValueError(f"lora.max_cpu_loras ({cpu}) must be >= max_loras "
                             f"({self.max_loras})")
        object.__setattr__(self, "max_cpu_loras", cpu)
        if not isinstance(self.ranks, dict):
            raise TypeError(f"lora.ranks must be a dict of adapter id -> rank, got "
                            f"{self.ranks!r}")
        object.__setattr__(self, "ranks", dict(self.ranks))
        for k, r in self.ranks.items():
            self._check_rank(f"ranks[{k!r}]", r)
        if self.default_rank is None and not self.ranks:
            object.__setattr__(self, "default_rank", self.max_lora_rank)
        if self.default_rank is not None:
            self._check_rank("default_rank", self.default_rank)
        _rate("cpu_gbps", self.cpu_gbps)
        _rate("disk_gbps", self.disk_gbps)
        mods = tuple(self.target_modules)
        bad = [m for m in mods if m not in PROJECTIONS]
        if bad or not mods:
            raise ValueError(f"lora.target_modules must be a non-empty subset of "
                             f"{PROJECTIONS}, got {self.target_modules!r}")
        object.__setattr__(self, "target_modules", mods)

    def _check_rank(self, name, r):
        _count(name, r)
        if r > self.max_lora_rank:
            raise ValueError(f"lora.{name}={r} exceeds max_lora_rank={self.max_lora_rank}")

    def slot_bytes(self, model, dtype_bytes, tensor_parallel=1) -> float:
        """Bytes per GPU of the ``max_loras`` slots (:func:`slot_bytes`; the KV budget's)."""
        return slot_bytes(self, model, dtype_bytes, tensor_parallel)

    def rank(self, adapter) -> int:
        """``adapter``'s rank; an id with none (no entry, no ``default_rank``) is an error."""
        r = self.ranks.get(adapter, self.default_rank)
        if r is None:
            raise ValueError(f"lora_id {adapter!r} has no rank: add it to lora.ranks or give "
                             f"lora.default_rank")
        return r


def projection_dims(model) -> dict:
    """``(d_in, d_out)`` of each projection a LoRA adapter may target, from the model's dims."""
    h, hd = model.hidden_size, model.head_dim or model.hidden_size // model.num_attention_heads
    q, kv, inter = model.num_attention_heads * hd, model.num_key_value_heads * hd, \
        model.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}


def values_per_rank(model, target_modules=PROJECTIONS) -> int:
    """Weight values one unit of rank costs: ``layers * sum(d_in + d_out)`` of the targets."""
    dims = projection_dims(model)
    return model.num_hidden_layers * sum(sum(dims[m]) for m in target_modules)


def adapter_bytes(model, rank, dtype_bytes, tensor_parallel=1, target_modules=PROJECTIONS):
    """Bytes per GPU of one adapter of ``rank`` (the module docstring's formula)."""
    return rank * values_per_rank(model, target_modules) * dtype_bytes / tensor_parallel


def slot_bytes(lora: LoRAConfig, model, dtype_bytes, tensor_parallel=1) -> float:
    """Bytes per GPU the ``max_loras`` slots preallocate at ``max_lora_rank``."""
    return lora.max_loras * adapter_bytes(model, lora.max_lora_rank, dtype_bytes,
                                          tensor_parallel, lora.target_modules)


class AdapterSlots:
    """One replica's adapters: GPU slots (LRU), CPU cache (LRU), running users per adapter."""

    def __init__(self, lora: LoRAConfig, model, dtype_bytes, tensor_parallel=1,
                 hbm_gbps=None, peak_tflops=None):
        self.lora = lora
        self.dtype_bytes = dtype_bytes
        self.hbm_gbps, self.peak_tflops = hbm_gbps, peak_tflops  # (the GEMMs' roofline)
        self.bytes_per_rank = adapter_bytes(model, 1, dtype_bytes, tensor_parallel,
                                            lora.target_modules)
        self.gpu = OrderedDict()  # adapter -> None, least recently used first
        self.cpu = OrderedDict()
        self.active = {}  # adapter -> running requests using it
        self.pending = 0.0  # load seconds the next iteration pays
        self.loads = 0  # adapters loaded into a slot
        self.disk_loads = 0  # ... of which from disk (not in the CPU cache)
        self.load_seconds = 0.0
        self.batches = 0  # iterations priced, and their distinct adapters in all
        self.distinct_sum = 0
        self.distinct_max = 0
        self.served = set()  # indices of the LoRA requests admitted

    def priced(self, cost):
        """``cost`` plus these adapters' GEMMs and loads (:class:`sim.costs.lora.LoRACost`)."""
        from ...costs.lora import LoRACost
        return LoRACost(cost, self, self.hbm_gbps, self.peak_tflops)

    def size(self, adapter) -> float:
        return self.lora.rank(adapter) * self.bytes_per_rank

    def ready(self, r) -> bool:
        """Whether ``r``'s adapter holds a slot or can take one now."""
        a = r.lora_id
        if a is None or a in self.gpu or len(self.gpu) < self.lora.max_loras:
            return True
        return len(self.active) < len(self.gpu)  # an adapter no running request uses

    def take(self, r) -> None:
        """``r`` was admitted: its adapter is (loaded into a slot, and) in use by one more."""
        a = r.lora_id
        if a is None:
            return
        gpu = self.gpu
        if a in gpu:
            gpu.move_to_end(a)
        else:
            if len(gpu) >= self.lora.max_loras:  # evict the LRU adapter nobody runs with
                victim = next(k for k in gpu if k not in self.active)
                del gpu[victim]
            size = self.size(a)
            seconds = size / (self.lora.cpu_gbps * 1e9)
            if a in self.cpu:
                self.cpu.move_to_end(a)
            else:
                seconds += size / (self.lora.disk_gbps * 1e9)
                self.disk_loads += 1
                self.cpu[a] = None
                if len(self.cpu) > self.lora.max_cpu_loras:
                    self.cpu.popitem(last=False)
            gpu[a] = None
            self.loads += 1
            self.load_seconds += seconds
            self.pending += seconds
        self.active[a] = self.active.get(a, 0) + 1
        self.served.add(r.index)

    def release(self, r) -> None:
        """``r`` finished or was preempted: one user fewer of its adapter (it stays cached)."""
        a = r.lora_id
        if a is None:
            return
        n = self.active[a] - 1
        if n:
            self.active[a] = n
        else:
            del self.active[a]

    def take_pending(self) -> float:
        """The load seconds of this iteration's admissions (then none are pending)."""
        t, self.pending = self.pending, 0.0
        return t

    def observe(self, distinct) -> None:
        self.batches += 1
        self.distinct_sum += distinct
        self.distinct_max = max(self.distinct_max, distinct)



def adapter_slots(config) -> AdapterSlots:
    """A replica's :class:`AdapterSlots` as ``config.lora`` sets them, for its model (named:
    the adapters' sizes come from its dims) at its weight precision on its GPU."""
    from ...specs.gpus import get_gpu
    from ...specs.memory import bytes_per_value
    from ...specs.models import get_model
    if callable(config.model):
        raise ValueError("lora needs a named model (its adapters' sizes come from the model's "
                         "dims), got a callable model")
    gpu = get_gpu(config.resolved_gpu())
    return AdapterSlots(config.lora, get_model(config.resolved_model()),
                        bytes_per_value("weight_dtype", config.weight_dtype),
                        config.tensor_parallel, gpu.memory_bandwidth_gbps, gpu.fp16_tflops)


def assign_adapters(df, requests, lora) -> None:
    """Give each request its ``lora_id`` (a missing value: the base model), checking that every
    adapter has a rank; a workload naming adapters without ``lora`` set is an error."""
    if "lora_id" not in df.columns:
        return
    ids = [None if v is None or v != v else v for v in df["lora_id"].tolist()]
    named = sorted({str(v) for v in ids if v is not None})
    if not named:
        return
    if lora is None:
        raise ValueError(f"the workload's lora_id column names {len(named)} adapter(s) "
                         f"({named[0]!r}, ...) but LoRA is off: set SimConfig(lora="
                         f"sim.LoRAConfig(...)) (CLI: --enable-lora)")
    for a in dict.fromkeys(v for v in ids if v is not None):
        lora.rank(a)
    for r, a in zip(requests, ids):
        r.lora_id = a


def lora_stats(slots) -> dict:
    """The summary's LoRA metrics over replicas' :class:`AdapterSlots`: adapter loads (from
    disk among them), load seconds in all and per LoRA request served, distinct adapters per
    priced iteration (mean over iterations, max)."""
    loads = sum(s.loads for s in slots)
    seconds = sum(s.load_seconds for s in slots)
    served = sum(len(s.served) for s in slots)
    batches = sum(s.batches for s in slots)
    return {"lora_adapter_loads": loads, "lora_disk_loads": sum(s.disk_loads for s in slots),
            "lora_load_seconds": seconds,
            "lora_load_time_per_request": seconds / served if served else math.nan,
            "lora_distinct_per_batch_mean": (sum(s.distinct_sum for s in slots) / batches
                                             if batches else math.nan),
            "lora_distinct_per_batch_max": max(s.distinct_max for s in slots)}
