"""Arrival processes: arrival times in seconds, seeded by one ``numpy.random.Generator``.

- :func:`poisson` - exponential inter-arrivals (CV 1);
- :func:`gamma` - Gamma inter-arrivals with a chosen coefficient of variation (CV > 1: bursty);
- :func:`constant` - evenly spaced;
- :func:`scale_to_rate` - time-scale a workload's arrivals to a target rate (keeps its shape);
- :func:`own_rate` - the rate a workload's arrivals stand for.

One rate, one meaning: a workload whose arrivals were drawn (:func:`poisson`, :func:`gamma`,
:func:`constant` through ``workloads.load`` or the generators) carries the rate it was drawn at,
``attrs["arrival_rate"]`` (and the process's CV, ``attrs["arrival_cv"]``), and
:func:`scale_to_rate` multiplies its times by the ratio of the nominal rates, so a drawn
workload time-scaled to ``R`` holds the arrivals drawn at ``R`` with the same seed (to
rounding): ``sim run --rate R`` and a sweep or capacity search at ``R`` simulate the same
requests. A replayed trace or file (no nominal rate) is scaled by its measured mean rate,
``(n - 1) / span``; so is a workload read from a file (``workloads.load_file`` drops the attrs
a parquet file kept: its CSV twin could not keep them). A nominal rate the times no longer match (rows thinned or two workloads
merged after drawing: the measured rate off by more than six standard deviations) is not used,
with a warning.
- :class:`ClosedLoop` - a fixed number of users, each sending its next request a think time after
  its previous one finished (the engine issues these; arrival times in the workload are ignored).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .schema import _plain


RATE_KEY, CV_KEY = "arrival_rate", "arrival_cv"  # attrs of a drawn workload (see above)


def _nominal(rate) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.integer, np.floating)) \
            or not np.isfinite(rate) or rate <= 0:
        raise ValueError(f"attrs['{RATE_KEY}'] must be the positive rate the arrivals were "
                         f"drawn at, got {_plain(rate)!r} (delete it to scale by the measured "
                         f"rate)")
    return float(rate)


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


SEED_UNUSED = ("seed={seed!r} changes nothing: {what} (a seed draws only a length-only set's "
               "arrivals at rate= and its rows resampled past its size, and the generated "
               "workloads: vllm-random, vllm-sharegpt, agentic)")


def seed_unused(seed, what) -> None:
    """Warn (``UserWarning``, starting ``seed=``) that ``seed`` draws nothing, ``what`` saying
    why; the default seed 0 (or None) is no choice of the user's and says nothing."""
    if seed is None or (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool)
                        and seed == 0):
        return
    import warnings
    warnings.warn(SEED_UNUSED.format(seed=seed, what=what), UserWarning, stacklevel=3)


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


def drawn_at(df: pd.DataFrame, rate, cv=1.0) -> pd.DataFrame:
    """``df`` (changed in place) marked as arrivals drawn at ``rate`` with inter-arrival CV
    ``cv`` (1 Poisson, 0 evenly spaced): the nominal rate :func:`scale_to_rate` and
    :func:`own_rate` use."""
    df.attrs[RATE_KEY], df.attrs[CV_KEY] = float(rate), float(cv)
    return df


def _measured(t) -> float:
    return (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 and t[-1] > t[0] else float("nan")


def nominal_rate(df: pd.DataFrame, warn=True) -> float | None:
    """The rate ``df``'s arrivals were drawn at, or None (a trace, a file, or a nominal rate its
    times no longer match: the measured mean rate off by more than six standard deviations of
    its estimate, ``cv / sqrt(n - 1)`` relative; then a warning when ``warn``)."""
    rate = df.attrs.get(RATE_KEY)
    if rate is None or "arrival_time" not in df.columns:
        return None
    rate = _nominal(rate)
    t = df["arrival_time"].to_numpy(dtype=np.float64)
    measured = _measured(t)
    cv = max(float(df.attrs.get(CV_KEY, 1.0)), 0.05)
    if measured == measured and len(t) > 2 \
            and abs(measured / rate - 1) > 6 * cv / np.sqrt(len(t) - 1) + 1e-9:
        if warn:
            import warnings
            warnings.warn(f"attrs['{RATE_KEY}'] {rate:g} req/s, the rate the arrivals were "
                          f"drawn at, does not match their measured rate {measured:.4g} req/s "
                          f"(rows dropped or workloads merged after drawing?): scaling by the "
                          f"measured rate (delete the attr to silence this)",
                          UserWarning, stacklevel=3)
        return None
    return float(rate)


def own_rate(df: pd.DataFrame) -> float:
    """The rate ``df``'s arrivals stand for, requests/s: the nominal rate they were drawn at
    (:func:`nominal_rate`), else their measured mean rate ``(n - 1) / span`` (nan for fewer than
    two requests or a zero span)."""
    rate = nominal_rate(df, warn=False)
    return rate if rate is not None else _measured(df["arrival_time"].to_numpy(np.float64))


def scale_to_rate(df: pd.DataFrame, rate) -> pd.DataFrame:
    """``df`` with ``arrival_time`` time-scaled to ``rate`` (see the module docstring): a drawn
    workload's times multiplied by (its nominal rate / ``rate``), so they are the arrivals drawn
    at ``rate``; others shifted to start at 0 and scaled so the measured mean rate
    ``(n - 1) / span`` becomes ``rate``. The result carries ``rate`` as its nominal rate."""
    rate = _pos("rate", rate)
    out = df.copy()
    out.attrs = dict(df.attrs)
    t = out["arrival_time"].to_numpy(dtype=np.float64)
    nominal = nominal_rate(df)
    if nominal is not None:
        out["arrival_time"] = t * (nominal / rate)
        out.attrs[RATE_KEY] = rate
        return out
    t = t - t[0] if len(t) else t
    span = t[-1] if len(t) else 0.0
    if len(t) < 2 or span <= 0:
        what = (f"{len(t)} request" if len(t) < 2 else
                f"{len(t)} requests all arriving at {_plain(df['arrival_time'].iloc[0])!r} s")
        raise ValueError(f"rate {rate:g} cannot time-scale a workload of {what}: its mean rate "
                         f"needs at least two requests spread over time (omit the rate to "
                         f"replay it as it is)")
    out["arrival_time"] = t * ((len(t) - 1) / span) / rate
    out.attrs.pop(RATE_KEY, None)  # (a trace's measured rate: scaled again by the same rule)
    out.attrs.pop(CV_KEY, None)
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
