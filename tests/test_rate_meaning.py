"""One rate, one meaning (issue 32): ``sim run --rate R``, ``workloads.load(..., rate=R)``, a
sweep's grid rate R and ``max_rate``'s answer R simulate the same arrivals for a drawn workload
(its nominal rate, ``attrs["arrival_rate"]``); a replayed trace is scaled by its measured mean
rate ``(n - 1) / span``."""

import json

import numpy as np
import pandas as pd
import pytest

import sim
import workloads as wl
from sim.cli import main
from workloads.arrivals import nominal_rate

CFG = dict(scheduler="chunked", model="llama-3.1-8b", gpu="h100")


@pytest.mark.parametrize("draw", [
    lambda r: wl.load("sharegpt", n=400, rate=r, seed=3),
    lambda r: wl.load("sharegpt", n=400, rate=r, arrival="gamma", cv=3.0, seed=3),
    lambda r: wl.synthetic(300, rate=r, prompt=100, output=10, arrival="constant"),
    lambda r: wl.shared_prefix(300, n_groups=3, system_prompt_tokens=64, user_tokens=20,
                               output=5, rate=r, seed=1),
])
def test_a_drawn_workload_scaled_to_r_is_the_one_drawn_at_r(draw):
    scaled = wl.scale_to_rate(draw(1.0), 5.0)
    direct = draw(5.0)
    np.testing.assert_allclose(scaled["arrival_time"], direct["arrival_time"], rtol=1e-12)
    assert scaled.attrs["arrival_rate"] == direct.attrs["arrival_rate"] == 5.0
    assert wl.own_rate(scaled) == 5.0
    # its measured rate is not the nominal one: scaling by it would have drawn another load
    t = direct["arrival_time"].to_numpy()
    if direct.attrs["arrival_cv"] > 0:
        assert (len(t) - 1) / (t[-1] - t[0]) != pytest.approx(5.0, rel=1e-3)


def test_a_trace_is_scaled_by_its_measured_rate():
    trace = wl.load("azure-code", n=300)
    assert "arrival_rate" not in trace.attrs
    out = wl.scale_to_rate(trace, 4.0)
    t = out["arrival_time"].to_numpy()
    assert t[0] == 0 and (len(t) - 1) / t[-1] == pytest.approx(4.0, rel=1e-12)
    assert wl.own_rate(out) == pytest.approx(4.0, rel=1e-12)


def test_a_nominal_rate_the_times_no_longer_match_is_not_used_and_said():
    df = wl.load("sharegpt", n=2000, rate=2.0)
    thinned = df.iloc[::2].reset_index(drop=True)  # attrs kept, the rate halved
    assert thinned.attrs["arrival_rate"] == 2.0
    with pytest.warns(UserWarning, match="does not match their measured rate"):
        out = wl.scale_to_rate(thinned, 4.0)
    t = out["arrival_time"].to_numpy()
    assert (len(t) - 1) / t[-1] == pytest.approx(4.0, rel=1e-12)
    assert wl.own_rate(thinned) == pytest.approx((len(thinned) - 1) / np.ptp(
        thinned["arrival_time"]))
    # the first rows of a drawn workload still stand for its rate (a sweep's num_requests)
    assert nominal_rate(df.iloc[:300]) == 2.0


def _same_summary(a, b):
    for key in ("num_finished", "ttft_mean", "ttft_p99", "e2e_mean", "request_throughput"):
        assert a[key] == pytest.approx(b[key], rel=1e-9), key


def test_sim_run_rate_and_a_sweep_point_at_that_rate_simulate_the_same(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "-w", "sharegpt", "-n", "300", "--rate", "6", "-s", "chunked",
                 "-o", str(out), "-q"]) == 0
    by_cli = json.loads((out / "summary.json").read_text())["summary"]
    drawn = wl.load("sharegpt", n=300, rate=6.0)
    by_api = sim.run(drawn, **CFG).summary()
    _same_summary(by_cli, by_api)
    table = sim.sweep(wl.load("sharegpt", n=300, rate=1.0), {"rate": [6.0]},
                      base=sim.SimConfig(**CFG), workers=1)
    _same_summary(table.iloc[0].to_dict(), by_api)
    # the sweep's command line too: a length-only set drawn at the reference rate, rescaled
    toml = tmp_path / "s.toml"
    toml.write_text('workload = "sharegpt"\nnum_requests = 300\nscheduler = "chunked"\n'
                    '[grid]\nrate = [6.0]\n')
    assert main(["sweep", str(toml), "-o", str(tmp_path / "sw"), "--no-progress"]) == 0
    row = pd.read_parquet(tmp_path / "sw" / "sweep.parquet").iloc[0].to_dict()
    _same_summary(row, by_api)


def test_max_rate_answer_is_the_rate_sim_run_takes():
    cfg = sim.SimConfig(**CFG)
    slo = {"ttft": 2.0}
    cap = sim.max_rate(wl.load("sharegpt", n=300, rate=1.0), slo, config=cfg, tol=0.05)
    again = sim.run(wl.load("sharegpt", n=300, rate=cap.rate), cfg).summary(slo=slo)
    _same_summary(again, cap.summary)
    assert again["slo_attainment"] >= 0.9
    # the search starts at the workload's nominal rate, not its measured one
    assert 1.0 in set(cap.points["rate"])


def test_a_file_is_a_trace_whatever_its_format_and_a_bad_nominal_rate_is_named(tmp_path):
    df = wl.load("sharegpt", n=200, rate=2.0)
    for name in ("w.parquet", "w.csv"):
        wl.save(df, tmp_path / name)
    scaled = [wl.load(tmp_path / name, rate=4.0)["arrival_time"].to_numpy()
              for name in ("w.parquet", "w.csv")]
    np.testing.assert_allclose(scaled[0], scaled[1], rtol=1e-12)  # the same, by its own rate
    assert "arrival_rate" not in wl.load(tmp_path / "w.parquet").attrs
    bad = df.copy()
    bad.attrs["arrival_rate"] = -1
    with pytest.raises(ValueError, match=r"attrs\['arrival_rate'\] must be the positive rate"):
        wl.scale_to_rate(bad, 3.0)
