"""``sim fit``: the roofline's efficiencies and per-iteration overhead fitted to a user's own
measured runs (``vllm bench serve``, AIPerf, guidellm result files), some files held out.

Each run (:func:`runs_of`: a file, or each benchmark of a guidellm sweep) is replayed as
``sim compare`` replays it (:func:`replay`: its workload, a closed loop of the tool's
concurrency or an open loop at the send times). A run's error is the mean absolute relative
error over ``sim compare``'s headline metrics (:data:`sim.results.bench.metrics.HEADLINE`:
TTFT, TPOT/ITL, E2E means, medians and p99s, the throughputs) that both have. The fit
minimises the mean over the fit runs of the mean squared log ratio simulated / measured over
those metrics (symmetric in over- and under-prediction) in the three terms of
:mod:`sim.costs.fitted` (two efficiency scales and the per-iteration overhead), by Hooke and
Jeeves' pattern search (:func:`pattern_search`): deterministic, a handful of replays per step, no SciPy (not
a runtime dependency; three smooth-enough terms need nothing stronger). The held-out runs
(:func:`split`) are never seen by the search; their errors before (the unfitted roofline)
and after are reported apart.

Invariants: the same files and settings give the same profile bit for bit (no clock, no
randomness: the replays are deterministic); the starting point is the unfitted roofline, and
the search only accepts a strictly lower objective, so the fit runs' objective never ends
above the roofline's.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..costs.fitted import COMPUTE_EFFS, FIT_FORMAT, MEMORY_EFFS, TERMS, fitted_roofline
from ..costs.roofline import RooflineCost
from ..engine import run
from ..engine.pool_budget import DEFAULT_GPU, DEFAULT_MODEL
from ..results.bench.metrics import HEADLINE, compare_rows, tool_metrics

MAX_EVALUATIONS = 120  # objective evaluations (each replays every fit run once)
LOG_STEP, LOG_TOL = 0.25, 0.004  # the scales' search step and its end, in log units
MAX_OVERHEAD_S = 0.5


@dataclass(frozen=True)
class Run:
    """One measured run: ``name`` (the file, ``#i`` for a sweep's benchmark) and its
    :class:`~workloads.benchmarks.common.Measured`."""

    name: str
    measured: object


@dataclass(frozen=True)
class FitResult:
    """What :func:`fit` found: ``terms`` (:data:`sim.costs.fitted.TERMS`), ``base`` (the
    roofline's), per run ``(name, split, requests, error_before, error_after)`` in ``rows``
    (errors: fractions), ``evaluations`` of the objective."""

    terms: dict
    base: dict
    rows: list
    evaluations: int

    def mean_error(self, split, which) -> float:
        errs = [r[3 if which == "before" else 4] for r in self.rows if r[1] == split]
        return float(np.mean(errs)) if errs else float("nan")


def runs_of(path) -> list:
    """The measured runs in ``path``: one, or each benchmark of a guidellm sweep."""
    import workloads
    from workloads.benchmarks.guidellm import is_guidellm
    p = Path(path)
    if p.suffix == ".json" and p.is_file():
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (ValueError, OSError):
            doc = None  # (from_benchmark says what is wrong with it)
        if is_guidellm(doc) and isinstance(doc.get("benchmarks"), list) and len(
                doc["benchmarks"]) > 1:
            return [Run(f"{p}#{i}", workloads.from_benchmark(p, index=i))
                    for i in range(len(doc["benchmarks"]))]
    return [Run(str(p), workloads.from_benchmark(p))]


def split(runs, holdout=None):
    """``(fit, held_out)``: ``holdout`` runs (default: a quarter, at least one of two or more)
    held out, evenly spaced in the given order, the rest fitted to."""
    n = len(runs)
    if holdout is None:
        holdout = n // 4 if n >= 4 else int(n >= 2)
    if not 0 <= holdout < n:
        raise ValueError(f"holdout must be an integer in [0, {n - 1}] for {n} measured "
                         f"run{'s' * (n != 1)} (at least one to fit to), got {holdout!r}")
    out = {int((j + 0.5) * n / holdout) for j in range(holdout)}
    return ([r for i, r in enumerate(runs) if i not in out],
            [r for i, r in enumerate(runs) if i in out])


def replay_config(cfg, measured):
    """``cfg`` as the measured run sent its requests: a closed loop of the tool's concurrency,
    else (an open loop at the workload's arrivals) ``cfg`` itself."""
    import workloads
    if measured.concurrency is None:
        return cfg
    return dataclasses.replace(cfg, closed_loop=workloads.ClosedLoop(measured.concurrency))


def replay(measured, cfg):
    """The simulated run of ``measured``'s workload under ``cfg``."""
    return run(measured.workload, replay_config(cfg, measured))


def _rows(measured, result):
    keys = HEADLINE[measured.tool]
    return [r for r in compare_rows(measured.metrics, tool_metrics(result, measured.tool), keys)
            if r[1] > 0 and r[2] > 0 and math.isfinite(r[1]) and math.isfinite(r[2])]


def run_error(measured, result) -> float:
    """Mean absolute relative error over the headline metrics both have (NaN: none)."""
    rows = _rows(measured, result)
    return float(np.mean([abs(r[3]) for r in rows])) if rows else float("nan")


def run_loss(measured, result) -> float:
    """Mean squared log ratio simulated / measured over the same metrics."""
    rows = _rows(measured, result)
    if not rows:
        raise ValueError(f"{measured.source}: no headline metric of {measured.tool} in common "
                         f"with the simulation: nothing to fit to")
    return float(np.mean([math.log(r[2] / r[1]) ** 2 for r in rows]))


def pattern_search(f, x0, steps, lower, upper, tol, max_evaluations):
    """Minimise ``f`` from ``x0`` within the box [``lower``, ``upper``] by Hooke and Jeeves'
    pattern search: explore each coordinate +- its step, keeping each strictly better point;
    after a successful exploration, jump again along the move just made (the pattern: it
    follows a valley two terms trade off in, here a bandwidth efficiency against the
    overhead) and explore there; when nothing is better, halve every step. Stops when every
    step is below its ``tol`` or after ``max_evaluations`` calls of ``f``. Deterministic.
    Returns ``(x, f(x), evaluations)``."""
    lower, upper = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    step = np.array(steps, dtype=np.float64)
    seen, calls = {}, [0]

    def value(point):
        key = tuple(point.tolist())
        if key not in seen:
            if calls[0] >= max_evaluations:
                return math.inf  # (over budget: never better)
            calls[0] += 1
            seen[key] = f(point)
        return seen[key]

    def explore(x, fx):
        for i in range(len(x)):
            for sign in (1.0, -1.0):
                y = x.copy()
                y[i] = min(max(x[i] + sign * step[i], lower[i]), upper[i])
                if y[i] != x[i] and value(y) < fx:
                    x, fx = y, value(y)
                    break
        return x, fx

    base = np.clip(np.array(x0, dtype=np.float64), lower, upper)
    fb = value(base)
    while calls[0] < max_evaluations and (step > tol).any():
        x, fx = explore(base, fb)
        if not fx < fb:
            step = step / 2
            continue
        while fx < fb:  # pattern moves while they keep improving
            previous, base, fb = base, x, fx
            jump = np.clip(2 * base - previous, lower, upper)
            x, fx = explore(jump, value(jump))
    return base, fb, calls[0]


def _upper_scale(params, names, extra=()):
    effs = [getattr(params, n) for n in names if getattr(params, n) is not None] + list(extra)
    return math.log(1.0 / min(effs))  # past it no efficiency changes: every one is at 1


def fit(runs, cfg, holdout=None, max_evaluations=MAX_EVALUATIONS) -> FitResult:
    """Fit :data:`sim.costs.fitted.TERMS` to ``runs`` (:func:`runs_of`'s) under ``cfg`` (a
    ``SimConfig`` whose cost model is the roofline: ``cost_model`` None), ``holdout`` runs
    held out (:func:`split`)."""
    if cfg.cost_model is not None:
        raise ValueError("sim fit fits the roofline: leave the cost model unset (no --cost, "
                         "no --profile)")
    if isinstance(max_evaluations, bool) or not isinstance(max_evaluations, int) or \
            max_evaluations < 1:
        raise ValueError(f"max_evaluations must be an integer >= 1, got {max_evaluations!r}")
    fit_runs, held = split(runs, holdout)
    shape = dict(tensor_parallel=cfg.tensor_parallel, weight_dtype=cfg.weight_dtype,
                 kv_dtype=cfg.kv_dtype)
    model, gpu = cfg.model or DEFAULT_MODEL, cfg.gpu or DEFAULT_GPU
    base = RooflineCost(model, gpu, **shape).params

    def priced(terms):
        return dataclasses.replace(cfg, cost_model=fitted_roofline(terms, model, gpu, **shape))

    def terms_of(x):
        return dict(zip(TERMS, (math.exp(x[0]), math.exp(x[1]), float(x[2]))))

    def objective(x):
        c = priced(terms_of(x))
        return float(np.mean([run_loss(r.measured, replay(r.measured, c)) for r in fit_runs]))

    o0 = base.overhead_s
    x0 = (0.0, 0.0, o0)
    lower = (math.log(0.05), math.log(0.05), 0.0)
    upper = (_upper_scale(base, COMPUTE_EFFS),
             _upper_scale(base, MEMORY_EFFS, base.elementwise_eff.values()), MAX_OVERHEAD_S)
    x, _, evaluations = pattern_search(objective, x0, (LOG_STEP, LOG_STEP, max(o0, 1e-3)),
                                       lower, upper, (LOG_TOL, LOG_TOL, 1e-5), max_evaluations)
    terms, base_terms = terms_of(x), terms_of(x0)
    rows = []
    for label, group in (("fit", fit_runs), ("held-out", held)):
        for r in group:
            before = run_error(r.measured, replay(r.measured, priced(base_terms)))
            after = run_error(r.measured, replay(r.measured, priced(terms)))
            rows.append((r.name, label, len(r.measured.workload), before, after))
    return FitResult(terms, base_terms, rows, evaluations)


def profile_doc(result: FitResult, cfg) -> dict:
    """The fit profile ``sim run --profile`` reads (:mod:`sim.costs.fitted`), with what it
    was fitted to and its errors (percent)."""
    pct = lambda v: None if v != v else round(100 * v, 4)  # noqa: E731
    return {"format": FIT_FORMAT, "terms": result.terms, "roofline_terms": result.base,
            "fitted_to": {"model": cfg.model, "gpu": cfg.gpu,
                          "tensor_parallel": cfg.tensor_parallel,
                          "weight_dtype": cfg.weight_dtype, "kv_dtype": cfg.kv_dtype,
                          "scheduler": repr(cfg.policy())},
            "metrics": "sim compare's headline metrics (mean absolute relative error)",
            "runs": [{"run": n, "split": s, "requests": k, "error_before_pct": pct(b),
                      "error_after_pct": pct(a)} for n, s, k, b, a in result.rows],
            "error_pct": {s: {"before": pct(result.mean_error(s, "before")),
                              "after": pct(result.mean_error(s, "after"))}
                          for s in ("fit", "held-out")},
            "evaluations": result.evaluations}
