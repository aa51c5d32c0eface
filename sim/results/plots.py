"""Matplotlib figures of a :class:`~sim.results.metrics.Result`.

Nothing in the simulator core imports this module, and it imports matplotlib only inside the
functions, so ``import sim`` and ``sim.run`` never load matplotlib (tests/test_plots.py checks
it); the CLI imports it only when asked for plots.

Figures:

- :func:`plot_latencies`: one row of three panels, the empirical CDFs of TTFT (one point per
  finished request), ITL (one point per token gap, pooled as :meth:`Result.itl`) and E2E (per
  finished request). x: seconds, log scale; y: cumulative fraction of requests (of tokens for
  ITL), each step 1/count. One curve per Result, to compare runs: pass ``{label: Result}``
  (a bare Result is labelled by its scheduler). Non-finite values (rejected requests) are left
  out; values <= 0 cannot show on the log axis. Beyond 2M gaps the ITL curve is thinned to every
  k-th sorted value (k = size // 1M): deterministic, and the CDF's shape is kept.
- :func:`plot_timeline`: two stacked panels sharing x = simulated time (each iteration's
  start). Top: running and waiting requests per iteration, with ``max_batch_size`` dashed.
  Bottom: KV blocks used, in % of the pool, with a red dot at each iteration that preempted.
  A cluster's result: one line of running requests and of KV usage per replica.
- :func:`plot_replica_load`: a cluster's load per replica (:meth:`Result.replica_summary`):
  share of the requests, busy fraction and mean KV usage, bars side by side; ``{label:
  Result}`` compares runs (one group of bars per run).

With ``path`` a figure is saved (110 dpi) and closed, so batch runs do not accumulate open
figures; without, it stays open for a notebook. Both return the figure. Saving first selects
the non-interactive Agg backend (``matplotlib.use("Agg", force=False)``): that is process-wide,
so in a notebook it replaces the inline backend for later plots too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _plt(headless):
    """pyplot, imported here (never at module import); ``headless``: switch to Agg first."""
    import matplotlib
    if headless:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    return plt


def _cdf(ax, values, label):
    """Empirical CDF of the finite ``values``: sorted x, y = 1/n .. 1; nothing drawn if none."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    v = v[np.isfinite(v)]
    if v.size:
        ax.plot(v, np.arange(1, v.size + 1) / v.size, label=label)


def plot_latencies(results, path=None):
    """CDFs of TTFT, ITL and E2E; ``results`` is a Result or ``{label: Result}`` to compare.

    Saved to ``path`` (any format matplotlib infers from the suffix) and closed when given."""
    plt = _plt(path is not None)
    if not isinstance(results, dict):
        results = {results.scheduler_name: results}
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for label, res in results.items():
        fin = res.requests[res.requests["status"] == "finished"]
        _cdf(axes[0], fin["ttft"], label)
        itl = res.itl()
        if itl.size > 2_000_000:  # plot a deterministic thinning of very long runs
            itl = np.sort(itl)[:: itl.size // 1_000_000]
        _cdf(axes[1], itl, label)
        _cdf(axes[2], fin["e2e"], label)
    for ax, title in zip(axes, ("TTFT", "inter-token latency", "end-to-end latency")):
        ax.set(title=title, xlabel="seconds", ylabel="fraction of requests" if ax is axes[0]
               else "fraction")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
    axes[1].set_ylabel("fraction of tokens")
    axes[2].legend(loc="lower right")
    fig.tight_layout()
    return _finish(fig, path, plt)


def plot_timeline(result, path=None):
    """Batch size (running and waiting requests) and KV-cache usage over simulated time, for
    one Result; saved to ``path`` and closed when given."""
    plt = _plt(path is not None)
    it = result.iterations
    fig, axes = plt.subplots(2, 1, figsize=(12, 5.5), sharex=True)
    cluster = "replica" in it and it["replica"].nunique() > 1
    if cluster:  # one line per replica (its iterations are its own timeline)
        for k, part in it.groupby("replica"):
            t = part["start"].to_numpy()
            axes[0].plot(t, part["num_running"], lw=0.8, label=f"running, replica {k}")
            axes[1].plot(t, part["kv_blocks_used"] / result.kv_blocks * 100, lw=0.8)
    else:
        t = it["start"].to_numpy()
        axes[0].plot(t, it["num_running"], lw=0.8, label="running")
        axes[0].plot(t, it["num_waiting"], lw=0.8, label="waiting")
        axes[1].plot(t, it["kv_blocks_used"] / result.kv_blocks * 100, lw=0.8)
    axes[0].axhline(result.config.max_batch_size, color="grey", ls="--", lw=0.8,
                    label="max batch size")
    axes[0].set(ylabel="requests", title="batch size over time")
    axes[0].legend(loc="upper right")
    pre = it[it["num_preemptions"] > 0]
    if len(pre):
        axes[1].scatter(pre["start"], pre["kv_blocks_used"] / result.kv_blocks * 100, s=6,
                        color="red", label="preemption", zorder=3)
        axes[1].legend(loc="upper right")
    axes[1].set(ylabel="KV blocks used (%)", xlabel="simulated time (s)", ylim=(0, 105),
                title="KV-cache usage")
    fig.tight_layout()
    return _finish(fig, path, plt)


def plot_replica_load(results, path=None):
    """Per-replica load share, busy fraction and KV usage of one Result or ``{label:
    Result}``; saved to ``path`` and closed when given."""
    plt = _plt(path is not None)
    if not isinstance(results, dict):
        results = {results.scheduler_name: results}
    metrics = (("load_share", "share of requests"), ("busy_fraction", "busy fraction"),
               ("kv_usage_mean", "mean KV usage"))
    fig, axes = plt.subplots(1, len(metrics), figsize=(13, 3.8), sharey=True)
    width = 0.8 / len(results)
    for j, (label, res) in enumerate(results.items()):
        per = res.replica_summary()
        x = np.arange(len(per)) + (j - (len(results) - 1) / 2) * width
        for ax, (col, _title) in zip(axes, metrics):
            ax.bar(x, per[col], width, label=label)
    for ax, (_col, title) in zip(axes, metrics):
        ax.set(title=title, xlabel="replica", xticks=range(len(per)))
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return _finish(fig, path, plt)


def _finish(fig, path, plt):
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return fig


def save_plots(result, outdir) -> list[Path]:
    """Write ``latency_cdfs.png`` and ``timeline.png`` into ``outdir`` (created if missing);
    returns their paths. One Result only: the timeline has no comparison form, so for several
    runs call :func:`plot_latencies` with a dict."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    paths = [outdir / "latency_cdfs.png", outdir / "timeline.png"]
    plot_latencies(result, paths[0])
    plot_timeline(result, paths[1])
    return paths


def plot_sweep(table, fields, metric, path=None):
    """A sweep's ``metric`` against its first grid field, one line per combination of the other
    ``fields`` (points that failed are left out); units in seconds for latency metrics."""
    plt = _plt(path is not None)
    x, others = fields[0], list(fields[1:])
    fig, ax = plt.subplots(figsize=(6, 4))
    ok = table[table["error"] == ""] if "error" in table else table
    groups = ok.groupby(others) if others else [((), ok)]
    for key, part in groups:
        part = part.sort_values(x)
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{k}={v}" for k, v in zip(others, key)) or metric
        ax.plot(part[x], part[metric], marker="o", label=label)
    unit = " (s)" if metric.split("_")[0] in ("ttft", "itl", "tpot", "e2e", "queueing") else ""
    ax.set_xlabel(x)
    ax.set_ylabel(metric + unit)
    ax.set_title(f"{metric} by {x}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return fig
