import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.cli import main
from sim.costs.calibrated import (PROFILE_FORMAT, TERMS, CalibratedCost, _bilinear,
                                  _loglog_interp, shipped_cpu_profile)
from sim.costs.timing import QUICK_GRID, _fit_and_holdout, save_profile
from sim.tools.calibration import calibrate
from sim.tools.validation import METRICS, validate_profile

SMALL_GRID = QUICK_GRID


@pytest.fixture(scope="module")
def small_profile():
    return calibrate(budget_s=1.0, device="cpu", grid=SMALL_GRID, engine_requests=60)


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
    assert cost.predict([], [30]) < cost.predict([], [30] * 8) < cost.predict([(256, 0)], [30] * 8)


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


def test_gpu_check_script_runs_its_pipeline_on_the_cpu(tmp_path, load_script):
    gpu_check = load_script("experiments/gpu_check.py")
    s = gpu_check.main(["--device", "cpu", "--budget", "1", "-n", "20", "--repeats", "1",
                        "--engine-requests", "30", "--quick", "-o", str(tmp_path)])
    assert s["kernels_passed"]
    for f in ("kernel_check.json", "profile.json", "validation.csv", "summary.json"):
        assert (tmp_path / f).exists()
    assert len(pd.read_csv(tmp_path / "validation.csv")) == len(METRICS)


@pytest.mark.perf
def test_cpu_validation_within_10_percent():
    """Calibrate for 60 s, then execute vs simulate (about 4 minutes; machine noise matters)."""
    out = validate_profile(calibrate(budget_s=60, device="cpu"))
    err = out["table"]["error_pct"].abs()
    print(out["table"].to_string())
    for m in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99"):
        assert err[m] <= 10, (m, out["table"])
