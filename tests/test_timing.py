"""sim/costs/timing.py without timing anything: a fake clock that the synthetic ops advance
drives time_ops, fit_tables fits closed forms, nonneg_lstsq against scipy and its optimality
conditions."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.optimize import nnls

from sim.costs.calibrated import _bilinear, _loglog_interp
from sim.costs.timing import (QUICK_GRID, REPEATS, WARMUP, _fit_and_holdout, fit_tables,
                              nonneg_lstsq, time_ops)

# closed forms of the synthetic ops (seconds)
TRUE = {
    "linear": lambda t: 2e-5 * t ** 0.9,
    "lm_head": lambda s: 1e-5 * s ** 0.5,
    "decode_attention": lambda b, L: 1e-7 * b ** 0.8 * L ** 1.2 / 64,
    "prefill_attention": lambda c, p: 1e-6 * c ** 1.1 * (1 + p / 100),
}


class FakeClock:
    """A clock that only the synthetic ops move: an op takes exactly what it is told to."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def op(self, durations):
        """An op whose successive runs take ``durations`` (cycled) seconds."""
        durations = list(durations)
        calls = iter(range(10**9))

        def run():
            self.now += durations[next(calls) % len(durations)]
        return run


def synthetic_ops(clock, grid, spike=None):
    """One op per grid point taking TRUE[op](point) (times ``spike(op, point)`` if given)."""
    ops, where = [], []
    for op, points in grid.items():
        for pt in points:
            args = pt if isinstance(pt, tuple) else (pt,)
            t = TRUE[op](*args) * (spike(op, pt) if spike else 1.0)
            ops.append(clock.op([t]))
            where.append((op, pt))
    return ops, where


def test_time_ops_reads_the_injected_clock_exactly():
    clock = FakeClock()
    a, b = 2.0 ** -10, 2.0 ** -9  # exact in binary: no rounding in the sums
    medians, passes, seconds = time_ops([clock.op([a]), clock.op([b])], budget_s=1.0,
                                        timer=clock)
    assert medians == [a, b]
    per_pass = (WARMUP + REPEATS) * (a + b)
    # passes stop before the next one would overrun the budget (42 x 0.0234 s here)
    assert passes * per_pass <= 1.0 < (passes + 1) * per_pass and passes == 42
    assert seconds == passes * per_pass


def test_time_ops_reports_each_pass_with_the_clocks_elapsed_seconds():
    clock, reports = FakeClock(), []
    a = 2.0 ** -10
    _, passes, seconds = time_ops([clock.op([a])], budget_s=0.1, timer=clock,
                                  on_pass=lambda n, elapsed: reports.append((n, elapsed)))
    per_pass = (WARMUP + REPEATS) * a
    assert reports == [(k, k * per_pass) for k in range(1, passes + 1)]
    assert reports[-1][1] == seconds


def test_time_ops_runs_three_passes_even_over_budget_and_syncs_around_each_sample():
    clock, synced = FakeClock(), []
    medians, passes, _ = time_ops([clock.op([1.0])], budget_s=0.5, timer=clock,
                                  sync=lambda: synced.append(clock.now))
    assert passes == 3 and medians == [1.0]
    assert len(synced) == 2 * 3 * REPEATS


def test_time_ops_median_ignores_a_minority_of_slow_runs():
    """A busy machine: one timed run in three is 10x slow; the median is the true time."""
    clock = FakeClock()
    fast, slow = 2.0 ** -10, 2.0 ** -7  # exact in binary
    cycle = [fast] * (WARMUP + REPEATS - 1) + [slow]  # each pass's last timed run is slow
    medians, _, _ = time_ops([clock.op(cycle)], budget_s=0.2, timer=clock)
    assert medians == [fast]


def test_fitted_tables_reproduce_the_synthetic_timings():
    clock = FakeClock()
    ops, where = synthetic_ops(clock, QUICK_GRID)
    medians, _, _ = time_ops(ops, budget_s=0.0, timer=clock)
    times = {op: [m for (o, _), m in zip(where, medians) if o == op] for op in QUICK_GRID}
    fits, heldout = fit_tables(QUICK_GRID, times, seed=0)
    for op in ("linear", "lm_head", "decode_attention"):  # power laws: exact off the grid
        assert heldout[op]["median_ape_pct"] < 1e-6, op
    # the prefill table is exact on kept grid lines in p and a power law in c
    p = fits["prefill_attention"]["y"][0]
    assert _bilinear(50.0, p, fits["prefill_attention"]) == pytest.approx(
        TRUE["prefill_attention"](50.0, p), rel=1e-9)
    assert _loglog_interp(100.0, fits["linear"]["x"], fits["linear"]["y"]) == pytest.approx(
        TRUE["linear"](100.0), rel=1e-9)
    # every table value is a measured time: > 0
    for fit in fits.values():
        values = np.asarray(fit["y"] if fit["kind"] == "table1d" else fit["z"])
        assert (values > 0).all()


def test_busy_machine_timings_show_in_the_heldout_error():
    """Whole passes slowed at some points (median cannot hide it): the held-out error grows."""
    rng = np.random.default_rng(3)
    slow = {pt: rng.uniform(1.0, 3.0) for pt in QUICK_GRID["decode_attention"]}
    clock = FakeClock()
    ops, where = synthetic_ops(clock, QUICK_GRID,
                               spike=lambda op, pt: slow[pt] if op == "decode_attention" else 1)
    medians, _, _ = time_ops(ops, budget_s=0.0, timer=clock)
    times = {op: [m for (o, _), m in zip(where, medians) if o == op] for op in QUICK_GRID}
    _, heldout = fit_tables(QUICK_GRID, times, seed=0)
    assert heldout["decode_attention"]["median_ape_pct"] > 20
    assert heldout["linear"]["median_ape_pct"] < 1e-6


@pytest.mark.parametrize("bad", [0.0, -1e-6, float("nan"), float("inf")])
def test_a_table_refuses_a_time_that_is_not_positive(bad):
    xs = [1, 2, 4, 8, 16]
    t = [1e-3, 2e-3, bad, 8e-3, 1.6e-2]
    with pytest.raises(ValueError, match=r"linear: timings must be finite and > 0 s.*point 4"):
        _fit_and_holdout("linear", xs, t, seed=0)


# -- non-negative least squares ---------------------------------------------------------------
def test_nonneg_lstsq_recovers_nonnegative_coefficients_exactly():
    rng = np.random.default_rng(0)
    x = np.abs(rng.standard_normal((50, 4))) * [1e-3, 1.0, 10.0, 1e3]  # mixed scales
    c = np.array([0.5, 0.0, 2.0, 1e-6])
    assert np.allclose(nonneg_lstsq(x, x @ c), c, rtol=1e-8, atol=1e-12)


def test_nonneg_lstsq_clamps_what_plain_least_squares_makes_negative():
    x = np.column_stack([np.ones(5), np.arange(1.0, 6.0)])
    y = 2.0 * np.arange(1.0, 6.0) - 1.0  # intercept -1
    assert np.linalg.lstsq(x, y, rcond=None)[0][0] == pytest.approx(-1.0)
    c = nonneg_lstsq(x, y)
    assert c[0] == 0.0 and c[1] > 0
    # the best slope through the origin: sum(x y) / sum(x^2)
    assert c[1] == pytest.approx((np.arange(1, 6) @ y) / (np.arange(1, 6) @ np.arange(1, 6)))


def test_nonneg_lstsq_zero_columns_and_bad_input():
    x = np.column_stack([np.zeros(4), np.arange(1.0, 5.0)])
    assert list(nonneg_lstsq(x, 3 * np.arange(1.0, 5.0))) == pytest.approx([0.0, 3.0])
    assert list(nonneg_lstsq(x, -np.ones(4))) == [0.0, 0.0]  # nothing >= 0 helps
    with pytest.raises(ValueError, match="finite"):
        nonneg_lstsq(x, np.array([1.0, np.nan, 1.0, 1.0]))
    with pytest.raises(ValueError, match=r"\(m, n\)"):
        nonneg_lstsq(np.ones(3), np.ones(3))


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 40), n=st.integers(1, 8),
       signed=st.booleans())
def test_nonneg_lstsq_is_optimal(seed, m, n, signed):
    """Feasible, as good as scipy's NNLS, and the Karush-Kuhn-Tucker conditions hold."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, n)) * 10.0 ** rng.integers(-4, 3, size=n)
    x = x if signed else np.abs(x)
    y = rng.standard_normal(m)
    c = nonneg_lstsq(x, y)
    assert (c >= 0).all()
    ref, _ = nnls(x, y, maxiter=50 * n)
    assert np.linalg.norm(x @ c - y) <= np.linalg.norm(x @ ref - y) + 1e-9 * (1 + np.linalg.norm(y))
    grad = (x / np.linalg.norm(x, axis=0)).T @ (y - x @ c)  # per unit column
    scale = 1e-7 * (1 + np.linalg.norm(y))
    assert (grad <= scale).all()                     # no coefficient would improve by growing
    assert (np.abs(grad[c > 0]) <= scale).all()      # the free ones are at their optimum
