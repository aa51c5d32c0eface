"""Performance goals, checked by benchmarks (deselected by default: ``pytest -m perf``)."""

import pytest


@pytest.mark.perf
def test_engine_within_14x_of_a_bare_simpy_loop(load_script):
    """A ratio, not a rate: this machine's speed drifts (47-57k req/s on the 2-core VM), the
    ratio to the bare one-event-per-iteration loop timed in the same process does not (0.08)."""
    r = load_script("benchmarks/bench_engine.py").measure(100_000, repeats=3)
    print(r)
    assert r["ratio_to_bare_simpy"] >= 1 / 14


@pytest.mark.perf
def test_speculation_costs_at_most_2x_per_request(load_script):
    bench = load_script("benchmarks/bench_engine.py")
    off = bench.measure(30_000, repeats=3)
    on = bench.measure(30_000, repeats=3, speculative=bench.SPEC)
    print(off, on)
    assert on["wall_s_median"] <= 2.0 * off["wall_s_median"]


@pytest.mark.perf
def test_four_replicas_cost_at_most_twice_as_much_per_request_as_one(load_script):
    bench = load_script("benchmarks/bench_engine.py")
    one, four = bench.measure(50_000, repeats=3), bench.measure(50_000, repeats=3, replicas=4)
    print(one, four)
    assert four["wall_s_median"] <= 2 * one["wall_s_median"]


def test_the_end_to_end_scenario_runs_at_a_small_scale(load_script, monkeypatch):
    """benchmarks/run.py's scenario 4 (sim run on a workload file, outputs written) at 1,000
    requests: it runs and reports its wall time, peak memory and checksum."""
    from pathlib import Path
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    out = load_script("benchmarks/run.py").one("sim_run_1m", 0.001)
    assert out["requests"] == 1000 and out["iterations"] > 0 and out["wall_s"] > 0
    assert out["peak_rss_mb"] > 0 and len(out["checksum"]) == 12


@pytest.mark.perf
def test_a_million_requests_end_to_end_within_2_gb(load_script, monkeypatch):
    """The issue's scenario 4: 1M requests through ``sim run`` (workload file in, parquet and
    JSON out) in at most 2 GB peak (measured 1.69 GB; 2.1 GB before the outputs' pipeline
    was reworked, 7.7 GB when the issue was filed)."""
    from pathlib import Path
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    out = load_script("benchmarks/run.py").one("sim_run_1m", 1.0)
    print(out)
    assert out["peak_rss_mb"] <= 2048


def test_the_per_request_reference_loop_runs_the_engines_iterations(load_script):
    """The plain per-request simulator the benchmark compares the engine with schedules as the
    chunked policy does when KV blocks never run short: the same number of iterations (so the
    ratio compares equal work)."""
    bench = load_script("benchmarks/bench_engine.py")
    df = bench.workload(800, seed=2)
    wall, iterations = bench.per_request_reference(df)
    from sim.engine import run
    res = run(df, scheduler="chunked", model="llama-3.1-8b", gpu="h100", max_batch_size=256,
              kv_blocks=10**6)
    assert wall > 0 and iterations == len(res.iterations)


@pytest.mark.parametrize("scale", ["-1", "0", "abc", "inf"])
def test_the_benchmark_refuses_a_scale_that_is_not_positive(load_script, monkeypatch, scale):
    """``--scale`` multiplies request counts that have a floor of 1,000: a zero or negative
    scale ran silently at the floor; it is refused, naming the value."""
    from pathlib import Path
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    bench = load_script("benchmarks/run.py")
    with pytest.raises(SystemExit):
        bench.main(["--scale", scale])


@pytest.mark.perf
def test_a_plan_over_200_candidates_within_two_minutes_on_two_workers(load_script):
    r = load_script("benchmarks/bench_plan.py").measure(workers=2)
    print(r)
    assert r["candidates"] >= 200 and r["wall_s"] <= 120
    assert r["pruned_before_simulating"] + r["simulated"] == r["candidates"]


def test_the_soak_runs_every_request_and_measures_its_memory(load_script):
    """benchmarks/soak.py at a small scale: nothing lost, the counts match, peak measured."""
    out = load_script("benchmarks/soak.py").soak(3000)
    assert out["lost"] == 0 and out["unexplained_rejections"] == 0
    assert out["finished"] + out["rejected"] == 3000 and out["summary_counts_match"]
    assert out["peak_rss_mb"] > 0 and out["iterations"] > 0


@pytest.mark.perf
def test_a_million_requests_through_the_api_in_linear_memory(load_script):
    """(issue 32) The soak at 1M requests: measured 1.37 GB peak and 44 s on the 2-core VM
    (0.2M: 0.37 GB; 10M extrapolates to ~13 GB): a peak within 1.6 KB per request."""
    out = load_script("benchmarks/soak.py").soak(1_000_000)
    print(out)
    assert out["lost"] == 0 and out["unexplained_rejections"] == 0
    assert out["peak_rss_mb"] <= 1600
