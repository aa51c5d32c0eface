"""Calibration on this device: time the kernels, then fit how they add up in real iterations.

:func:`calibrate` = :func:`sim.costs.timing.measure_kernels` (isolated kernel tables with
held-out errors) + :func:`fit_in_engine`: the engine runs a calibration workload with every
iteration *executed* for real (:class:`~sim.costs.executor.ExecutedCost`), and a least-squares
fit gives the weight of each op inside real iterations (caches are colder, threads contend)
plus the executor's bookkeeping per iteration, per sequence and per KV block. Every weight is
>= 0 (a non-negative least-squares fit, :func:`fit_weights`), so no priced iteration is below
zero. :func:`quality_gate` compares the held-out and in-engine errors with thresholds and the
profile records its verdict (``profile["quality"]``); ``sim calibrate`` exits non-zero on a
failed gate unless ``--accept``. The result is a profile (a dict;
:func:`sim.costs.timing.save_profile` writes it) that :class:`~sim.costs.calibrated.CalibratedCost`
prices batches from; ``sim run --profile`` uses it.

This module runs the engine, so it lives above it (tools), not among the cost models.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..costs.calibrated import TERMS, CalibratedCost
from ..costs.executor import ExecutedCost, Executor
from ..costs.kernels import array_module
from ..costs.timing import CPU_MODEL, GRID, ape, measure_kernels, nonneg_lstsq, pool_blocks
from ..engine import run
from ..numerics import dot
from ..specs.models import get_model

ENGINE = dict(scheduler="chunked", chunk_size=256, max_batch_size=16, kv_blocks=2048)
# The quality gate's thresholds (median absolute percentage errors): each op's held-out grid
# points, and the executed engine iterations. The shipped CPU profile has 1.4-19.2% held-out
# (lm_head: 2 held-out points) and 4.6% in-engine.
MAX_HELDOUT_MEDIAN_PCT = 20.0
MAX_ITERATION_MEDIAN_PCT = 10.0


@dataclass(frozen=True, slots=True)
class CalibrationProgress:
    """What :func:`calibrate` tells its ``on_progress`` callback: ``stage`` ``"timing"`` after
    each pass over the kernels (``passes`` done, ``num_ops`` timed in each, ``elapsed_s`` of
    the timer since timing began, of ``budget_s``), then ``"engine"`` once, as the in-engine fit
    begins (``num_requests`` executed requests; the timing fields keep their last values)."""

    stage: str
    passes: int
    num_ops: int
    elapsed_s: float
    budget_s: float
    num_requests: int = 0


def calibrate(model=None, *, budget_s=120.0, device="auto", dtype=None, block_size=16,
              seed=0, progress=False, grid=None, engine_requests=300, on_progress=None,
              timer=time.perf_counter) -> dict:
    """Time the grid within about ``budget_s`` seconds, then fit the op weights on an engine
    run of ``engine_requests`` executed requests; return the profile (a dict).
    ``on_progress``: a callable given a :class:`CalibrationProgress` after each timing pass and
    once before the engine fit (this module prints nothing; ``sim calibrate`` prints a line
    each). ``timer``: the clock of the kernel timing (tests inject one)."""
    if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not budget_s > 0:
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}")
    xp, device_name = array_module(device)
    model = get_model(model) if model is not None else CPU_MODEL
    grid = grid or GRID
    need = max(pool_blocks(grid, block_size), ENGINE["kv_blocks"] + 64)  # + fit_in_engine
    ex = Executor(model, num_blocks=need, block_size=block_size, xp=xp,
                  dtype=dtype or "float32", seed=seed)
    num_ops = sum(len(points) for points in grid.values())
    on_pass = None if on_progress is None else (lambda passes, elapsed: on_progress(
        CalibrationProgress("timing", passes, num_ops, elapsed, budget_s)))
    profile = measure_kernels(ex, device_name, budget_s=budget_s, seed=seed, grid=grid,
                              progress=progress, timer=timer, on_pass=on_pass)
    if on_progress is not None:
        on_progress(CalibrationProgress("engine", profile["passes"], num_ops,
                                        profile["seconds"], budget_s, engine_requests))
    profile["weights"], profile["iteration_error"] = fit_in_engine(ex, profile, seed,
                                                                    n=engine_requests)
    profile["quality"] = quality_gate(profile)
    return profile


def quality_gate(profile, max_heldout_pct=MAX_HELDOUT_MEDIAN_PCT,
                 max_iteration_pct=MAX_ITERATION_MEDIAN_PCT) -> dict:
    """The gate's verdict on a profile: ``passed`` when every op's held-out median error is at
    most ``max_heldout_pct`` and the in-engine median error at most ``max_iteration_pct``;
    ``failures`` says which were not; ``accepted`` (set by ``sim calibrate --accept``) False."""
    failures = []
    for op, e in profile["heldout_error"].items():
        if not e["median_ape_pct"] <= max_heldout_pct:
            failures.append(f"{op} held-out median error {e['median_ape_pct']:.1f}% > "
                            f"{max_heldout_pct:g}%")
    e = profile.get("iteration_error")
    if e is None:
        failures.append("no in-engine fit")
    elif not e["median_ape_pct"] <= max_iteration_pct:
        failures.append(f"in-engine median error {e['median_ape_pct']:.1f}% > "
                        f"{max_iteration_pct:g}%")
    return {"passed": not failures, "failures": failures, "accepted": False,
            "max_heldout_median_ape_pct": max_heldout_pct,
            "max_iteration_median_ape_pct": max_iteration_pct}


def engine_workload(n, rate, seed=0):
    """The synthetic workload calibration and validation run through the engine."""
    import workloads as wl
    return wl.synthetic(n, rate=rate, prompt=wl.LogNormal(300, 0.8, max_tokens=1500),
                        output=wl.LogNormal(48, 0.8, max_tokens=256), seed=seed)


def rate_for_load(cost, n, target=0.6, seed=0, **engine):
    """The arrival rate at which ``cost`` keeps the replica ``target`` busy (bisection) on
    :func:`engine_workload` drawn with ``seed`` (the engine's own settings: ``engine``)."""
    lo, hi = 0.1, 1000.0
    for _ in range(16):
        mid = (lo * hi) ** 0.5
        busy = run(engine_workload(n, mid, seed), cost_model=cost,
                   **engine).summary()["busy_fraction"]
        lo, hi = (lo, mid) if busy > target else (mid, hi)
    return lo


class _Recorder:
    """Prices each executed batch with the profile's unweighted terms, keeping the terms."""

    needs_decode_lengths = True

    def __init__(self, parts):
        self.parts, self.terms = parts, []

    def __call__(self, batch):
        self.terms.append(self.parts.batch_terms(batch))
        return dot(self.terms[-1], self.parts.weights)  # as CalibratedCost prices it


def fit_weights(terms, measured):
    """``(weights, iteration_error)``: each term's weight in ``measured = terms @ weights``
    (one row per executed iteration), every weight >= 0 (:func:`~sim.costs.timing.nonneg_lstsq`).
    Terms are >= 0, so every price is too. The total predicted time must equal the total
    measured (queueing amplifies any bias in it): with ``base_s > 0`` the fit's optimality
    condition on that all-ones column already makes the residuals sum to zero; when the bound
    holds ``base_s`` at 0 instead, the weights are scaled by ``sum(measured) / sum(predicted)``
    (a positive factor: still >= 0)."""
    x = np.asarray(terms, dtype=np.float64)
    y = np.asarray(measured, dtype=np.float64)
    if x.ndim != 2 or x.shape != (len(y), len(TERMS)):
        raise ValueError(f"terms must be (iterations, {len(TERMS)}) like measured, got "
                         f"{x.shape} and {y.shape}")
    if (x < 0).any() or not (y > 0).all():
        raise ValueError("terms must be >= 0 and measured times > 0")
    coef = nonneg_lstsq(x, y)
    total = float((x @ coef).sum())
    if total > 0:
        coef = coef * (float(y.sum()) / total)
    return dict(zip(TERMS, (float(v) for v in coef))), ape(x @ coef, y)


def fit_in_engine(ex, profile, seed, n=300, target_load=0.5):
    """Run the engine on a calibration workload with every iteration *executed* here, and fit
    how the isolated op timings add up inside real iterations: a weight per op plus the
    executor's bookkeeping (per iteration, per sequence, per KV block), all >= 0
    (:func:`fit_weights`). Returns ``(weights, iteration_error)``."""
    parts = CalibratedCost(dict(profile, weights={}))
    engine = dict(ENGINE, block_size=ex.block_size)  # (the seed draws the workload only)
    rate = rate_for_load(parts, n, target_load, seed + 1000, **engine)
    recorder = _Recorder(parts)
    executed = ExecutedCost(ex, predictor=recorder)
    run(engine_workload(n, rate, seed + 1000), cost_model=executed, **engine)
    return fit_weights(recorder.terms, np.asarray(executed.records)[:, 0])
