"""Arrival processes: arrival times in seconds, seeded by one ``numpy.random.Generator``.

- :func:`poisson` - exponential inter-arrivals (CV 1);
- :func:`gamma` - Gamma inter-arrivals with a chosen coefficient of variation (CV > 1: bursty);
- :func:`constant` - evenly spaced;
- :func:`scale_to_rate` - time-scale a trace's timestamps to a target mean rate (keeps its shape);
- :class:`ClosedLoop` - a fixed number of users, each sending its next request a think time after
  its previous one finished (the engine issues these; arrival times in the workload are ignored).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .schema import _plain


def _pos(name, value, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not np.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return float(value)


def _count(n):
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {_plain(n)!r}")
    return int(n)


def _rng(rng):
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(rng)


def _same(value, default) -> bool:
    try:
        return bool(value == default)
    except (TypeError, ValueError):  # (an array compared elementwise)
        return False


def cv_for(arrival, cv) -> None:
    """``cv`` is the gamma process's: with any other ``arrival`` it would change nothing, so
    anything but its default, 1, is an error (it was silently ignored)."""
    if not _same(arrival, "gamma") and not _same(cv, 1.0):
        raise ValueError(f"cv={_plain(cv)!r} applies to arrival='gamma' ({arrival!r} arrivals "
                         f"do not take it)")


def poisson(n, rate, rng=None) -> np.ndarray:
    """``n`` Poisson arrivals at ``rate`` requests/s (first one after an exponential gap)."""
    return np.cumsum(_rng(rng).exponential(1.0 / _pos("rate", rate), _count(n)))


def gamma(n, rate, cv, rng=None) -> np.ndarray:
    """``n`` arrivals with Gamma inter-arrival times of mean ``1/rate`` and CV ``cv``."""
    rate, cv = _pos("rate", rate), _pos("cv", cv)
    shape = 1.0 / cv ** 2
    return np.cumsum(_rng(rng).gamma(shape, 1.0 / (rate * shape), _count(n)))


def constant(n, rate) -> np.ndarray:
    """``n`` evenly spaced arrivals, the first at 0."""
    return np.arange(_count(n)) / _pos("rate", rate)


def scale_to_rate(df: pd.DataFrame, rate) -> pd.DataFrame:
    """Time-scale ``arrival_time`` so the mean rate ``(n - 1) / span`` becomes ``rate``."""
    rate = _pos("rate", rate)
    out = df.copy()
    out.attrs = dict(df.attrs)
    t = out["arrival_time"].to_numpy(dtype=np.float64)
    t = t - t[0] if len(t) else t
    span = t[-1] if len(t) else 0.0
    if len(t) < 2 or span <= 0:
        what = (f"{len(t)} request" if len(t) < 2 else
                f"{len(t)} requests all arriving at {_plain(df['arrival_time'].iloc[0])!r} s")
        raise ValueError(f"rate {rate:g} cannot time-scale a workload of {what}: its mean rate "
                         f"needs at least two requests spread over time (omit the rate to "
                         f"replay it as it is)")
    out["arrival_time"] = t * ((len(t) - 1) / span) / rate
    return out


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """``num_users`` concurrent users; each sends its next request ``think_time`` seconds after
    its previous one finished (or was rejected). Requests are issued in workload order; with
    a ``session_id`` column, a user holds one conversation at a time and issues its turns in
    order, each after the previous turn finished (``sim.engine.clients``)."""

    num_users: int
    think_time: float = 0.0

    def __post_init__(self):
        if isinstance(self.num_users, bool) or not isinstance(self.num_users, (int, np.integer)) \
                or self.num_users < 1:
            raise ValueError(f"num_users must be an integer >= 1, got {_plain(self.num_users)!r}")
        _pos("think_time", self.think_time, allow_zero=True)


def interarrival_cv(arrival_times) -> float:
    """Coefficient of variation of the inter-arrival gaps (1 for Poisson)."""
    gaps = np.diff(np.asarray(arrival_times, dtype=np.float64))
    if len(gaps) < 2 or gaps.mean() == 0:
        return float("nan")
    return float(gaps.std() / gaps.mean())
