"""Tests of sim/results/plots_sweep.py: figures of real (small) sweep tables, checked against the
table's numbers; failed rows left out; repeats averaged with their spread; bad tables named."""

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

import sim
import workloads
from sim.results.plots_sweep import (knee, plot_chunk_tradeoff, plot_percentiles_vs_rate,
                                     plot_sweep)


@pytest.fixture(scope="module")
def rate_table():
    df = workloads.load("azure-conv", n=80)
    return sim.sweep(df, {"scheduler": ["chunked", "vllm"], "rate": [1.0, 4.0, 16.0, 64.0]},
                     workers=1)


@pytest.fixture(scope="module")
def chunk_table():
    df = workloads.load("azure-code", n=60, rate=2)
    return sim.sweep(df, {"chunk_size": [256, 512, 1024, 4096]}, workers=1)


def test_percentiles_vs_rate_draws_each_percentile_per_group_with_the_knee(rate_table):
    limit = float(rate_table[rate_table["scheduler"] == "chunked"]
                  .sort_values("rate")["ttft_p99"].iloc[1]) * 1.01  # rates 1 and 4 meet it
    fig = plot_percentiles_vs_rate(rate_table, "ttft", by="scheduler", slo=limit)
    try:
        ax = fig.axes[0]
        lines = {ln.get_label(): ln for ln in ax.get_lines()}
        for sched in ("chunked", "vllm"):
            part = rate_table[rate_table["scheduler"] == sched].sort_values("rate")
            for q in (50, 90, 99):
                line = lines[f"scheduler={sched} P{q}"]
                np.testing.assert_array_equal(line.get_xdata(), part["rate"])
                np.testing.assert_array_equal(line.get_ydata(), part[f"ttft_p{q}"])
        chunked_knee = lines[f"scheduler=chunked knee: P99 within SLO up to {4.0:g}"]
        assert chunked_knee.get_xdata()[0] == 4.0
        assert lines[f"SLO {limit:g} s"].get_ydata()[0] == limit
        assert ax.get_xlabel() == "rate (req/s)" and ax.get_ylabel() == "ttft (s, log scale)"
    finally:
        plt.close(fig)


def test_knee_is_the_last_rate_of_the_leading_run_within_the_limit():
    t = pd.DataFrame({"rate": [1, 2, 3, 4, 5], "ttft_p99": [0.1, 0.2, 0.9, 0.3, 2.0]})
    assert knee(t, "ttft", 0.5) == 2  # 4 meets it again, but 3 broke the run
    assert knee(t, "ttft", 0.05) is None
    assert knee(t, "ttft", 5.0) == 5


def test_repeats_are_averaged_and_their_spread_shaded():
    t = pd.DataFrame({"rate": [1.0, 1.0, 2.0, 2.0], "ttft_p50": [1.0, 3.0, 2.0, 2.0],
                      "ttft_p90": [2.0, 4.0, 3.0, 3.0], "ttft_p99": [3.0, 5.0, 4.0, 6.0],
                      "error": ["", "", "", ""]})
    fig = plot_percentiles_vs_rate(t)
    try:
        ax = fig.axes[0]
        p50 = [ln for ln in ax.get_lines() if ln.get_label() == "P50"][0]
        np.testing.assert_array_equal(p50.get_ydata(), [2.0, 2.0])
        assert len(ax.collections) == 3  # a min-max band per percentile
    finally:
        plt.close(fig)


def test_chunk_tradeoff_places_each_chunk_size_at_its_itl_and_ttft(chunk_table):
    fig = plot_chunk_tradeoff(chunk_table)
    try:
        ax = fig.axes[0]
        (line,) = ax.get_lines()
        t = chunk_table.sort_values("chunk_size")
        np.testing.assert_array_equal(line.get_xdata(), t["itl_p99"])
        np.testing.assert_array_equal(line.get_ydata(), t["ttft_p99"])
        assert [a.get_text() for a in ax.texts] == ["256", "512", "1024", "4096"]
        assert ax.get_xlabel() == "itl_p99 (s)" and ax.get_ylabel() == "ttft_p99 (s)"
    finally:
        plt.close(fig)
    # the trade-off itself: a larger chunk lowers TTFT and raises the ITL tail here
    assert t["ttft_p99"].iloc[0] > t["ttft_p99"].iloc[-1]
    assert t["itl_p99"].iloc[0] < t["itl_p99"].iloc[-1]


def test_failed_points_are_left_out(rate_table):
    t = rate_table.copy()
    t.loc[0, "error"] = "ValueError: boom"
    fig = plot_sweep(t, ["rate", "scheduler"], "ttft_p99")
    try:
        lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
        assert len(lines["scheduler=chunked"].get_xdata()) == 3
        assert len(lines["scheduler=vllm"].get_xdata()) == 4
        assert fig.axes[0].get_xlabel() == "rate (req/s)"
        assert fig.axes[0].get_ylabel() == "ttft_p99 (s)"
    finally:
        plt.close(fig)


def test_bad_tables_are_named(rate_table):
    with pytest.raises(ValueError, match=r"plot_chunk_tradeoff: missing column\(s\) "
                                         r"\['chunk_size'\]"):
        plot_chunk_tradeoff(rate_table)
    with pytest.raises(ValueError, match=r"plot_percentiles_vs_rate: missing column\(s\) "
                                         r"\['foo_p50', 'foo_p90', 'foo_p99'\]"):
        plot_percentiles_vs_rate(rate_table, "foo")
    failed = rate_table.assign(error="RuntimeError: x")
    with pytest.raises(ValueError, match=r"plot_sweep: no successful row to plot \(8 rows\)"):
        plot_sweep(failed, ["rate"], "ttft_p99")
