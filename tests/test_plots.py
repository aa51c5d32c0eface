"""Tests of the sim/results/plots package: the files written, what the panels draw, and that the
core never imports matplotlib (the Agg backend is set in conftest.py)."""

import subprocess
import sys

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

import sim
import workloads
from sim.results.plots import (bin_iterations, plot_gantt, plot_latencies, plot_timeline,
                               run_title, save_plots)

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
    _is_png(paths[0], 14 * 110, round(4.2 * 110))
    _is_png(paths[1], 12 * 110, round(5.5 * 110))
    assert plt.get_fignums() == open_before  # written figures are closed


def test_plot_latencies_to_file_accepts_a_dict(results, tmp_path):
    path = tmp_path / "compare.png"
    plot_latencies(results, path)
    _is_png(path, 14 * 110, round(4.2 * 110))


def _curves(ax):
    """The CDF curves of a panel (the P50/P99 dots are labelled '_...', SLO lines 'SLO ...')."""
    return [ln for ln in ax.get_lines() if not ln.get_label().startswith(("_", "SLO"))]


def test_plot_latencies_draws_one_cdf_per_result_and_panel(results):
    fig = plot_latencies(results)  # no path: an open figure, for a notebook
    try:
        axes = fig.axes
        assert [ax.get_title() for ax in axes] == ["TTFT", "inter-token latency",
                                                   "end-to-end latency"]
        assert [ax.get_ylabel() for ax in axes[:2]] == ["fraction of requests",
                                                        "fraction of tokens"]
        assert all(ax.get_xscale() == "log" and ax.get_xlabel() == "seconds (log scale)"
                   for ax in axes)
        for ax in axes:
            assert [ln.get_label() for ln in _curves(ax)] == list(results)
        for label, ax_lines in zip(results, zip(*(_curves(ax) for ax in axes))):
            res = results[label]
            fin = res.requests[res.requests["status"] == "finished"]
            for line, values in zip(ax_lines, (fin["ttft"], res.itl(), fin["e2e"])):
                x, y = line.get_xdata(), line.get_ydata()
                np.testing.assert_array_equal(x, np.sort(values))  # an empirical CDF
                np.testing.assert_allclose(y, np.arange(1, len(values) + 1) / len(values))
        legend = axes[2].get_legend()
        assert [t.get_text() for t in legend.get_texts()] == list(results)
        # two results differ only in their scheduler: the title keeps what they share
        assert fig._suptitle.get_text() == "cost model ConstantCost · 1 req/s · n=200"
    finally:
        plt.close(fig)


def test_p50_p99_markers_sit_at_the_summary_percentiles_and_slo_lines_at_the_limits():
    df = workloads.load("azure-code", n=200, rate=4)
    res = sim.run(df)
    s = res.summary()
    fig = plot_latencies(res, slo={"ttft": 0.5, "e2e": 3.0})
    try:
        ttft_ax, itl_ax, e2e_ax = fig.axes
        for ax, key in ((ttft_ax, "ttft"), (itl_ax, "itl"), (e2e_ax, "e2e")):
            dots = [ln for ln in ax.get_lines() if ln.get_label() == "_chunked P50/P99"]
            assert len(dots) == 1
            np.testing.assert_allclose(dots[0].get_xdata(), [s[f"{key}_p50"], s[f"{key}_p99"]],
                                       rtol=1e-12)
            np.testing.assert_array_equal(dots[0].get_ydata(), [0.5, 0.99])
            texts = [t.get_text() for t in ax.texts]
            assert texts == [f"P50 {s[f'{key}_p50']:.3g} s", f"P99 {s[f'{key}_p99']:.3g} s"]
        slo_lines = {ax.get_title(): [ln.get_xdata()[0] for ln in ax.get_lines()
                                      if ln.get_label().startswith("SLO")] for ax in fig.axes}
        assert slo_lines == {"TTFT": [0.5], "inter-token latency": [], "end-to-end latency": [3.0]}
        assert fig._suptitle.get_text() == "llama-3.1-8b on h100 · chunked · 4 req/s · n=200"
    finally:
        plt.close(fig)


def test_the_title_names_model_gpu_and_tensor_parallelism():
    df = workloads.load("azure-code", n=30, rate=2)
    res = sim.run(df, model="llama-3.1-70b", gpu="h200", tensor_parallel=2, scheduler="vllm")
    assert run_title(res) == "llama-3.1-70b on h200 x2 (TP) · vllm · 2 req/s · n=30"


def test_the_title_names_the_fleet_and_a_closed_loops_users():
    """A cluster, prefill/decode pools and a closed loop were titled like one replica at the
    arrival rate the completions happened to give; compared side by side, a fact that differs
    leaves the shared title."""
    df = workloads.load("azure-code", n=30, rate=2)
    cost = sim.ConstantCost(0.01)
    four = sim.run(df, replicas=4, cost_model=cost)
    split = sim.run(df, disaggregation=sim.Disaggregation(2, 1), cost_model=cost)
    loop = sim.run(df, closed_loop=workloads.ClosedLoop(8, 0.5), cost_model=cost)
    assert run_title(four) == "cost model ConstantCost · 4 replicas · chunked · 2 req/s · n=30"
    assert run_title(split) == "cost model ConstantCost · 2P:1D · chunked · 2 req/s · n=30"
    assert run_title(loop) == "cost model ConstantCost · chunked · 8 users, think 0.5 s · n=30"
    assert run_title({"4": four, "2P:1D": split}) == "cost model ConstantCost · chunked · 2 req/s · n=30"


def test_a_run_with_rejections_says_how_many_finished_in_its_legend():
    """The CDFs are over finished requests: with 152 of 300 rejected the legend read
    'chunked' alone, as if every request were in the curves."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    df = pd.DataFrame({"arrival_time": [0.0, 0.5, 1.0, 1.5],
                       "num_prompt_tokens": [100, 5000, 100, 100], "num_output_tokens": 4})
    cost = sim.ConstantCost(0.01)
    some = sim.run(df, cost_model=cost, max_model_len=4096, model="llama-2-7b")
    every = sim.run(df, cost_model=cost)
    fig = plot_latencies({"capped": some, "all": every})
    try:
        labels = [t.get_text() for t in fig.axes[2].get_legend().get_texts()]
        assert labels == ["capped (3 of 4 finished)", "all"]
    finally:
        plt.close(fig)


def test_bad_input_to_plot_latencies_is_named(results):
    with pytest.raises(ValueError, match="no result to plot"):
        plot_latencies({})
    with pytest.raises(ValueError, match=r"slo keys must be among .*\['p99'\]"):
        plot_latencies(results["chunked"], slo={"p99": 1.0})
    df = pd.DataFrame({"arrival_time": [0.0], "num_prompt_tokens": [10_000],
                       "num_output_tokens": [4]})
    rejected = sim.run(df, cost_model=sim.ConstantCost(0.01), kv_blocks=8)
    with pytest.raises(ValueError, match=r"plot_latencies\('chunked'\): no finished request"):
        plot_latencies(rejected)
    broken = sim.run(workloads.load("azure-code", n=5), cost_model=sim.ConstantCost(0.01))
    broken.requests = broken.requests.drop(columns=["ttft"])
    with pytest.raises(ValueError, match=r"missing column\(s\) \['ttft'\]"):
        plot_latencies(broken)


def test_plot_latencies_labels_a_single_result_by_its_scheduler(results):
    fig = plot_latencies(results["static"])
    try:
        assert [ln.get_label() for ln in _curves(fig.axes[0])] == ["static"]
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


def test_a_long_run_draws_the_itl_cdf_from_weighted_gaps(monkeypatch):
    import sim.results.plots.latency as plots
    res = sim.run(workloads.load("azure-code", n=100, rate=4))  # roofline: gaps of many sizes
    every = np.sort(res.itl())
    assert np.unique(every).size > 200
    monkeypatch.setattr(plots, "ITL_EXACT", 10)  # as if the run had more than 2M gaps
    monkeypatch.setattr(plots, "ITL_POINTS", 50)
    fig = plot_latencies(res)
    try:
        line = _curves(fig.axes[1])[0]
        x, y = line.get_xdata(), line.get_ydata()
        assert 50 <= len(x) <= 102 and y[-1] == 1.0 and x[-1] == every[-1]
        assert np.all(np.diff(x) >= 0) and np.all(np.diff(y) > 0)
        below = np.searchsorted(every, x, side="left") / every.size  # share strictly below x
        upto = np.searchsorted(every, x, side="right") / every.size  # share at most x
        assert np.all(below < y + 1e-12) and np.all(y <= upto + 1e-12)  # on the exact CDF
    finally:
        plt.close(fig)


@pytest.fixture(scope="module")
def preempting():
    rng = np.random.default_rng(5)
    n = 200
    df = pd.DataFrame({"arrival_time": np.sort(rng.uniform(0, 2, n)),
                       "num_prompt_tokens": rng.integers(20, 200, n),
                       "num_output_tokens": rng.integers(20, 300, n)})
    return sim.run(df, scheduler="continuous", cost_model=sim.LinearCost(0.01, 1e-5, 1e-4),
                   kv_blocks=64, max_batch_size=32)


def _brute_bins(it, nb):
    """Each bin's statistics by a plain loop over the iterations (the reference)."""
    t0, t1 = it["start"].iloc[0], (it["start"] + it["duration"]).max()
    width = (t1 - t0) / nb
    rows = []
    for b in range(nb):
        lo, hi = t0 + b * width, t0 + (b + 1) * width
        sel = it[(it["start"] >= lo) & ((it["start"] < hi) | (b == nb - 1))]
        w = sel["duration"]
        rows.append((np.average(sel["num_running"], weights=w) if len(sel) else np.nan,
                     sel["num_running"].max() if len(sel) else np.nan,
                     np.average(sel["kv_blocks_used"], weights=w) if len(sel) else np.nan,
                     sel["kv_blocks_used"].max() if len(sel) else np.nan,
                     int(sel["num_preemptions"].sum())))
    return np.array(rows, dtype=float)


def test_bin_iterations_matches_a_plain_loop(preempting):
    it = preempting.iterations
    binned = bin_iterations(it, bins=37)
    assert len(binned) == 37
    got = binned[["running_mean", "running_max", "kv_mean", "kv_max", "num_preemptions"]]
    np.testing.assert_allclose(got.to_numpy(dtype=float), _brute_bins(it, 37), rtol=1e-9,
                               atol=1e-9)
    assert binned["num_preemptions"].sum() == it["num_preemptions"].sum()  # nothing lost
    assert len(bin_iterations(it.iloc[:5], bins=400)) == 5  # never more bins than iterations


def test_plot_timeline_draws_the_bins_on_axes_scaled_to_the_data(preempting):
    res, it = preempting, preempting.iterations
    assert it["num_preemptions"].sum() > 0
    binned = bin_iterations(it, bins=50)
    fig = plot_timeline(res, bins=50)
    try:
        top, bottom = fig.axes
        lines = {ln.get_label(): ln for ln in top.get_lines()}
        assert list(lines) == ["running (mean)", "waiting (mean)"]  # no max-batch line
        np.testing.assert_array_equal(lines["running (mean)"].get_xdata(), binned["t"])
        np.testing.assert_array_equal(lines["running (mean)"].get_ydata(),
                                      binned["running_mean"])
        assert "max batch size 32" in top.get_title()
        assert top.get_ylim()[1] < 1.2 * max(binned["running_max"].max(),
                                             binned["waiting_mean"].max())
        np.testing.assert_allclose(bottom.get_lines()[0].get_ydata(), binned["kv_mean"] / 64 * 100)
        assert bottom.get_ylim() == pytest.approx((0, binned["kv_max"].max() / 64 * 100 * 1.15))
        assert bottom.get_xlabel() == "simulated time (s)"
        assert bottom.get_ylabel() == "KV blocks used (% of pool)"
        marks = bottom.collections[-1].get_offsets()  # one red dot per bin that preempted
        assert len(marks) == (binned["num_preemptions"] > 0).sum()
    finally:
        plt.close(fig)


def test_kv_axis_follows_low_usage_instead_of_0_to_100():
    df = workloads.load("sharegpt", n=100, rate=1)
    res = sim.run(df, model="llama-3.1-8b", gpu="h100")  # its memory budget: a few % in use
    peak = res.summary()["kv_usage_max"] * 100
    assert peak < 20
    fig = plot_timeline(res)
    try:
        assert fig.axes[1].get_ylim()[1] == pytest.approx(peak * 1.15)
    finally:
        plt.close(fig)


def test_plot_timeline_bad_input():
    res = sim.run(workloads.load("azure-code", n=5), cost_model=sim.ConstantCost(0.01))
    with pytest.raises(ValueError, match="bins must be a positive integer, got 0"):
        plot_timeline(res, bins=0)
    res.iterations = res.iterations.iloc[:0]
    with pytest.raises(ValueError, match="no iteration to plot"):
        plot_timeline(res)
    res.iterations = pd.DataFrame({"start": [0.0]})
    with pytest.raises(ValueError, match=r"iterations: missing column\(s\) \['duration'"):
        plot_timeline(res)


def test_a_run_of_one_iteration_draws_its_point():
    """One request of one output token runs one iteration: one bin, whose lines were single
    points drawn without a marker - empty axes, in sim run --plots and the report."""
    df = pd.DataFrame({"arrival_time": [0.0], "num_prompt_tokens": [10],
                       "num_output_tokens": [1]})
    one = sim.run(df, cost_model=sim.ConstantCost(0.01))
    cluster = sim.run(pd.concat([df, df.assign(arrival_time=0.5)], ignore_index=True),
                      cost_model=sim.ConstantCost(0.01), replicas=2)
    for res, lines in ((one, 3), (cluster, 4)):
        assert len(res.iterations) == len(res.requests)  # one iteration per replica
        fig = plot_timeline(res)
        drawn = [line for ax in fig.axes for line in ax.lines if len(line.get_xdata()) == 1]
        assert len(drawn) == lines
        assert all(line.get_marker() not in (None, "None", "") for line in drawn)
        plt.close(fig)
    many = plot_timeline(sim.run(workloads.load("azure-code", n=5),
                                 cost_model=sim.ConstantCost(0.01)))
    assert all(line.get_marker() in (None, "None", "") for ax in many.axes for line in ax.lines)
    plt.close(many)


def test_gantt_bars_are_each_requests_waiting_prefill_and_decode():
    df = pd.DataFrame({"arrival_time": [0.0, 0.02, 0.03, 0.5],
                       "num_prompt_tokens": [16, 16, 10_000, 40],
                       "num_output_tokens": [4, 6, 4, 3]})
    res = sim.run(df, cost_model=sim.LinearCost(0.01, 1e-4, 1e-3), kv_blocks=8)
    req = res.requests
    fig = plot_gantt(res)
    try:
        ax = fig.axes[0]
        assert [c.get_label() for c in ax.containers] == ["waiting", "prefill", "decode"]
        fin = req[req["status"] == "finished"]
        for bars, (a, b) in zip(ax.containers, (("arrival_time", "first_scheduled_time"),
                                                ("first_scheduled_time", "first_token_time"),
                                                ("first_token_time", "finish_time"))):
            np.testing.assert_allclose([p.get_x() for p in bars], fin[a])
            np.testing.assert_allclose([p.get_width() for p in bars], fin[b] - fin[a])
            assert [p.get_y() + p.get_height() / 2 for p in bars] == [0, 1, 3]  # row 2 rejected
        assert ax.get_title() == "requests; 1 rejected (no bar)"
        assert ax.get_xlabel() == "simulated time (s)"
    finally:
        plt.close(fig)
    fig = plot_gantt(res, max_requests=2)
    try:
        assert fig.axes[0].get_title() == "requests (first 2 of 4)"
        assert len(fig.axes[0].containers[0]) == 2
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="max_requests must be a positive integer, got 0"):
        plot_gantt(res, max_requests=0)


def test_gantt_shows_the_request_path_and_the_kv_transfer_where_a_run_has_them():
    # the request path's time counted as "waiting" and the KV transfer as "decode"; the bars
    # of a request still tile arrival to finish
    df = pd.DataFrame({"arrival_time": [0.0, 0.02, 0.5], "num_prompt_tokens": [400, 16, 40],
                       "num_output_tokens": [4, 1, 3]})
    cost = sim.LinearCost(0.01, 1e-4, 1e-3)
    runs = {"path": sim.run(df, cost_model=cost, request_path=sim.RequestPath(0.05, 1e-4, 0.02)),
            "split": sim.run(df, cost_model=cost, disaggregation=sim.Disaggregation(
                1, 1, link_bandwidth_gbps=1e-4)),
            "both": sim.run(df, cost_model=cost, request_path=sim.RequestPath(0.05, 0.0, 0.02),
                            disaggregation=sim.Disaggregation(1, 1, link_bandwidth_gbps=1e-4))}
    labels = {"path": ["request path", "waiting", "prefill", "decode", "response path"],
              "split": ["waiting", "prefill", "KV transfer", "decode"],
              "both": ["request path", "waiting", "prefill", "KV transfer", "decode",
                       "response path"]}
    for name, res in runs.items():
        fig = plot_gantt(res)
        try:
            ax = fig.axes[0]
            assert [c.get_label() for c in ax.containers] == labels[name]
            req = res.requests
            lefts = np.array([[p.get_x() for p in bars] for bars in ax.containers])
            widths = np.array([[p.get_width() for p in bars] for bars in ax.containers])
            np.testing.assert_allclose(lefts[0], req["arrival_time"])
            np.testing.assert_allclose(lefts[1:], (lefts + widths)[:-1], atol=1e-12)  # tiled
            np.testing.assert_allclose((lefts + widths)[-1], req["finish_time"])
            assert (widths >= -1e-12).all()
            if "KV transfer" in labels[name]:
                k = labels[name].index("KV transfer")
                np.testing.assert_allclose(widths[k], req["kv_transfer_time"].fillna(0))
                assert widths[k][0] > 0.01  # 400 tokens' KV at 100 kB/s
            if "request path" in labels[name]:
                np.testing.assert_allclose(widths[-1], 0.02)
        finally:
            plt.close(fig)


def test_core_never_imports_matplotlib():
    code = ("import sys, sim, workloads\n"
            "sim.run(workloads.load('azure-code', n=20), cost_model=sim.ConstantCost(0.01))"
            ".summary()\n"
            "bad = [m for m in sys.modules if m.startswith('matplotlib') "
            "or m.startswith('sim.results.plots')]\n"
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
        mine = bin_iterations(res["round_robin"].iterations.query("replica == @k"))
        assert np.array_equal(line.get_xdata(), mine["t"].to_numpy())
        np.testing.assert_array_equal(line.get_ydata(), mine["running_mean"].to_numpy())
    plt.close(fig)
    fig = plot_replica_load(res)
    shares = [p.get_height() for p in fig.axes[0].patches]
    assert len(shares) == 6 and shares[:3] == pytest.approx([0.335, 0.335, 0.33])  # 67+67+66
    plt.close(fig)
    plot_replica_load(res["round_robin"], tmp_path / "load.png")
    _is_png(tmp_path / "load.png", 13 * 110, round(3.8 * 110))
