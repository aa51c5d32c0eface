"""The autoscaled day: nothing lost, never below the minimum, a new replica serves only after
its load time, GPU-hours the integral of the replica count; the diurnal generator's curve."""

import math

import numpy as np
import pytest

import sim
import workloads as wl
from sim.engine.fleet.autoscaler import Autoscaler, load_time
from sim.tools.autoscale import run_autoscaled

SLO = {"ttft": 1.0}
CONFIG = sim.SimConfig(model="llama-3.1-8b", gpu="a100")
POLICY = Autoscaler(target=8, min_replicas=1, max_replicas=5, interval_s=10,
                    scale_down_delay_s=60, load_bandwidth_gbps=2.0)


@pytest.fixture(scope="module")
def day():
    # a "day" of 24 minutes (period 0.4 h): trough 1.5 req/s, peak 6x that, and a burst
    df = wl.diurnal(0.4, mean_rate=5.0, peak_to_trough=6.0, peak_hour=0.2, period_hours=0.4,
                    bursts=[(900.0, 60.0, 2.0)], prompt=wl.LogNormal(600, 0.8, max_tokens=4000),
                    output=wl.LogNormal(200, 0.8, max_tokens=1000), seed=1)
    return df, run_autoscaled(df, CONFIG, POLICY)


def test_nothing_is_lost(day):
    df, run = day
    req = run.result.requests
    assert len(req) == len(df)
    assert set(req["status"]) <= {"finished", "rejected"}
    assert run.leases["requests"].sum() == len(df)


def test_it_scales_up_and_down(day):
    _, run = day
    s = run.summary(slo=SLO)
    assert s["peak_replicas"] >= 3 and s["replica_starts"] >= 2
    assert run.leases["stop_at"].notna().any()  # (the trough: some drained)
    assert 1 <= s["mean_replicas"] < s["peak_replicas"]


def test_never_below_the_minimum_serving(day):
    _, run = day
    assert (run.timeline["serving"] >= POLICY.min_replicas).all()
    assert (run.timeline["paid"] <= POLICY.max_replicas).all()
    assert (run.ticks["desired"] >= POLICY.min_replicas).all()


def test_a_new_replica_serves_only_after_its_load_time(day):
    _, run = day
    load = load_time(CONFIG, POLICY)
    # closed form: 8.03 B parameters x 2 bytes (fp16) / 2 GB/s
    params = sim.get_model("llama-3.1-8b").total_params()
    assert load == pytest.approx(params * 2 / 2e9)
    started = run.leases[run.leases["paid_from"] > 0]
    assert np.allclose(started["serving_from"] - started["paid_from"], load)
    req = run.result.requests
    for k in range(POLICY.max_replicas):
        arrivals = req.loc[req["replica"] == k, "arrival_time"].to_numpy()
        leases = run.leases[run.leases["replica"] == k]
        stops = leases["stop_at"].fillna(math.inf).to_numpy()
        inside = [((leases["serving_from"].to_numpy() <= t) & (t <= stops)).any()
                  for t in arrivals]
        assert all(inside)


def test_gpu_hours_are_the_integral_of_the_replica_count(day):
    _, run = day
    s = run.summary(slo=SLO)
    t = np.append(run.timeline["time"].to_numpy(), run.end)
    integral = (np.diff(t) * run.timeline["paid"].to_numpy()).sum()
    assert s["gpu_hours"] == pytest.approx(integral * CONFIG.tensor_parallel / 3600, rel=1e-12)
    price = sim.specs.economics.gpu_price("a100").usd_per_gpu_hour
    assert s["usd"] == pytest.approx(s["gpu_hours"] * price)
    cold = (run.leases["serving_from"] - run.leases["paid_from"]).sum() / 3600
    assert s["cold_start_gpu_hours"] == pytest.approx(cold)
    p = sim.specs.economics.gpu_power("a100")
    busy = run.result.iterations["duration"].sum()
    joules = p.idle_watts * integral + p.active_fraction * (p.max_watts - p.idle_watts) * busy
    assert s["energy_joules"] == pytest.approx(joules)
    assert s["avg_power_watts"] == pytest.approx(joules / run.end)


def test_a_fixed_fleet_pays_every_replica_all_day():
    df = wl.synthetic(300, rate=2.0, prompt=200, output=50, seed=0)
    fixed = Autoscaler(target=1e9, min_replicas=2, max_replicas=2)
    run = run_autoscaled(df, CONFIG, fixed)
    s = run.summary()
    assert s["gpu_hours"] == pytest.approx(2 * run.end / 3600) and s["cold_start_usd"] == 0
    assert set(run.result.requests["replica"]) == {0, 1}


def test_attainment_over_time_has_every_window(day):
    df, run = day
    over = run.over_time(SLO, 120)
    assert len(over) == math.ceil(df["arrival_time"].max() / 120)
    assert over["slo_attainment"].between(0, 1).all()
    assert over["rate"].sum() * 120 == pytest.approx(len(df))


def test_the_diurnal_curve_peaks_where_asked_and_averages_the_mean():
    t = np.linspace(0, 24 * 3600, 100_001)
    lam = wl.rate_at(t, mean_rate=4.0, peak_to_trough=3.0, peak_hour=14)
    assert lam.mean() == pytest.approx(4.0, rel=1e-3)
    assert lam.max() / lam.min() == pytest.approx(3.0, rel=1e-6)
    assert t[lam.argmax()] / 3600 == pytest.approx(14, abs=0.01)
    df = wl.diurnal(24, mean_rate=0.5, peak_to_trough=3.0, peak_hour=14, prompt=100,
                    output=10, seed=2)
    assert len(df) == pytest.approx(0.5 * 24 * 3600, rel=0.03)  # Poisson: sd ~0.7 %
    hours = np.floor(df["arrival_time"] / 3600)
    assert hours.value_counts().idxmax() in (12, 13, 14, 15)


@pytest.mark.parametrize("kw,said", [
    ({"peak_to_trough": 0.5}, r"peak_to_trough must be >= 1"),
    ({"peak_to_trough": math.inf}, "peak_to_trough must be a positive number, got inf"),
    ({"peak_hour": math.nan}, "peak_hour must be a finite number of hours, got nan")])
def test_a_bad_diurnal_shape_names_the_field(kw, said):
    """A peak below its trough would thin from a bound under the curve's maximum: the day's
    mean and shape would silently be wrong; inf would fail inside numpy."""
    with pytest.raises(ValueError, match=said):
        wl.diurnal(1, mean_rate=1.0, prompt=100, output=10, **kw)
    with pytest.raises(ValueError, match=said):
        wl.rate_at([0.0], mean_rate=1.0, **kw)


@pytest.mark.parametrize("kw,said", [({"metric": "gpu"}, "metric must be one of"),
                                     ({"target": 0}, "target must be"),
                                     ({"min_replicas": 3, "max_replicas": 2}, "below min"),
                                     ({"initial_replicas": 9}, "initial_replicas"),
                                     ({"metric": "kv", "target": 2.0},
                                      r"target must be a fraction in \(0, 1\) for metric 'kv'"),
                                     ({"load_bandwidth_gbps": 0}, "load_bandwidth_gbps must be"),
                                     ({"load_time_s": 10, "load_bandwidth_gbps": 5},
                                      "give load_time_s or load_bandwidth_gbps, not both")])
def test_a_bad_policy_names_the_field(kw, said):
    with pytest.raises(ValueError, match=said):
        Autoscaler(**kw)


def test_the_load_time_is_the_given_one_or_the_weights_over_the_bandwidth():
    cfg = sim.SimConfig(model="llama-3.1-8b", gpu="h100")
    assert load_time(cfg, Autoscaler(load_time_s=7.5)) == 7.5
    by_default = load_time(cfg, Autoscaler())
    at_4 = load_time(cfg, Autoscaler(load_bandwidth_gbps=4))
    assert by_default == pytest.approx(2 * at_4)  # the default 2 GB/s: twice as long as 4 GB/s


def test_the_plot_draws_replicas_and_attainment(day):
    from sim.results.plots_autoscale import plot_autoscaled
    _, run = day
    fig = plot_autoscaled(run, SLO, window_s=120)
    top, bottom = fig.axes[0], fig.axes[1]
    assert len(top.lines) == 2 and len(bottom.lines[0].get_xdata()) == len(
        run.over_time(SLO, 120))


def test_a_dp_attention_replica_is_paid_and_loaded_as_its_ep_gpus():
    # Mixtral-8x7B at EP 8, attention data-parallel over 4 ranks of TP 2: a replica is 8 GPUs,
    # each loading 1/2 of the non-expert weights and 1/8 of the routed experts (fp8: 1 B)
    cfg = sim.SimConfig(model="mixtral-8x7b", gpu="h100", weight_dtype="fp8",
                        tensor_parallel=2, expert_parallel=8, attention_dp=4,
                        usd_per_gpu_hour=2.0)
    m = sim.get_model("mixtral-8x7b")
    experts = 32 * 8 * 3 * 4096 * 14336
    per_gpu = (m.total_params() - experts) / 2 + experts / 8
    policy = Autoscaler(target=1e9, min_replicas=1, max_replicas=1, load_bandwidth_gbps=4.0)
    assert load_time(cfg, policy) == pytest.approx(per_gpu / 4e9)
    df = wl.synthetic(20, rate=2.0, prompt=200, output=20, seed=0)
    run = run_autoscaled(df, cfg, policy)
    s = run.summary()
    assert s["num_finished"] == 20
    assert s["gpu_hours"] == pytest.approx(8 * run.end / 3600)
    assert s["usd"] == pytest.approx(8 * run.end / 3600 * 2.0)
    p = sim.specs.economics.gpu_power("h100")
    busy = run.result.iterations["duration"].sum()
    joules = 8 * (p.idle_watts * run.end + p.active_fraction * (p.max_watts - p.idle_watts) * busy)
    assert s["energy_joules"] == pytest.approx(joules)
