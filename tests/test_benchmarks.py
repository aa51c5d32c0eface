"""Performance goals, checked by benchmarks (deselected by default: ``pytest -m perf``)."""

import pytest


@pytest.mark.perf
def test_engine_simulates_at_least_50k_requests_per_second(load_script):
    r = load_script("benchmarks/bench_engine.py").measure(100_000, repeats=3)
    print(r)
    assert r["requests_per_s"] >= 50_000
