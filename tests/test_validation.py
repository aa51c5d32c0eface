"""sim.tools.validation: executed vs simulated runs, and the simulation at the executed speed.

Nothing here asserts a timing: the unit test checks the mechanics on a tiny run; the perf test
(``pytest -m perf -k cpu_validation``) states what a shared 2-core VM lets it claim.
"""

import numpy as np
import pytest

from sim.costs.calibrated import TERMS, CalibratedCost, shipped_cpu_profile
from sim.engine.core.batch import Batch
from sim.tools.calibration import calibrate
from sim.tools.validation import METRICS, validate_profile


def test_the_simulation_at_speed_scales_every_price_by_the_measured_ratio():
    cost = CalibratedCost.from_file(shipped_cpu_profile())
    out = validate_profile(cost, n=16, repeats=1, rate=2.0)  # a rate: no bisection
    it = out["per_iteration"]
    # the speed ratio is the executed batches' measured time over their calibrated price
    assert out["speed_ratio"] == pytest.approx(it["duration"].sum() / it["predicted"].sum())
    t = out["table"]
    assert list(t.index) == METRICS
    assert {"simulated_at_speed", "error_at_speed_pct", "noise_pct"} <= set(t.columns)
    assert np.allclose(t["error_at_speed_pct"],
                       (t["simulated_at_speed"] / t["executed"] - 1) * 100)
    # the at-speed run is the calibrated model with every weight times the ratio: each of its
    # iterations costs ratio x the plain price of the same batch
    s = out["speed_ratio"]
    scaled = CalibratedCost(dict(cost.profile, weights={
        k: float(w) * s for k, w in zip(TERMS, cost.weights)}))
    for batch in (Batch(0, [(300, 0)], 300, 0, 0), Batch(0, [(64, 512)], 64, 0, 0)):
        assert scaled(batch) == pytest.approx(s * cost(batch))
    # every run served the same requests
    assert len(out["simulated_at_speed"].requests) == len(out["executed"][0].requests) == 16


@pytest.mark.perf
def test_cpu_validation_within_10_percent():
    """Calibrate for 60 s, then execute vs simulate (the calibration alone took 3.5-6 minutes
    on the busy build VM). What it can claim on a shared 2-core VM: a calibration on a busy
    machine fails its quality gate (measured twice at load 3-8: held-out medians 24-47 %,
    in-engine 159-207 %, weights that make no sense), and validating such a profile measures
    the machine, not the model, so the test skips with the gate's reasons. With a profile that
    passed: each executed batch's price within 10 % (median), and the latency percentiles within
    10 % once the simulation runs at the speed the machine ran at during the execution (one
    measured ratio, reported; the plain comparison also carries the machine's drift since
    calibration, which queueing amplifies)."""
    profile = calibrate(budget_s=60, device="cpu")
    q = profile["quality"]
    if not q["passed"]:
        pytest.skip("calibration failed its quality gate, the machine is too busy to time "
                    "kernels: " + "; ".join(q["failures"]))
    out = validate_profile(profile)
    t = out["table"]
    print(f"speed ratio {out['speed_ratio']:.3f}; per-iteration {out['iteration_error']}")
    print(t.to_string())
    assert out["iteration_error"]["median_ape_pct"] <= 10, out["iteration_error"]
    for m in ("ttft_p50", "e2e_p50"):
        assert abs(t.loc[m, "error_at_speed_pct"]) <= 10, (m, t)
    for m in ("ttft_p99", "e2e_p99"):  # tails: 10 % beyond the repeats' own spread
        assert abs(t.loc[m, "error_at_speed_pct"]) <= 10 + t.loc[m, "noise_pct"], (m, t)
