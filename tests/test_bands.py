"""Error bands (sim.engine.bands): the band holds the point estimate, widens near the knee as
M/D/1 says, reaches sweeps and capacity search, and bands=None changes nothing."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import sim
from sim.engine.bands import ScaledCost, band_factors, step_factors
from sim.results.diagnose import diagnose
from sim.tools.capacity import max_rate

D = 0.01  # one iteration of D seconds per request at batch 1: an M/D/1 queue


def _poisson(n, rate, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"arrival_time": np.cumsum(rng.exponential(1 / rate, n)),
                         "num_prompt_tokens": 8, "num_output_tokens": 1})


def _md1_e2e(rho, d):
    """Mean E2E of M/D/1 (Pollaczek-Khinchine): d + rho d / (2 (1 - rho))."""
    return d + rho * d / (2 * (1 - rho))


CFG = sim.SimConfig(scheduler="continuous", cost_model=sim.ConstantCost(D), max_batch_size=1,
                    gpu="h100")


def test_factors_come_from_the_held_out_rows_of_the_gpu():
    own, assumed = step_factors("a100")
    assert not assumed and len(own) > 20
    every, assumed = step_factors("l40s")  # no measurement of its own: every GPU's, assumed
    assert assumed and len(every) > len(own)
    b = band_factors(0.9, "a100")
    assert b["factor_lo"] == pytest.approx(np.quantile(own, 0.05))
    assert b["factor_hi"] == pytest.approx(np.quantile(own, 0.95))
    narrow = band_factors(0.5, "a100")
    assert b["factor_lo"] <= narrow["factor_lo"] <= narrow["factor_hi"] <= b["factor_hi"]


@pytest.mark.parametrize("rho", [0.5, 0.7])
def test_the_band_holds_the_point_and_widens_near_the_knee_as_md1_says(rho):
    res = sim.run(_poisson(20_000, rho / D), CFG, bands=0.9)
    s = res.summary()
    f = band_factors(0.9, "h100")
    assert s["bands_level"] == 0.9  # (the H100 roofline's errors on a constant cost)
    assert s["bands_errors"] == "assumed: the roofline's error on H100-80GB-SXM, not " \
                                "ConstantCost's own"
    keys = [k for k in s if k.endswith("_lo")]
    assert {"ttft_p99_lo", "e2e_mean_lo", "itl_p50_lo", "output_token_throughput_lo"} <= set(
        keys)
    for lo in keys:
        key = lo[:-3]
        if key.startswith("bands_") or s[key] != s[key]:
            continue
        assert s[lo] <= s[key] <= s[f"{key}_hi"], key
    # each end is an M/D/1 queue with step D x factor: its mean E2E is the closed form's
    slow, fast = D * f["factor_hi"], D * f["factor_lo"]
    assert s["e2e_mean_hi"] == pytest.approx(_md1_e2e(rho * f["factor_hi"], slow), rel=0.08)
    assert s["e2e_mean_lo"] == pytest.approx(_md1_e2e(rho * f["factor_lo"], fast), rel=0.08)


def test_relative_width_grows_with_the_load():
    width = {}
    for rho in (0.5, 0.7):
        s = sim.run(_poisson(20_000, rho / D), CFG, bands=0.9).summary()
        width[rho] = (s["e2e_mean_hi"] - s["e2e_mean_lo"]) / s["e2e_mean"]
    assert width[0.7] > 1.5 * width[0.5]
    # the closed form's relative widths, at the same factors
    f = band_factors(0.9, "h100")
    md1 = {rho: (_md1_e2e(rho * f["factor_hi"], D * f["factor_hi"])
                 - _md1_e2e(rho * f["factor_lo"], D * f["factor_lo"])) / _md1_e2e(rho, D)
           for rho in width}
    for rho in width:
        assert width[rho] == pytest.approx(md1[rho], rel=0.15)


def test_a_fragile_point_is_a_finding_and_a_calm_one_is_not():
    calm = sim.run(_poisson(5000, 0.3 / D), CFG, bands=0.9)
    assert "fragile" not in [f.code for f in diagnose(calm)]
    knee = sim.run(_poisson(5000, 0.95 / D), CFG, bands=0.9)
    found = [f for f in diagnose(knee) if f.code == "fragile"]
    assert found and "slower" in found[0].message and found[0].value > 2


def test_bands_none_is_the_plain_run_bit_for_bit():
    df = _poisson(500, 60)
    plain = sim.run(df, CFG).summary()
    banded = sim.run(df, CFG, bands=0.9).summary()
    assert not any(k.endswith("_lo") or k.endswith("_hi") for k in plain)
    for k, v in plain.items():
        if "wall" not in k and "sim_speed" not in k and "requests_per_wall" not in k:
            assert banded[k] == v or (v != v and banded[k] != banded[k]), k


@pytest.mark.parametrize("bad", [0, 1, 1.5, -0.1, "x", True, float("nan")])
def test_bad_bands_are_one_line_errors_naming_bands(bad):
    with pytest.raises(ValueError, match=r"^bands must be") as e:
        sim.SimConfig(bands=bad)
    assert "\n" not in str(e.value)


def test_scaled_cost_keeps_fast_forward_and_scales_alike():
    base = sim.LinearCost(base=0.002, per_decode_token=1e-4, per_context_token=1e-7)
    scaled = ScaledCost(base, 1.25)
    assert scaled.pure_decode_cost(8)(1000) == pytest.approx(1.25 * base.pure_decode_cost(8)(1000))
    # requests alone (far apart): the same iterations, each 1.25x as long
    cfg = sim.SimConfig(scheduler="continuous", cost_model=base, max_batch_size=4)
    work = _poisson(40, 0.5)
    a = sim.run(work, cfg).iterations["duration"].to_numpy()
    b = sim.run(work, cfg, cost_model=scaled).iterations["duration"].to_numpy()
    assert len(a) == len(b) and np.allclose(b, 1.25 * a)
    with pytest.raises(ValueError, match="factor"):
        ScaledCost(base, 0)


def test_sweep_rows_and_capacity_search_carry_the_band():
    rows = sim.sweep(_poisson(2000, 50), {"bands": [None, 0.9]}, base=CFG)
    banded = rows[rows["bands"].notna()].iloc[0]
    assert banded["ttft_p99_lo"] <= banded["ttft_p99"] <= banded["ttft_p99_hi"]
    assert rows[rows["bands"].isna()]["ttft_p99_lo"].isna().all()
    s = 0.015  # mean E2E limit: the M/D/1 rate rho* / D with rho* = 2 (s - D) / (D + 2 (s - D))
    cap = max_rate(_poisson(20_000, 1.0), {"e2e_mean": s}, config=replace(CFG, bands=0.9),
                   tol=0.005)
    f = band_factors(0.9, "h100")

    def md1_rate(d):
        return 2 * (s - d) / (d + 2 * (s - d)) / d
    assert cap.rate_lo <= cap.rate <= cap.rate_hi
    assert cap.rate_lo == pytest.approx(md1_rate(D * f["factor_hi"]), rel=0.05)
    assert cap.rate_hi == pytest.approx(md1_rate(D * f["factor_lo"]), rel=0.05)
    plain = max_rate(_poisson(2000, 1.0), {"e2e_mean": s}, config=CFG, tol=0.05)
    assert plain.rate_lo != plain.rate_lo  # nan without bands


def test_disaggregated_pools_of_their_own_gpu_are_refused_with_bands():
    split = sim.Disaggregation(prefill={"gpu": "a100"})
    with pytest.raises(ValueError, match="^bands with disaggregated pools setting their own gpu"):
        sim.run(_poisson(20, 5.0), model="llama-3.1-8b", gpu="h100", disaggregation=split,
                bands=0.9)
    same = sim.run(_poisson(50, 5.0), model="llama-3.1-8b", gpu="h100",
                   disaggregation=sim.Disaggregation(), bands=0.9).summary()
    assert same["ttft_p99_lo"] <= same["ttft_p99"] <= same["ttft_p99_hi"]


def test_sim_run_and_sweep_write_the_band(tmp_path, capsys):
    import json

    from sim.cli.main import main
    assert main(["run", "--num-requests", "60", "--rate", "4", "--bands", "0.9",
                 "-o", str(tmp_path / "run")]) == 0
    assert "90% band" in capsys.readouterr().out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["summary"]
    assert summary["ttft_p99_lo"] <= summary["ttft_p99"] <= summary["ttft_p99_hi"]
    toml = tmp_path / "b.toml"
    toml.write_text('num_requests = 60\nbands = 0.9\nmetrics = ["ttft_p99_hi"]\n'
                    '[grid]\nrate = [2.0, 4.0]\n')
    assert main(["sweep", str(toml), "--workers", "1", "-o", str(tmp_path / "sweep")]) == 0
    assert "ttft_p99_hi" in capsys.readouterr().out


def test_a_user_cost_models_band_says_whose_errors_it_borrows(tmp_path, capsys):
    # a ConstantCost with gpu="h100" was labelled "fitted", the cost model's own measured error
    from sim.cli.main import main
    df = _poisson(200, 20.0)
    roofline = sim.run(df, model="llama-3.1-8b", gpu="h100", bands=0.9).summary()
    assert roofline["bands_errors"] == "fitted"  # the roofline's own held-out rows
    assert sim.run(df, model="llama-3.1-8b", gpu="l40s", bands=0.9).summary()[
        "bands_errors"] == "assumed"
    own = sim.run(df, replace(CFG, gpu="l40s"), bands=0.9).summary()
    assert own["bands_errors"] == ("assumed: the roofline's error on every GPU it was checked "
                                   "on, not ConstantCost's own")
    cap = max_rate(_poisson(2000, 1.0), {"e2e_mean": 2 * D}, config=replace(CFG, bands=0.9),
                   tol=0.05)
    assert cap.rate_lo <= cap.rate <= cap.rate_hi
    assert main(["run", "-w", "azure-code", "-n", "30", "--cost", "constant:0.01", "--bands",
                 "0.9", "-o", str(tmp_path / "o")]) == 0
    band = [x for x in capsys.readouterr().out.splitlines() if x.startswith("90% band")][0]
    assert band.endswith("(each step x0.988-1.24, assumed: the roofline's error on "
                         "H100-80GB-SXM, not ConstantCost's own)")
