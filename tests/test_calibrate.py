import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.cli import main
from sim.costs.calibrated import (PROFILE_FORMAT, TERMS, CalibratedCost, _bilinear,
                                  _loglog_interp, shipped_cpu_profile)
from sim.costs.timing import QUICK_GRID, _fit_and_holdout, save_profile
from sim.tools.calibration import (MAX_HELDOUT_MEDIAN_PCT, MAX_ITERATION_MEDIAN_PCT,
                                   CalibrationProgress, calibrate, fit_weights, quality_gate)
from sim.tools.validation import METRICS, validate_profile

SMALL_GRID = QUICK_GRID


EVENTS = []  # small_profile's progress reports


@pytest.fixture(scope="module")
def small_profile():
    return calibrate(budget_s=1.0, device="cpu", grid=SMALL_GRID, engine_requests=60,
                     on_progress=EVENTS.append)


def test_calibrate_reports_each_pass_then_the_engine_fit(small_profile):
    """One report per timing pass (numbered, the ops timed, the timer's seconds so far, the
    budget), then one as the engine fit begins; checked against the profile, not a clock."""
    timing = [e for e in EVENTS if e.stage == "timing"]
    num_ops = sum(len(points) for points in SMALL_GRID.values())
    assert [e.passes for e in timing] == list(range(1, small_profile["passes"] + 1))
    assert {(e.num_ops, e.budget_s) for e in timing} == {(num_ops, 1.0)}
    assert all(a.elapsed_s < b.elapsed_s for a, b in zip(timing, timing[1:]))
    assert timing[-1].elapsed_s <= small_profile["seconds"] + 0.05  # rounded to 0.1 s
    assert EVENTS[-1] == CalibrationProgress("engine", small_profile["passes"], num_ops,
                                             small_profile["seconds"], 1.0, 60)
    assert len(EVENTS) == len(timing) + 1


def test_profile_has_device_versions_grid_fit_and_heldout_error(small_profile):
    p = small_profile
    assert p["format"] == PROFILE_FORMAT and p["device"].startswith("cpu")
    assert p["array_library"] == "numpy" and "numpy" in p["library_versions"]
    assert p["model"]["name"] == "cpu-tiny" and p["dtype"] == "float32"
    for op in SMALL_GRID:
        g = p["grid"][op]
        assert len(g["points"]) == len(SMALL_GRID[op]) and all(t > 0 for t in g["median_s"])
        e = p["heldout_error"][op]
        assert e["points"] >= 1 and np.isfinite(e["median_ape_pct"])
    assert set(p["weights"]) == set(TERMS)
    assert all(w >= 0 for w in p["weights"].values())  # the non-negative fit
    q = p["quality"]  # the gate's verdict (either way on a loaded machine)
    assert q["passed"] == (not q["failures"]) and q["accepted"] is False
    assert p["iteration_error"]["points"] > 50  # iterations executed in the engine
    assert p["passes"] >= 3


def test_interpolation_is_exact_on_power_laws():
    xs = np.array([1.0, 4.0, 16.0, 64.0])
    assert np.allclose(_loglog_interp([2.0, 30.0, 128.0], xs, 3e-4 * xs ** 1.5),
                       3e-4 * np.array([2.0, 30.0, 128.0]) ** 1.5)
    # 2-D tables: exact for t = a b^x L^y on the (log b, log L) axes
    pts = [(b, L) for b in (1, 2, 4, 8, 16) for L in (16, 64, 256, 1024, 4096)]
    t = [1e-5 * b ** 0.8 * L ** 1.2 for b, L in pts]
    model, err = _fit_and_holdout("decode_attention", pts, t, seed=0)
    assert err["median_ape_pct"] < 1e-6 and err["points"] >= 5
    assert _bilinear(6.0, 300.0, model) == pytest.approx(1e-5 * 6 ** 0.8 * 300 ** 1.2)
    # prefill table: linear in the cached prefix p
    pts = [(c, p) for c in (8, 32, 128, 512) for p in (0, 128, 512, 1024, 2048)]
    t = [1e-6 * c ** 1.1 * (1 + p / 100) for c, p in pts]
    model, err = _fit_and_holdout("prefill_attention", pts, t, seed=1)
    p_kept = model["y"][1]  # on a kept grid line in p, exact in c
    assert _bilinear(64.0, p_kept, model) == pytest.approx(1e-6 * 64 ** 1.1 * (1 + p_kept / 100),
                                                           rel=1e-9)
    assert _bilinear(64.0, 700.0, model) == pytest.approx(1e-6 * 64 ** 1.1 * 8, rel=0.15)


def test_calibrated_cost_is_weights_dot_terms(small_profile):
    cost = CalibratedCost(small_profile)
    terms = cost.terms(prefills=[(64, 100)], decode_lengths=[30, 200])
    assert terms[TERMS.index("base_s")] == 1.0
    assert terms[TERMS.index("per_seq_s")] == 3
    assert terms[TERMS.index("per_block_s")] == -(-164 // 16) + 2 + 13
    assert terms[TERMS.index("linear")] == pytest.approx(
        _loglog_interp(66.0, *(np.asarray(small_profile["fit"]["linear"][k]) for k in "xy")))
    assert cost.predict([(64, 100)], [30, 200]) == pytest.approx(terms @ cost.weights)
    # larger batches: the counted terms grow; the timed ones come from a 1-second calibration,
    # and on a loaded machine a timing table need not be monotone (seen: lm_head 8.1 ms at one
    # sequence, 0.42 ms at eight), so only their prices' sign is certain: >= 0
    small, more, mixed = ([], [30]), ([], [30] * 8), ([(256, 0)], [30] * 8)
    counts = [TERMS.index(k) for k in ("base_s", "per_seq_s", "per_block_s")]
    assert (cost.terms(*small)[counts] <= cost.terms(*more)[counts]).all()
    assert (cost.terms(*more)[counts] <= cost.terms(*mixed)[counts]).all()
    assert min(cost.predict(*small), cost.predict(*more), cost.predict(*mixed)) >= 0


def test_profile_file_round_trip_and_sim_run_profile(small_profile, tmp_path, capsys):
    path = save_profile(small_profile, tmp_path / "p.json")
    cost = CalibratedCost.from_file(path)
    assert cost.predict([(10, 0)], []) > 0
    assert main(["run", "-w", "azure-conv", "-n", "100", "--profile", str(path), "--no-plots",
                 "-o", str(tmp_path / "o")]) == 0
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert "CalibratedCost" in s["settings"]["cost_model"]
    with pytest.raises(ValueError, match="does not exist"):
        CalibratedCost.from_file(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a calibration profile"):
        CalibratedCost.from_file(tmp_path / "bad.json")


def test_shipped_cpu_profile_is_labelled_and_usable():
    p = json.loads(Path(str(shipped_cpu_profile())).read_text())
    assert p["device"].startswith("cpu") and p["array_library"] == "numpy"
    assert p["budget_s"] >= 60 and p["passes"] >= 3
    for op in ("linear", "decode_attention", "prefill_attention"):
        assert p["heldout_error"][op]["median_ape_pct"] < 10
    assert CalibratedCost(p).predict([(128, 0)], [100] * 4) > 0


def test_validate_mechanics_small(small_profile):
    out = validate_profile(small_profile, n=30, repeats=2, target_load=0.4)
    t = out["table"]
    assert list(t.index) == METRICS
    assert {"executed", "executed_min", "executed_max", "simulated", "error_pct"} <= set(t.columns)
    assert (t["executed_min"] <= t["executed"]).all() and (t["executed"] <= t["executed_max"]).all()
    assert out["iterations_executed"] == len(out["per_iteration"])
    assert (out["per_iteration"]["predicted"] > 0).all()
    # both runs served the same requests
    assert len(out["simulated"].requests) == len(out["executed"][0].requests) == 30


def test_gpu_check_script_runs_its_pipeline_on_the_cpu(tmp_path, load_script, capsys):
    gpu_check = load_script("experiments/gpu_check.py")
    s = gpu_check.main(["--device", "cpu", "--budget", "1", "-n", "20", "--repeats", "1",
                        "--engine-requests", "30", "--quick", "-o", str(tmp_path)])
    assert s["kernels_passed"]
    printed = capsys.readouterr().out  # a line per timing pass, one as the engine fit begins,
    # in sim calibrate's words (sim.cli.device.progress_line), after the seconds since the start
    assert "] calibrating: pass 3: 26 ops timed, " in printed and " of the 1 s budget" in printed
    assert "fitting the weights on an executed engine run of 30 requests" in printed
    for f in ("kernel_check.json", "profile.json", "validation.csv", "summary.json"):
        assert (tmp_path / f).exists()
    assert len(pd.read_csv(tmp_path / "validation.csv")) == len(METRICS)


# -- the in-engine fit and the quality gate, on synthetic numbers (nothing timed) -------------
def synthetic_terms(n=400, seed=0):
    """Iteration terms shaped like real ones (TERMS order): table times, 1, counts."""
    rng = np.random.default_rng(seed)
    seqs = rng.integers(1, 17, n)
    return np.column_stack([rng.uniform(2e-4, 5e-3, n), 1e-5 * np.sqrt(seqs),
                            rng.uniform(0, 2e-3, n), rng.uniform(0, 3e-3, n), np.ones(n), seqs,
                            seqs * rng.integers(1, 40, n)]).astype(float)


def test_fit_weights_recovers_nonnegative_weights():
    x = synthetic_terms()
    true = np.array([1.1, 0.9, 1.3, 1.0, 2e-4, 1e-5, 2e-7])
    weights, err = fit_weights(x, x @ true)
    assert list(weights) == list(TERMS)
    assert np.allclose([weights[k] for k in TERMS], true, rtol=1e-6, atol=1e-12)
    assert err["median_ape_pct"] < 1e-6 and err["points"] == len(x)


def test_fit_weights_never_goes_negative_and_keeps_the_total():
    """The busy-machine case: the measured times look like a steeper line with a negative
    intercept (plain least squares: base_s ~ -3.4 ms, priced iterations below zero)."""
    x = synthetic_terms(seed=1)
    y = 1.5 * x[:, 0] + x[:, 2] + x[:, 3] - 0.00034  # all measured times still > 0
    assert (y > 0).all()
    plain = np.linalg.lstsq(x, y, rcond=None)[0]
    assert plain[TERMS.index("base_s")] < 0
    weights, _ = fit_weights(x, y)
    w = np.array([weights[k] for k in TERMS])
    assert (w >= 0).all()
    # priced iterations >= 0 for any terms >= 0, e.g. the smallest batch one can form
    assert (synthetic_terms(n=1000, seed=2) @ w >= 0).all()
    assert (x @ w).sum() == pytest.approx(y.sum(), rel=1e-6)  # the total-time row


def test_fit_weights_refuses_bad_input():
    x = synthetic_terms(n=10)
    with pytest.raises(ValueError, match="terms must be"):
        fit_weights(x[:, :3], np.ones(10))
    with pytest.raises(ValueError, match="measured times > 0"):
        fit_weights(x, np.zeros(10))


def gate_profile(heldout=1.0, iteration=2.0):
    err = lambda v: {"median_ape_pct": v, "p90_ape_pct": 2 * v, "points": 9}  # noqa: E731
    return {"heldout_error": {op: err(heldout) for op in SMALL_GRID},
            "iteration_error": err(iteration)}


def test_quality_gate_thresholds():
    assert quality_gate(gate_profile())["passed"]
    edge = gate_profile(MAX_HELDOUT_MEDIAN_PCT, MAX_ITERATION_MEDIAN_PCT)
    assert quality_gate(edge) == {"passed": True, "failures": [], "accepted": False,
                                  "max_heldout_median_ape_pct": MAX_HELDOUT_MEDIAN_PCT,
                                  "max_iteration_median_ape_pct": MAX_ITERATION_MEDIAN_PCT}
    q = quality_gate(gate_profile(heldout=MAX_HELDOUT_MEDIAN_PCT + 0.1))
    assert not q["passed"] and len(q["failures"]) == len(SMALL_GRID)
    assert "decode_attention held-out median error" in " ".join(q["failures"])
    q = quality_gate(gate_profile(iteration=float("nan")))
    assert not q["passed"] and q["failures"] == ["in-engine median error nan% > 10%"]
    assert quality_gate(gate_profile(iteration=30), max_iteration_pct=40)["passed"]


@pytest.mark.parametrize("iteration, accept, status", [(2.0, False, 0), (35.0, False, 1),
                                                       (35.0, True, 0)])
def test_sim_calibrate_exits_nonzero_on_a_failed_gate_unless_accepted(
        monkeypatch, tmp_path, capsys, iteration, accept, status):
    def fake_calibrate(model, **kwargs):  # the CLI's gate logic, without timing anything
        p = dict(gate_profile(iteration=iteration), device="fake", array_library="numpy",
                 model={"name": "toy"}, passes=3, seconds=0.0,
                 weights={k: 0.0 for k in TERMS})
        p["quality"] = quality_gate(p)
        return p
    monkeypatch.setattr("sim.tools.calibration.calibrate", fake_calibrate)
    out = tmp_path / "p.json"
    args = ["calibrate", "-o", str(out)] + (["--accept"] if accept else [])
    assert main(args) == status
    saved = json.loads(out.read_text())["quality"]  # written either way, with the verdict
    assert saved["passed"] == (iteration < MAX_ITERATION_MEDIAN_PCT)
    assert saved["accepted"] == (accept and not saved["passed"])
    err = capsys.readouterr().err
    assert ("FAILED" in err) == (not saved["passed"])


def test_sim_calibrate_prints_a_progress_line_per_pass_on_stderr(monkeypatch, tmp_path, capsys):
    """``sim calibrate`` printed nothing until it ended (minutes; newcomer review): a line per
    pass and one as the engine fit begins, on stderr, from the reports calibrate makes (a fake
    here: no timing, no clock)."""
    def fake_calibrate(model, *, on_progress, budget_s, **kwargs):
        for k in (1, 2, 3):
            on_progress(CalibrationProgress("timing", k, 42, 12.5 * k, budget_s))
        on_progress(CalibrationProgress("engine", 3, 42, 37.5, budget_s, 300))
        p = dict(gate_profile(iteration=2.0), device="fake", array_library="numpy",
                 model={"name": "toy"}, passes=3, seconds=37.5,
                 weights={k: 0.0 for k in TERMS})
        p["quality"] = quality_gate(p)
        return p
    monkeypatch.setattr("sim.tools.calibration.calibrate", fake_calibrate)
    assert main(["calibrate", "--budget", "40", "-o", str(tmp_path / "p.json")]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "calibrating: pass 1: 42 ops timed, 12.5 s of the 40 s budget",
        "calibrating: pass 2: 42 ops timed, 25.0 s of the 40 s budget",
        "calibrating: pass 3: 42 ops timed, 37.5 s of the 40 s budget",
        "calibrating: 3 passes timed in 37.5 s; fitting the weights on an executed engine run "
        "of 300 requests ...",
    ]
    assert "calibrating:" not in captured.out
