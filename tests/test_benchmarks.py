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
