"""Tests of sim/results/plots.py: the files written, what the panels draw, and that the core
never imports matplotlib (the Agg backend is set in conftest.py)."""

import subprocess
import sys

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

import sim
import workloads
from sim.results.plots import plot_latencies, plot_timeline, save_plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results():
    df = workloads.load("azure-code", n=200)
    return {"chunked": sim.run(df, cost_model=sim.ConstantCost(0.01)),
            "static": sim.run(df, scheduler="static", cost_model=sim.ConstantCost(0.01))}


def _is_png(path, width, height):
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert path.stat().st_size > 10_000  # axes, curves and labels, not a blank canvas
    assert mpimg.imread(path).shape[:2] == (height, width)  # figsize x 110 dpi


def test_save_plots_writes_two_pngs_and_closes_them(results, tmp_path):
    open_before = plt.get_fignums()
    out = tmp_path / "nested" / "dir"  # created if missing
    paths = save_plots(results["chunked"], out)
    assert [p.name for p in paths] == ["latency_cdfs.png", "timeline.png"]
    assert all(p.parent == out for p in paths)
    _is_png(paths[0], 14 * 110, round(3.8 * 110))
    _is_png(paths[1], 12 * 110, round(5.5 * 110))
    assert plt.get_fignums() == open_before  # written figures are closed


def test_plot_latencies_to_file_accepts_a_dict(results, tmp_path):
    path = tmp_path / "compare.png"
    plot_latencies(results, path)
    _is_png(path, 14 * 110, round(3.8 * 110))


def test_plot_latencies_draws_one_cdf_per_result_and_panel(results):
    fig = plot_latencies(results)  # no path: an open figure, for a notebook
    try:
        axes = fig.axes
        assert [ax.get_title() for ax in axes] == ["TTFT", "inter-token latency",
                                                   "end-to-end latency"]
        assert [ax.get_ylabel() for ax in axes[:2]] == ["fraction of requests",
                                                        "fraction of tokens"]
        assert all(ax.get_xscale() == "log" and ax.get_xlabel() == "seconds" for ax in axes)
        for ax in axes:
            assert [ln.get_label() for ln in ax.get_lines()] == list(results)
        for label, ax_lines in zip(results, zip(*(ax.get_lines() for ax in axes))):
            res = results[label]
            fin = res.requests[res.requests["status"] == "finished"]
            for line, values in zip(ax_lines, (fin["ttft"], res.itl(), fin["e2e"])):
                x, y = line.get_xdata(), line.get_ydata()
                np.testing.assert_array_equal(x, np.sort(values))  # an empirical CDF
                np.testing.assert_allclose(y, np.arange(1, len(values) + 1) / len(values))
        legend = axes[2].get_legend()
        assert [t.get_text() for t in legend.get_texts()] == list(results)
    finally:
        plt.close(fig)


def test_plot_latencies_labels_a_single_result_by_its_scheduler(results):
    fig = plot_latencies(results["static"])
    try:
        assert [ln.get_label() for ln in fig.axes[0].get_lines()] == ["static"]
    finally:
        plt.close(fig)


def test_plot_latencies_skips_unfinished_requests():
    # a request too large for the pool is rejected: NaN latencies are not drawn
    df = pd.DataFrame({"arrival_time": [0.0, 0.02, 0.03], "num_prompt_tokens": [16, 16, 10_000],
                       "num_output_tokens": [4, 6, 4]})
    res = sim.run(df, cost_model=sim.LinearCost(0.01, 1e-4, 1e-3), kv_blocks=8)
    assert list(res.requests["status"]) == ["finished", "finished", "rejected"]
    fig = plot_latencies(res)
    try:
        ttft_line, itl_line, e2e_line = (ax.get_lines()[0] for ax in fig.axes)
        assert len(ttft_line.get_xdata()) == len(e2e_line.get_xdata()) == 2
        assert len(itl_line.get_xdata()) == 3 + 5
        assert np.isfinite(ttft_line.get_xdata()).all()
    finally:
        plt.close(fig)


def test_plot_timeline_panels_and_preemption_marks():
    rng = np.random.default_rng(5)
    n = 200
    df = pd.DataFrame({"arrival_time": np.sort(rng.uniform(0, 2, n)),
                       "num_prompt_tokens": rng.integers(20, 200, n),
                       "num_output_tokens": rng.integers(20, 300, n)})
    res = sim.run(df, scheduler="continuous", cost_model=sim.LinearCost(0.01, 1e-5, 1e-4),
                  kv_blocks=64, max_batch_size=32)
    it = res.iterations
    assert it["num_preemptions"].sum() > 0
    fig = plot_timeline(res)
    try:
        top, bottom = fig.axes
        assert [ln.get_label() for ln in top.get_lines()] == ["running", "waiting",
                                                              "max batch size"]
        np.testing.assert_array_equal(top.get_lines()[0].get_xdata(), it["start"])
        np.testing.assert_array_equal(top.get_lines()[0].get_ydata(), it["num_running"])
        assert top.get_lines()[2].get_ydata()[0] == 32
        np.testing.assert_allclose(bottom.get_lines()[0].get_ydata(),
                                   it["kv_blocks_used"] / 64 * 100)
        assert bottom.get_xlabel() == "simulated time (s)"
        marks = bottom.collections[0].get_offsets()  # one red dot per preempting iteration
        assert len(marks) == (it["num_preemptions"] > 0).sum()
    finally:
        plt.close(fig)


def test_core_never_imports_matplotlib():
    code = ("import sys, sim, workloads\n"
            "sim.run(workloads.load('azure-code', n=20), cost_model=sim.ConstantCost(0.01))"
            ".summary()\n"
            "bad = [m for m in sys.modules if m.startswith('matplotlib') "
            "or m == 'sim.results.plots']\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_cluster_timeline_and_the_replica_load_draw_one_series_per_replica(tmp_path):
    from sim.results.plots import plot_replica_load
    df = workloads.load("azure-code", n=200, rate=20.0)
    res = {r: sim.run(df, cost_model=sim.ConstantCost(0.01), replicas=3, router=r)
           for r in ("round_robin", "least_outstanding")}
    fig = plot_timeline(res["round_robin"])
    assert [line.get_label() for line in fig.axes[0].lines[:3]] == [
        f"running, replica {k}" for k in range(3)]
    assert len(fig.axes[1].lines) == 3
    for k, line in enumerate(fig.axes[0].lines[:3]):
        mine = res["round_robin"].iterations.query("replica == @k")
        assert np.array_equal(line.get_xdata(), mine["start"].to_numpy())
    plt.close(fig)
    fig = plot_replica_load(res)
    shares = [p.get_height() for p in fig.axes[0].patches]
    assert len(shares) == 6 and shares[:3] == pytest.approx([0.335, 0.335, 0.33])  # 67+67+66
    plt.close(fig)
    plot_replica_load(res["round_robin"], tmp_path / "load.png")
    _is_png(tmp_path / "load.png", 13 * 110, round(3.8 * 110))
