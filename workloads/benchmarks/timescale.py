"""A run measured against ``sim serve --time-scale S`` brought back to simulated time.

``sim serve --time-scale S`` makes each simulated second last ``S`` wall seconds, so a client's
clock reads every time ``S`` times the simulated one and every rate ``S`` times slower.
:func:`rescaled` undoes it: arrival times and the metrics that are times (their names say
latency, time-to-..., TTFT, TPOT, ITL, E2E, duration: every tool's) divided by ``S``, those that
are rates (throughput, per second, goodput) multiplied by ``S``; counts and lengths kept.
``S = 1`` returns the run itself.
"""

from __future__ import annotations

import dataclasses
import math

TIMES = ("latency", "time_to", "time_per", "ttft", "tpot", "itl", "e2el", "duration",
         # AIPerf's HTTP phases (ms)
         "http_req_blocked", "http_req_dns", "http_req_connecting", "http_req_sending",
         "http_req_waiting", "http_req_receiving", "http_req_duration")
RATES = ("throughput", "per_second", "goodput")


def kind_of(metric: str) -> str | None:
    """``"time"``, ``"rate"`` or None (a count, a length, a ratio) for a metric's name."""
    name = metric.rsplit(".", 1)[0] if "." in metric else metric
    if any(w in name for w in RATES):
        return "rate"
    if any(w in name for w in TIMES):
        return "time"
    return None


def rescaled(measured, time_scale):
    """``measured`` (a :class:`~workloads.benchmarks.common.Measured`) in simulated time."""
    if isinstance(time_scale, bool) or not isinstance(time_scale, (int, float)) or not (
            math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"time_scale must be a number > 0 (sim serve's --time-scale), got "
                         f"{time_scale!r}")
    if time_scale == 1:
        return measured
    s = float(time_scale)
    factor = {"time": 1 / s, "rate": s, None: 1.0}
    metrics = {k: v * factor[kind_of(k)] for k, v in measured.metrics.items()}
    df = measured.workload.copy()
    df["arrival_time"] = df["arrival_time"] / s
    note = (f"measured against sim serve --time-scale {s:g}: times divided and rates "
            f"multiplied by {s:g}")
    return dataclasses.replace(measured, workload=df, metrics=metrics,
                               rate=None if measured.rate is None else measured.rate * s,
                               notes=measured.notes + (note,))
