"""Performance goals, checked by benchmarks (deselected by default: ``pytest -m benchmark``)."""

import pytest


@pytest.mark.benchmark
def test_engine_simulates_at_least_50k_requests_per_second():
    import sys
    sys.path.insert(0, "benchmarks")
    from bench_engine import measure
    r = measure(100_000, repeats=3)
    print(r)
    assert r["requests_per_s"] >= 50_000
