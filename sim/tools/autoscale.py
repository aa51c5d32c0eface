"""An autoscaled run and its accounting: GPU-hours, dollars, cold starts, attainment over time.

    day = run_autoscaled(workloads.diurnal(24, mean_rate=4, ...), SimConfig(...),
                         Autoscaler(target=16, max_replicas=8))
    day.summary(slo={"ttft": 1.0})   # gpu_hours, usd, cold_start_usd, slo_attainment, ...
    day.timeline, day.over_time(slo, 900)

The fleet is scaled by :class:`~sim.engine.fleet.autoscaler.Autoscaler`'s router (the policy,
load times and scale-down there). Accounting: a replica is paid from its start (its lease's
``paid_from``) to ``paid_until``: the end of the run while on, else the later of its stop
decision and its last request's finish (a draining replica finishes its work); loading
(``paid_from`` to ``serving_from``) is the cold start, paid and serving nothing.

Invariants (tests/test_autoscaler.py): ``gpu_hours`` = the integral of the paid replica count
over the run x the replica's GPUs / 3600 (``tensor_parallel`` x ``attention_dp``:
:func:`sim.specs.replica_layout.replica_gpus`; the ``timeline``'s step function); ``usd`` =
``gpu_hours`` x the GPU's $/GPU-hour (``usd_per_gpu_hour``, else the sourced price);
``energy_joules`` = the replica's GPUs x (idle watts x paid seconds + the active share of
the power range x busy seconds); the cluster's own dollar and power columns (every replica
paid all run long) are replaced by these.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..engine.fleet.autoscaler import Autoscaler, AutoscalingRouter, load_time


@dataclass
class AutoscaledRun:
    """A run of :func:`run_autoscaled`: the ``result`` (a cluster's), the ``leases`` (one row
    per replica start: replica, paid_from, serving_from, paid_until, load_s, requests), the
    ``ticks`` (one row per evaluation) and the ``timeline`` (the paid and serving replica
    counts as step functions: each row's counts hold from its time to the next)."""

    result: object
    policy: Autoscaler
    leases: pd.DataFrame
    ticks: pd.DataFrame
    timeline: pd.DataFrame
    usd_per_gpu_hour: float
    end: float

    def summary(self, slo=None) -> dict:
        """``gpu_hours``, ``usd``, ``cold_start_gpu_hours`` and ``cold_start_usd`` (paid while
        loading), ``peak_replicas``, ``mean_replicas``, and the run's summary (``slo``)."""
        gpus = self.result.config.replica_gpus()  # (tensor_parallel x attention_dp)
        paid = (self.leases["paid_until"] - self.leases["paid_from"]).sum()
        loading = (np.minimum(self.leases["serving_from"], self.leases["paid_until"])
                   - self.leases["paid_from"]).clip(lower=0).sum()
        out = dict(self.result.summary(slo=slo))
        for k in ("usd_per_hour", "usd_per_million_output_tokens",
                  "usd_per_million_total_tokens", "avg_power_watts",
                  "energy_joules_per_output_token"):
            out.pop(k, None)  # (the cluster's: every replica paid all run long)
        gpu_hours = paid * gpus / 3600.0
        out.update(gpu_hours=gpu_hours, usd=gpu_hours * self.usd_per_gpu_hour,
                   cold_start_gpu_hours=loading * gpus / 3600.0,
                   cold_start_usd=loading * gpus / 3600.0 * self.usd_per_gpu_hour,
                   peak_replicas=int(self.timeline["paid"].max()),
                   mean_replicas=paid / self.end if self.end > 0 else math.nan,
                   replica_starts=int((self.leases["paid_from"] > 0).sum()))
        tokens = self.result.requests["num_output_tokens"][
            self.result.requests["status"] == "finished"].sum()
        out["usd_per_million_output_tokens"] = out["usd"] / tokens * 1e6 if tokens else math.nan
        joules = self._joules(paid)
        out["energy_joules"] = joules
        out["avg_power_watts"] = joules / self.end if self.end > 0 else math.nan
        out["energy_joules_per_output_token"] = joules / tokens if tokens else math.nan
        return out

    def _joules(self, paid_seconds) -> float:
        """Energy: every paid GPU at its idle power, plus the active share of its range
        while an iteration runs (the power model of :mod:`sim.results.economics`)."""
        from ..specs.economics import gpu_power
        config = self.result.config
        terms = gpu_power(config.resolved_gpu(), config.gpu_max_watts)
        idle = terms.idle_watts if config.gpu_idle_watts is None else config.gpu_idle_watts
        busy = float(self.result.iterations["duration"].sum())
        return config.replica_gpus() * (idle * paid_seconds + terms.active_fraction
                                         * (terms.max_watts - idle) * busy)

    def over_time(self, slo, window_s=900.0) -> pd.DataFrame:
        """Per window of ``window_s`` seconds (by arrival): ``rate`` (req/s), the mean paid and
        serving replicas, and ``slo_attainment`` (the share of its requests meeting every
        limit of ``slo``; rejected ones fail)."""
        from ..results.metrics import SLO_KEYS
        req = self.result.requests
        ok = req["status"] == "finished"
        for key, limit in slo.items():
            if key not in SLO_KEYS:
                raise ValueError(f"slo key {key!r} is not a per-request SLO {SLO_KEYS}")
            col = "max_itl" if key == "itl" else key
            ok &= req[col].to_numpy() <= limit
        bins = np.floor(req["arrival_time"].to_numpy() / window_s).astype(np.int64)
        rows = []
        for b in range(int(bins.max()) + 1 if len(bins) else 0):
            mask = bins == b
            t0, t1 = b * window_s, (b + 1) * window_s
            rows.append({"start": t0, "rate": mask.sum() / window_s,
                         "paid": self._mean("paid", t0, t1),
                         "serving": self._mean("serving", t0, t1),
                         "slo_attainment": ok[mask].mean() if mask.any() else math.nan})
        return pd.DataFrame(rows)

    def _mean(self, col, t0, t1) -> float:
        """The mean of a step column of the timeline over ``[t0, t1)``."""
        t, v = self.timeline["time"].to_numpy(), self.timeline[col].to_numpy()
        edges = np.clip(np.append(t, self.end), t0, t1)
        return float((np.diff(edges) * v).sum() / (t1 - t0))


def _leases(router, result, end) -> pd.DataFrame:
    finish = result.requests["finish_time"].to_numpy()
    rows = []
    for lz in router.leases:
        last = max((finish[i] for i in lz["requests"] if finish[i] == finish[i]),
                   default=-math.inf)
        until = end if lz["stop_at"] is None else max(lz["stop_at"], last)
        rows.append({"replica": lz["replica"], "paid_from": lz["paid_from"],
                     "serving_from": lz["serving_from"], "stop_at": lz["stop_at"],
                     "paid_until": min(until, end), "requests": len(lz["requests"])})
    return pd.DataFrame(rows)


def _timeline(leases, end) -> pd.DataFrame:
    """The paid and serving counts as step functions of time, from the leases."""
    events = sorted({0.0, end, *leases["paid_from"], *leases["paid_until"],
                     *leases["serving_from"].clip(upper=end),
                     *leases["stop_at"].dropna().clip(upper=end)})
    events = [t for t in events if t < end] or [0.0]
    paid, serving = [], []
    for t in events:
        on = (leases["paid_from"] <= t) & (leases["paid_until"] > t)
        paid.append(int(on.sum()))
        stop = leases["stop_at"].fillna(math.inf)
        serving.append(int((on & (leases["serving_from"] <= t) & (stop > t)).sum()))
    return pd.DataFrame({"time": events, "paid": paid, "serving": serving})


def run_autoscaled(workload, config=None, policy=None) -> AutoscaledRun:
    """Simulate ``workload`` on a fleet that ``policy`` (an :class:`Autoscaler`) scales
    (see the module docstring); ``config``'s replicas and router are the autoscaler's."""
    from ..engine import run
    from ..engine.config import as_config
    from ..results.economics import price_missing
    from ..specs.economics import gpu_price
    config = as_config(config)
    policy = policy or Autoscaler()
    if not isinstance(policy, Autoscaler):
        raise TypeError(f"policy must be a sim.Autoscaler, got {policy!r}")
    if config.disaggregation is not None or config.closed_loop is not None:
        raise ValueError("run_autoscaled scales colocated replicas of an open loop: drop "
                         "disaggregation and closed_loop")
    router = AutoscalingRouter(policy, load_time(config, policy))
    run_config = dataclasses.replace(config, replicas=max(policy.max_replicas, 2),
                                     router=router)  # (2: one replica skips the router)
    result = run(workload, run_config)
    req = result.requests
    end = float(np.nanmax(np.append(req["finish_time"].to_numpy(dtype=float),
                                    req["arrival_time"].to_numpy(dtype=float))))
    leases = _leases(router, result, end)
    price = config.usd_per_gpu_hour
    if price is None:
        row = None if price_missing(config) else gpu_price(config.resolved_gpu())
        price = row.usd_per_gpu_hour if row is not None else math.nan
    return AutoscaledRun(result, policy, leases, pd.DataFrame(router.ticks),
                         _timeline(leases, end), price, end)
