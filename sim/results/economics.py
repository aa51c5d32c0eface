"""Dollars and joules of a run: the cost and energy columns of :meth:`Result.summary`.

Every GPU of the run is counted, busy or not: a replica is ``tensor_parallel`` GPUs (times
``attention_dp`` ranks: :func:`sim.specs.replica_layout.replica_gpus`), a cluster ``replicas`` of them, a
disaggregated run both pools (each with its own GPU, tensor parallelism, price and power
terms: a pool's overrides, else the run's). Per pool ``g`` of
``n_g`` GPUs at ``p_g`` $/GPU-hour whose replicas ran iterations a fraction ``u_g`` of the
window (:meth:`Result.summary`'s ``duration``; ``busy_fraction`` per pool):

- ``usd_per_hour`` = sum of ``n_g x p_g``;
- ``usd_per_million_output_tokens`` = ``usd_per_hour / (output_token_throughput x 3600) x
  1e6`` (so GPUs x $/h / (output tokens/s x 3600) x 10^6 for one GPU type), and
  ``usd_per_million_total_tokens`` likewise over prompt + output tokens;
- ``avg_power_watts`` = sum of ``n_g x (idle_g + a x (max_g - idle_g) x u_g)`` (the power
  model of :mod:`sim.specs.economics`: ``a`` the fitted active fraction);
- ``energy_joules_per_output_token`` = ``avg_power_watts / output_token_throughput``.

The price is ``SimConfig.usd_per_gpu_hour`` when given, else the GPU's sourced default
(:func:`sim.specs.economics.gpu_price`); a GPU with neither has no price, and every dollar
column is NaN (:func:`price_missing` names it). ``gpu_idle_watts`` and ``gpu_max_watts``
override the power terms. A run with nothing finished has NaN per-token columns (no
throughput), and NaN power (no window).
"""

from __future__ import annotations

import math

from ..specs.economics import gpu_power, gpu_price
from ..specs.replica_layout import replica_gpus

KEYS = ("usd_per_hour", "usd_per_million_output_tokens", "usd_per_million_total_tokens",
        "energy_joules_per_output_token", "avg_power_watts")


def pools(config) -> list[tuple]:
    """``(replica indices, knob)`` per pool: ``knob(name)`` is the pool's value of a
    ``SimConfig`` field (its override, else the run's). One pool unless disaggregated."""
    dis = getattr(config, "disaggregation", None)
    if dis is None:
        return [(range(config.replicas), lambda name: getattr(config, name))]
    out, start = [], 0
    for n, over in ((dis.prefill_replicas, dict(dis.prefill)),
                    (dis.decode_replicas, dict(dis.decode))):
        out.append((range(start, start + n),
                    lambda name, over=over: over.get(name, getattr(config, name))))
        start += n
    return out


def _gpu(knob, config):
    return knob("gpu") or config.resolved_gpu()


def price_missing(config) -> str:
    """Why the run has no price ('' when it has one): the GPU without a sourced price."""
    for _, knob in pools(config):
        if knob("usd_per_gpu_hour") is None and gpu_price(_gpu(knob, config)) is None:
            gpu = _gpu(knob, config)
            name = getattr(gpu, "name", gpu)
            return (f"gpu {name!r} has no sourced price in sim/data/gpu_prices.csv: set "
                    f"usd_per_gpu_hour")
    return ""


def economics(result, summary) -> dict:
    """The :data:`KEYS` of ``result`` (see the module docstring); ``summary`` holds its
    ``duration`` and throughputs."""
    config, it = result.config, result.iterations
    window = summary["duration"]
    durations = it["duration"].to_numpy()
    replica = it["replica"].to_numpy() if "replica" in it else None
    usd, watts = 0.0, 0.0
    for indices, knob in pools(config):
        gpu = _gpu(knob, config)
        n_gpus = len(indices) * replica_gpus(knob("tensor_parallel"),
                                             getattr(config, "attention_dp", 1))
        price = knob("usd_per_gpu_hour")
        if price is None:
            row = gpu_price(gpu)
            price = row.usd_per_gpu_hour if row is not None else math.nan
        usd += n_gpus * price
        terms = gpu_power(gpu, knob("gpu_max_watts"))
        idle, top = knob("gpu_idle_watts"), terms.max_watts
        idle = terms.idle_watts if idle is None else idle
        if replica is None:
            busy = float(durations.sum())
        else:
            mine = (replica >= indices.start) & (replica < indices.stop)
            busy = float(durations[mine].sum())
        used = busy / window / len(indices) if window > 0 else math.nan
        watts += n_gpus * (idle + terms.active_fraction * (top - idle) * used)
    out_tps, total_tps = summary["output_token_throughput"], summary["total_token_throughput"]
    return {"usd_per_hour": usd,
            "usd_per_million_output_tokens": _per(usd, out_tps * 3600.0) * 1e6,
            "usd_per_million_total_tokens": _per(usd, total_tps * 3600.0) * 1e6,
            "energy_joules_per_output_token": _per(watts, out_tps),
            "avg_power_watts": watts}


def _per(amount, rate) -> float:
    return amount / rate if rate > 0 else math.nan  # (NaN > 0 is False: NaN)
