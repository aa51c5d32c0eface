"""Autoscaling a cluster over time-varying load: replicas started and stopped by a policy,
each paid from its start and serving only once its weights are loaded.

    auto = Autoscaler(metric="concurrency", target=16, min_replicas=1, max_replicas=8)
    day = sim.run_autoscaled(workloads.diurnal(24, mean_rate=4, ...), SimConfig(...), auto)

This module holds the policy and the router that applies it; the run and its accounting
(GPU-hours, dollars, attainment over time) are :mod:`sim.tools.autoscale`'s. The run is a cluster of ``max_replicas`` replicas (:mod:`.cluster`) whose router is the
autoscaler (:class:`AutoscalingRouter`): it sends each arrival to the serving replica with the
fewest outstanding requests, and, at the first arrival at or after each ``interval_s`` tick,
evaluates the policy as the Kubernetes HPA (and KEDA, llm-d's and Dynamo's planners on their
metrics) do: ``desired = ceil(sum of the metric over the serving replicas / target)``, clamped
to ``[min_replicas, max_replicas]``, the metric per replica one of ``concurrency`` (requests
queued or running: ``num_outstanding``), ``queue`` (``num_waiting``) or ``kv`` (the KV pool's
used fraction).

- **Scale up** at once: a replica that is off starts *loading*; it is paid from then and
  serves (is routed to) only after ``load_time_s`` = the weights' bytes per GPU / the stated
  ``load_bandwidth_gbps`` (storage -> GPU memory; ``load_time_s`` given overrides it).
- **Scale down** after ``scale_down_delay_s`` of ``desired`` below the fleet at every tick
  (the HPA's stabilisation window): loading replicas are cancelled first (paid until then),
  then the newest serving ones *drain*: routed nothing new, paid until their last request
  finishes, then off. Never below ``min_replicas`` serving.

Invariants (tests/test_autoscaler.py): nothing lost (the cluster's); a request is routed only
to a replica serving at its arrival, so never before its load time; serving replicas never
fewer than ``min_replicas``; a replica is restarted only once its last lease's requests are
done (leases of one replica never overlap). The policy is
evaluated at arrivals (a router sees the replicas only then), so its ticks are at least
``interval_s`` apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

METRICS = ("concurrency", "queue", "kv")


DEFAULT_LOAD_GBPS = 2.0  # GB/s per GPU when neither load_bandwidth_gbps nor load_time_s is given


@dataclass(frozen=True, slots=True)
class Autoscaler:
    """The policy (see the module docstring)."""

    metric: str = "concurrency"
    target: float = 16.0
    min_replicas: int = 1
    max_replicas: int = 8
    initial_replicas: int | None = None  # warm at the start; default min_replicas
    interval_s: float = 15.0  # the HPA's sync period
    scale_down_delay_s: float = 300.0  # the HPA's scale-down stabilisation window
    load_bandwidth_gbps: float | None = None  # GB/s per GPU, storage to GPU memory; None: 2.0
    load_time_s: float | None = None  # given: instead of weights / bandwidth (not both)

    def __post_init__(self):
        if self.metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {self.metric!r}")
        if self.load_time_s is not None and self.load_bandwidth_gbps is not None:
            raise ValueError(f"give load_time_s or load_bandwidth_gbps, not both (got "
                             f"load_time_s={self.load_time_s!r}, load_bandwidth_gbps="
                             f"{self.load_bandwidth_gbps!r}): the load time is one or the other")
        for name in ("target", "interval_s", "load_bandwidth_gbps"):
            v = getattr(self, name)
            if name == "load_bandwidth_gbps" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
                raise ValueError(f"{name} must be a positive number, got {v!r}")
        if self.metric == "kv" and not self.target < 1:  # (a pool is at most all in use)
            raise ValueError(f"target must be a fraction in (0, 1) for metric 'kv' (the pool's "
                             f"used fraction: one of {self.target!r} never scales up), got "
                             f"{self.target!r}")
        for name in ("scale_down_delay_s", "load_time_s"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not 0 <= v < math.inf):
                raise ValueError(f"{name} must be a number >= 0, got {v!r}")
        for name in ("min_replicas", "max_replicas"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas {self.max_replicas} is below min_replicas "
                             f"{self.min_replicas}")
        start = self.initial_replicas
        if start is not None and not (isinstance(start, int) and not isinstance(start, bool)
                                      and self.min_replicas <= start <= self.max_replicas):
            raise ValueError(f"initial_replicas must be an integer in [min_replicas, "
                             f"max_replicas], got {start!r}")


def load_time(config, policy) -> float:
    """Seconds before a started replica serves: ``policy.load_time_s``, else the weights'
    bytes per GPU (each GPU of the replica loads its own share at once:
    :func:`sim.specs.replica_layout.weight_bytes_per_gpu`, parameters x bytes per weight /
    tensor parallelism for a dense model; a MoE model's routed experts over the
    ``expert_parallel`` GPUs, in their own precision) / the bandwidth."""
    if policy.load_time_s is not None:
        return float(policy.load_time_s)
    from ...specs.memory import bytes_per_value
    from ...specs.models import get_model
    from ...specs.replica_layout import weight_bytes_per_gpu
    model = get_model(config.resolved_model())
    eb = config.expert_weight_dtype
    per_gpu = weight_bytes_per_gpu(
        model, config.tensor_parallel, bytes_per_value("weight_dtype", config.weight_dtype),
        config.expert_parallel, None if eb is None else bytes_per_value("expert_weight_dtype", eb))
    gbps = DEFAULT_LOAD_GBPS if policy.load_bandwidth_gbps is None else policy.load_bandwidth_gbps
    return per_gpu / (gbps * 1e9)


class AutoscalingRouter:
    """The router that scales (see the module docstring); ``leases``: one dict per time a
    replica was started (``replica``, ``paid_from``, ``serving_from``, ``stop_at``: the drain
    or cancel decision, None while on; ``requests``: indices routed to it); ``ticks``: one
    dict per evaluation."""

    def __init__(self, policy, load_s):
        self.policy, self.load_s = policy, load_s
        start = policy.initial_replicas or policy.min_replicas
        self.leases = [{"replica": k, "paid_from": 0.0, "serving_from": 0.0, "stop_at": None,
                        "requests": []} for k in range(start)]
        self.on = {k: lease for k, lease in enumerate(self.leases)}  # replica -> its lease
        self.ticks, self.next_tick, self.below_since = [], 0.0, None

    def _serving(self, now) -> list:
        return [lz for lz in self.on.values() if lz["serving_from"] <= now]

    def _metric(self, view) -> float:
        if self.policy.metric == "concurrency":
            return view.num_outstanding
        if self.policy.metric == "queue":
            return view.num_waiting
        return 1.0 - view.num_free_blocks / view.num_blocks

    def _tick(self, views, now) -> None:
        p = self.policy
        for k in [k for k, lz in self.on.items() if lz["stop_at"] is not None]:
            del self.on[k]  # (stopped at an earlier tick: off for routing)
        serving = self._serving(now)
        total = sum(self._metric(views[lz["replica"]]) for lz in serving)
        current = len(self.on)
        desired = min(max(math.ceil(total / p.target - 1e-12), p.min_replicas), p.max_replicas)
        self.ticks.append({"time": now, "metric_total": total, "serving": len(serving),
                           "fleet": current, "desired": desired})
        if desired > current:
            self.below_since = None
            free = [k for k in range(p.max_replicas) if k not in self.on
                    and views[k].num_outstanding == 0]  # (a draining one still holds work)
            for k in free[:desired - current]:
                lease = {"replica": k, "paid_from": now, "serving_from": now + self.load_s,
                         "stop_at": None, "requests": []}
                self.leases.append(lease)
                self.on[k] = lease
        elif desired < current:
            if self.below_since is None:
                self.below_since = now
            if now - self.below_since >= p.scale_down_delay_s:
                self.below_since = None
                cut = current - desired
                loading = sorted((lz for lz in self.on.values() if lz["serving_from"] > now),
                                 key=lambda lz: -lz["paid_from"])
                newest = sorted(serving, key=lambda lz: -lz["paid_from"])
                stop = loading[:cut]
                stop += newest[:max(0, min(cut - len(stop), len(newest) - p.min_replicas))]
                for lz in stop:
                    lz["stop_at"] = now
        else:
            self.below_since = None

    def __call__(self, request, views, now):
        if now >= self.next_tick:
            self.next_tick = now + self.policy.interval_s
            self._tick(views, now)
        serving = [lz for lz in self._serving(now) if lz["stop_at"] is None]
        best = min(serving, key=lambda lz: (views[lz["replica"]].num_outstanding,
                                            lz["replica"]))
        best["requests"].append(request.index)
        return best["replica"]
