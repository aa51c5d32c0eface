"""Capacity search: the highest request rate a configuration serves within its SLOs.

    cap = max_rate(df, {"ttft": 2.0, "itl": 0.1}, attainment=0.9, config=SimConfig(...))
    cap.rate, cap.goodput_per_gpu, cap.points   # the answer, and every rate it tried

The workload keeps its shape (arrival pattern, lengths) and is time-scaled to each trial rate
(:func:`workloads.scale_to_rate`), so the criterion is a deterministic function of the rate; a
rate means what it means to ``workloads.load`` and ``sim run --rate``: for a drawn workload the
rate its arrivals are drawn at (the answer ``R`` is the run of ``load(..., rate=R)``), for a
replayed trace its mean rate ``(n - 1) / span``. A
rate *passes* when every limit holds at once:

- per-request SLOs (``ttft``, ``itl``, ``tpot``, ``e2e``, seconds): the fraction of requests
  meeting all of them (rejected requests fail) is at least ``attainment``. Rejections at
  arrival (over ``max_model_len``, over TensorRT-LLM's ``max_num_tokens``, or more KV than the
  pool) are the same at every rate: when
  they alone leave fewer than ``attainment`` of the requests, no rate passes and the first
  trial raises ``ValueError`` saying so;
- summary limits (any numeric key of :meth:`Result.summary`, e.g. ``"e2e_mean"``,
  ``"ttft_p99"``): the metric is at most the limit.

Search: from the workload's own rate (:func:`workloads.own_rate`), double until a rate fails
and halve until one passes (bracketing), then bisect in log space until the bracket is narrower
than ``tol`` (relative). After ``BURST_AFTER`` passing doublings the doublings' limit is run
once, every request arriving at time 0: if it passes, no rate fails (a workload too short to
load the configuration: a ``ValueError`` says so, where doubling ``max_steps`` times ran the
same near-burst ~50 times over). That assumes the criterion fails more as the rate grows,
which holds for a queue whose service does not get faster under load; every point tried is
returned, so a non-monotone case shows.
Tested against M/D/1, where the rate giving a mean E2E has a closed form
(tests/test_capacity.py).
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass, field, replace

import pandas as pd

from ..engine import run
from ..engine.config import as_config
from ..results.metrics import SLO_KEYS


@dataclass(frozen=True)
class Capacity:
    """The answer of :func:`max_rate`: ``rate`` (requests/s; ``nan`` when even a millionth of
    the starting rate fails: the limits cannot be met at any load, and ``reason`` says which
    limit fails with each request nearly alone, with a warning), the ``summary`` of the run at
    that rate, ``num_gpus``, ``goodput_per_gpu`` and ``points`` (one row per rate tried: rate,
    passed, the metrics the limits name)."""

    rate: float
    summary: dict
    num_gpus: int
    goodput_per_gpu: float
    points: pd.DataFrame = field(repr=False)
    reason: str = ""  # why no rate meets the limits (rate nan); "" when one does
    rate_lo: float = float("nan")  # config.bands: the rate with every step at the band's slow
    rate_hi: float = float("nan")  # end, and at its fast end (sim.engine.bands); else nan


def _no_rate_meets(summary, slo, attainment, rate) -> str:
    """Why the limits fail even at ``rate``, the lowest tried (each request nearly alone): the
    per-request limits met by too few requests (``slo_attainment_<key>``, with the metric's
    median) and the summary limits exceeded."""
    why = []
    for key, limit in slo.items():
        if key in SLO_KEYS:
            share = summary[f"slo_attainment_{key}"]
            if share < attainment:
                metric = "max_itl" if key == "itl" else key
                median = summary.get(f"{key}_p50", float("nan"))
                why.append(f"{key} <= {limit:g} s holds for {share:.1%} of requests ("
                           f"{'each gap: ' if metric == 'max_itl' else ''}P50 {key} "
                           f"{median:.4g} s)")
        elif not summary[key] <= limit:
            why.append(f"{key} is {summary[key]:.4g}, over {limit:g}")
    asked = f"the {attainment:.1%} asked is " if any(k in SLO_KEYS for k in slo) else ""
    return (f"no rate meets the SLOs, down to {rate:.4g} req/s, where each request runs nearly "
            f"alone: {'; '.join(why) or 'the limits fail together'} ({asked}out of reach of "
            f"this configuration: a faster one, or looser limits)")


def _rejected_at_any_rate(summary, n, attainment) -> str:
    """Why no rate can pass: the requests rejected at arrival (over ``max_model_len``, over
    TensorRT-LLM's ``max_num_tokens``, or more KV than the pool) are the same at every rate,
    and each fails the SLOs."""
    rejected, context = summary["num_rejected"], summary["num_rejected_context_length"]
    budget = summary.get("num_rejected_max_num_tokens", 0)
    why = ", ".join(f"{count:,} {what}" for count, what in (
        (context, "over max_model_len"), (budget, "over max_num_tokens"),
        (rejected - context - budget, "larger than the KV pool")) if count)
    return (f"{rejected:,} of {n:,} requests are rejected at any rate ({why}) and fail the "
            f"SLOs: attainment is at most {(n - rejected) / n:.1%}, below the {attainment:.1%} "
            f"asked (raise max_model_len, max_num_tokens or the KV pool, lower the attainment, "
            f"or leave those requests out)")


BURST_AFTER = 6  # passing trials from the start before the all-at-once run is tried


def _burst_passes(df, config, slo, attainment, per_request) -> bool:
    """Whether the limits hold with every request arriving at time 0: the doublings' limit
    (rate x 2^k spreads the arrivals over ``span / 2^k`` seconds from 0), run once
    instead of doubling ``max_steps`` times where no rate fails (a workload too short to load
    the configuration: a plan's well-provisioned candidates)."""
    burst = df.assign(arrival_time=0.0)
    with warnings.catch_warnings():  # (arrivals at one instant: the point here)
        warnings.simplefilter("ignore", UserWarning)
        s = run(burst, config).summary(slo=per_request)
    return _check(s, slo, attainment)


def _check(summary, slo, attainment):
    per_request = {k: v for k, v in slo.items() if k in SLO_KEYS}
    ok = True
    if per_request:
        ok = summary["slo_attainment"] >= attainment
    for key, limit in slo.items():
        if key not in SLO_KEYS:
            value = summary[key]
            ok = ok and value == value and value <= limit  # NaN fails
    return ok


def check_search(slo, attainment, tol) -> None:
    """``max_rate``'s (and ``plan``'s) own arguments: a ``ValueError`` naming the bad one."""
    if not isinstance(slo, dict) or not slo:
        raise ValueError(f"slo must be a non-empty dict of limits, got {slo!r}")
    for key, limit in slo.items():
        if isinstance(limit, bool) or not isinstance(limit, numbers.Real) or not limit > 0 \
                or math.isinf(limit):
            raise ValueError(f"slo[{key!r}] must be a positive number of seconds, got {limit!r}")
    if not 0 < attainment <= 1:
        raise ValueError(f"attainment must be in (0, 1], got {attainment!r}")
    if not 0 < tol < 1:
        raise ValueError(f"tol must be in (0, 1), got {tol!r}")


def max_rate(workload, slo, *, attainment=0.9, config=None, tol=0.01, start=None,
             max_steps=60) -> Capacity:
    """The highest rate at which ``slo`` holds (see the module docstring). ``config``: a
    :class:`SimConfig` (default ``SimConfig()``); ``start``: the first rate tried (default:
    the workload's own rate, :func:`workloads.own_rate`). ``config.bands`` (e.g. 0.9): the search runs twice more,
    with every step priced at the slow and the fast end of the cost model's measured error
    band (:mod:`sim.engine.bands`), giving ``rate_lo`` and ``rate_hi``."""
    check_search(slo, attainment, tol)
    config = as_config(config)
    if config.bands is None:
        return _max_rate(workload, slo, attainment, config, tol, start, max_steps)
    from ..engine.bands import band_info, scaled_config
    info = band_info(config)
    point = _max_rate(workload, slo, attainment, replace(config, bands=None), tol, start,
                      max_steps)
    with warnings.catch_warnings():  # (an end no rate meets is nan there, not a second warning)
        warnings.simplefilter("ignore", UserWarning)
        ends = [_max_rate(workload, slo, attainment, scaled_config(config, info[f]), tol,
                          start or (point.rate if point.rate == point.rate else None), max_steps)
                .rate for f in ("factor_hi", "factor_lo")]
    rates = [r for r in ends + [point.rate] if r == r]  # (nan: no rate meets the limits there)
    nan = float("nan")
    return replace(point, rate_lo=min(rates) if rates else nan,
                   rate_hi=max(rates) if rates else nan)


def _max_rate(workload, slo, attainment, config, tol, start, max_steps) -> Capacity:
    import workloads as wl
    if config.closed_loop is not None:  # its users issue requests on completions: no rate
        raise ValueError(f"max_rate time-scales an open loop's arrivals; config.closed_loop="
                         f"{config.closed_loop!r} issues requests as users finish (drop it, or "
                         f"vary its num_users and think_time instead)")
    probe = None
    df = wl.validate(workload)
    if len(df) < 2:
        raise ValueError("max_rate needs a workload of at least two requests")
    per_request = {k: v for k, v in slo.items() if k in SLO_KEYS} or None
    rows, results = [], {}

    def trial(rate):
        res = run(wl.scale_to_rate(df, rate), config)
        s = res.summary(slo=per_request)
        unknown = [k for k in slo if k not in SLO_KEYS and k not in s]
        if unknown:
            raise ValueError(f"slo keys {unknown} are neither per-request SLOs {SLO_KEYS} nor "
                             f"summary metrics")
        if per_request and (len(df) - s["num_rejected"]) / len(df) < attainment:
            raise ValueError(_rejected_at_any_rate(s, len(df), attainment))
        passed = _check(s, slo, attainment)
        rows.append({"rate": rate, "passed": passed,
                     **{k: s[k] for k in slo if k not in SLO_KEYS},
                     **({"slo_attainment": s["slo_attainment"]} if per_request else {})})
        results[rate] = s
        return passed

    t = df["arrival_time"].to_numpy()
    if not t[-1] > t[0]:  # (scale_to_rate's own message would tell to omit a rate)
        raise ValueError(f"max_rate time-scales the workload's arrivals, but its {len(df):,} "
                         f"requests all arrive at {t[0]:g} s: there is no rate to scale (give "
                         f"it arrival times, e.g. workloads.poisson)")
    rate = float(start) if start else wl.own_rate(df)  # (a drawn workload: its nominal rate)
    lo = hi = None
    burst = False  # whether every request at once was run (and passed)
    floor = rate / 2 ** 20  # below a millionth of the starting rate: the limits cannot be met
    for step in range(max_steps):  # bracket
        if trial(rate):
            lo = rate
            if hi is not None:
                break
            burst = step + 1 == BURST_AFTER and _burst_passes(df, config, slo, attainment,
                                                               per_request)
            if burst:
                break  # (every rate passes: the doublings' limit, run once)
            rate *= 2
        else:
            hi = rate
            if lo is not None or rate / 2 < floor:
                break
            rate /= 2
    if hi is None and lo is not None:  # every rate passed (a finite workload arriving at
        # once still meets the limits)
        raise ValueError(f"every rate tried, up to {max(results):.4g} req/s"
                         f"{' and every request at once' if burst else ''}, meets {slo}: "
                         f"{len(df):,} requests cannot load this configuration past its "
                         f"limits (give more requests or tighter limits)")
    if lo is not None and hi is not None:
        for _ in range(max_steps):  # bisect in log space
            if hi / lo - 1 <= tol:
                break
            mid = math.sqrt(lo * hi)
            if trial(mid):
                lo = mid
            else:
                hi = mid
    probe = lo
    points = pd.DataFrame(rows).sort_values("rate", ignore_index=True)
    num_gpus = config.fleet()[1]  # replicas x tensor_parallel, or both pools' GPUs
    if probe is None:
        lowest = min(results)
        reason = _no_rate_meets(results[lowest], slo, attainment, lowest)
        warnings.warn(reason, UserWarning, stacklevel=2)
        return Capacity(float("nan"), {}, num_gpus, float("nan"), points, reason)
    s = results[probe]
    goodput = s.get("goodput", s["request_throughput"])
    return Capacity(probe, s, num_gpus, goodput / num_gpus, points)
