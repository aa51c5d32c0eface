"""Time-varying load: a day's diurnal rate curve with bursts, or a trace scaled in time.

    df = diurnal(hours=24, mean_rate=4.0, peak_to_trough=4.0, peak_hour=14,
                 prompt=LogNormal(800, 1.0), output=LogNormal(200, 1.0), seed=0)
    df = time_scaled(load("azure-conv"), 24 * 3600)   # an hour-long trace stretched to a day
    df = day_like(load("azure-conv"), hours=24, peak_to_trough=3)  # its hour as the day's peak

:func:`diurnal` draws a non-homogeneous Poisson process of rate
``lambda(t) = mean_rate x (1 + a cos(2 pi (t/3600 - peak_hour) / P)) x burst(t)`` (``P`` =
``period_hours``, 24: a day; shorter compresses the day, for a quick look) with
``a = (k - 1) / (k + 1)`` for ``peak_to_trough = k`` (so the peak is ``k`` times the trough and
the mean over a day is ``mean_rate``), by thinning (Lewis and Shedler 1979: candidates at the
peak rate, each kept with probability ``lambda(t) / peak``); ``bursts``: ``(start_s,
duration_s, factor)`` windows multiplying the rate. :func:`rate_at` is the curve itself.
:func:`time_scaled` stretches (or compresses) a trace's arrivals to last ``duration_s``, its
shape kept. :func:`day_like` takes a trace's rate as the peak of a :func:`diurnal` day (mean
``peak x (k + 1) / 2k``) and gives each arrival the prompt and output lengths of one of the
trace's requests drawn at random (the pairs kept). Deterministic for a seed; lengths as
:func:`workloads.synthetic` draws them.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .lengths import as_distribution
from .schema import validate


def _positive(name, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
            or math.isinf(value):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _bursts(bursts) -> list:
    out = []
    for b in bursts:
        if not (isinstance(b, (tuple, list)) and len(b) == 3):
            raise ValueError(f"bursts: each must be (start_s, duration_s, factor), got {b!r}")
        start, length, factor = b
        if not (isinstance(start, (int, float)) and start >= 0):
            raise ValueError(f"bursts: start_s must be >= 0, got {start!r}")
        out.append((float(start), _positive("bursts: duration_s", length),
                    _positive("bursts: factor", factor)))
    return out


def _shape(peak_to_trough, peak_hour) -> float:
    """``peak_to_trough`` checked (>= 1: a peak below its trough would put the thinning's
    candidates under the curve's maximum) with ``peak_hour`` (finite)."""
    k = _positive("peak_to_trough", peak_to_trough)
    if k < 1:
        raise ValueError(f"peak_to_trough must be >= 1 (the peak's rate over the trough's), "
                         f"got {peak_to_trough!r}")
    if isinstance(peak_hour, bool) or not isinstance(peak_hour, (int, float)) \
            or not math.isfinite(peak_hour):
        raise ValueError(f"peak_hour must be a finite number of hours, got {peak_hour!r}")
    return k


def rate_at(t, *, mean_rate, peak_to_trough=4.0, peak_hour=14.0, bursts=(),
            period_hours=24.0) -> np.ndarray:
    """The rate curve ``lambda(t)`` (requests/s) at the times ``t`` (seconds), see the module
    docstring."""
    k = _shape(peak_to_trough, peak_hour)
    a = (k - 1) / (k + 1)
    t = np.asarray(t, dtype=np.float64)
    lam = _positive("mean_rate", mean_rate) * (
        1 + a * np.cos(2 * np.pi * (t / 3600.0 - peak_hour) / _positive("period_hours",
                                                                      period_hours)))
    for start, length, factor in _bursts(bursts):
        lam = np.where((t >= start) & (t < start + length), lam * factor, lam)
    return lam


def diurnal(hours=24.0, *, mean_rate, prompt, output, peak_to_trough=4.0, peak_hour=14.0,
            bursts=(), period_hours=24.0, seed=0) -> pd.DataFrame:
    """Requests over ``hours`` of the diurnal curve (see the module docstring)."""
    duration = _positive("hours", hours) * 3600.0
    peak_to_trough = _shape(peak_to_trough, peak_hour)
    burst = _bursts(bursts)
    peak = _positive("mean_rate", mean_rate) * 2 * peak_to_trough / (peak_to_trough + 1) * max(
        [1.0] + [f for _, _, f in burst])
    rng = np.random.default_rng(seed)
    n = rng.poisson(peak * duration)
    times = np.sort(rng.uniform(0.0, duration, n))
    keep = rng.uniform(0.0, peak, n) < rate_at(times, mean_rate=mean_rate,
                                               peak_to_trough=peak_to_trough,
                                               peak_hour=peak_hour, bursts=burst,
                                               period_hours=period_hours)
    times = times[keep]
    if len(times) == 0:
        raise ValueError(f"diurnal: no request arrives in {hours} h at mean_rate {mean_rate}")
    p = as_distribution(prompt, "prompt").sample(len(times), rng)
    o = as_distribution(output, "output").sample(len(times), rng)
    return validate(pd.DataFrame({"arrival_time": times, "num_prompt_tokens": p,
                                  "num_output_tokens": o}))


def time_scaled(df, duration_s) -> pd.DataFrame:
    """``df`` with its arrivals stretched (or compressed) linearly to span ``duration_s``
    seconds from its first arrival, its shape (bursts, lulls) kept."""
    df = validate(df)
    t = df["arrival_time"].to_numpy(dtype=np.float64)
    span = t[-1] - t[0]
    if not span > 0:
        raise ValueError("time_scaled needs arrivals spread over time")
    out = df.copy()
    out.attrs = dict(df.attrs)
    out["arrival_time"] = (t - t[0]) * (_positive("duration_s", duration_s) / span)
    return out


def day_like(trace, hours=24.0, *, peak_rate=None, peak_to_trough=4.0, peak_hour=14.0,
             period_hours=24.0, bursts=(), seed=0) -> pd.DataFrame:
    """A :func:`diurnal` day peaking at ``peak_rate`` (default: ``trace``'s own rate,
    :func:`~workloads.arrivals.own_rate`) whose requests take ``trace``'s (prompt, output)
    pairs, drawn with replacement (seed ``seed + 1``)."""
    from .arrivals import own_rate
    trace = validate(trace)
    peak = own_rate(trace) if peak_rate is None else _positive("peak_rate", peak_rate)
    if not peak > 0:
        raise ValueError("day_like: the trace has no rate of its own (fewer than two requests "
                         "or all at one time): give peak_rate")
    k = _shape(peak_to_trough, peak_hour)
    day = diurnal(hours, mean_rate=peak * (k + 1) / (2 * k), prompt=1, output=1,
                  peak_to_trough=k, peak_hour=peak_hour, bursts=bursts,
                  period_hours=period_hours, seed=seed)
    pick = np.random.default_rng(seed + 1).integers(0, len(trace), len(day))
    for col in ("num_prompt_tokens", "num_output_tokens"):
        day[col] = trace[col].to_numpy()[pick]
    return day
