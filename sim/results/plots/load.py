"""The load figures: batch size and KV-cache usage over simulated time, and a cluster's load per
replica.

- :func:`plot_timeline`: two stacked panels over simulated time, the iterations binned into at
  most ``bins`` equal time bins (:func:`bin_iterations`) so that a million-request run stays
  readable. Top: per bin the time-weighted mean of running requests (a line), their max (a
  shaded band up to it) and the mean waiting requests; no max-batch-size line (it is in the
  title) to squeeze the real batch. Bottom: KV blocks used in % of the pool, mean and max per
  bin, on an axis scaled to the data (0 to 1.15 x the peak), and a red dot on each bin whose
  iterations preempted. A bin without iterations (idle time) is a gap. A cluster's result: per
  replica, the mean running requests and mean KV usage of its own iterations, binned.
- :func:`plot_replica_load`: a cluster's load per replica (:meth:`Result.replica_summary`):
  share of the requests, busy fraction and mean KV usage, bars side by side; ``{label:
  Result}`` compares runs (one group of bars per run).

Invariant: binning never makes more bins than iterations, weights each iteration by its
duration (a zero-length one counts, weightless) and sums every preemption into its bin.
"""

from __future__ import annotations

import numpy as np

from .figure import finish, need_columns, pyplot, run_title


def bin_iterations(iterations, bins=400):
    """The iterations in at most ``bins`` equal bins of simulated time (by start), a DataFrame
    indexed by bin: ``t`` (bin centre, s), ``running_mean`` (weighted by duration),
    ``running_max``, ``waiting_mean``, ``kv_mean``, ``kv_max`` (blocks), ``num_preemptions``;
    bins without an iteration are NaN (0 preemptions)."""
    import pandas as pd
    need_columns(iterations, ("start", "duration", "num_running", "num_waiting",
                              "kv_blocks_used", "num_preemptions"), "iterations")
    if not len(iterations):
        raise ValueError("iterations: no iteration to plot (nothing ran)")
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be a positive integer, got {bins!r}")
    it = iterations
    start = it["start"].to_numpy(dtype=np.float64)
    t0, t1 = start[0], float((it["start"] + it["duration"]).max())
    nb = min(bins, len(it))
    width = (t1 - t0) / nb if t1 > t0 else 1.0
    b = np.minimum(((start - t0) / width).astype(np.int64), nb - 1)
    w = it["duration"].to_numpy(dtype=np.float64)
    w = np.where(w > 0, w, 1e-300)  # zero-length iterations still count, weightless
    frame = pd.DataFrame({"b": b, "w": w, "rw": w * it["num_running"], "ww": w * it["num_waiting"],
                          "kw": w * it["kv_blocks_used"], "r": it["num_running"],
                          "k": it["kv_blocks_used"], "p": it["num_preemptions"]})
    g = frame.groupby("b")
    out = pd.DataFrame({"running_mean": g["rw"].sum() / g["w"].sum(), "running_max": g["r"].max(),
                        "waiting_mean": g["ww"].sum() / g["w"].sum(),
                        "kv_mean": g["kw"].sum() / g["w"].sum(), "kv_max": g["k"].max(),
                        "num_preemptions": g["p"].sum()}).reindex(range(nb))
    out["num_preemptions"] = out["num_preemptions"].fillna(0).astype(np.int64)
    out.insert(0, "t", t0 + (np.arange(nb) + 0.5) * width)
    return out


def _dot(num_points) -> dict:
    """A line of one point is drawn as a dot: without a marker it is invisible (a run of one
    iteration, such as one request of one token, drew empty axes)."""
    return {"marker": "o", "markersize": 4} if num_points == 1 else {}


def plot_timeline(result, path=None, bins=400):
    """Batch size and KV-cache usage over simulated time, binned (see the module docstring);
    saved to ``path`` and closed when given."""
    it = result.iterations
    if "replica" in it and it["replica"].nunique() > 1:
        return _cluster_timeline(result, path, bins)
    binned = bin_iterations(it, bins)
    plt = pyplot(path is not None)
    fig, axes = plt.subplots(2, 1, figsize=(12, 5.5), sharex=True)
    t = binned["t"].to_numpy()
    dot = _dot(len(t))
    top, bottom = axes
    top.fill_between(t, binned["running_mean"], binned["running_max"], alpha=0.25, step="mid",
                     label="running, max in bin")
    top.plot(t, binned["running_mean"], lw=1, label="running (mean)", **dot)
    top.plot(t, binned["waiting_mean"], lw=1, label="waiting (mean)", **dot)
    top.set_ylim(bottom=0)
    top.set(ylabel="requests", title=f"batch size over time (max batch size "
                                     f"{result.config.max_batch_size:,}; {len(binned)} bins)")
    top.legend(loc="upper right", fontsize=8)
    pct = 100.0 / result.kv_blocks
    bottom.fill_between(t, binned["kv_mean"] * pct, binned["kv_max"] * pct, alpha=0.25,
                        step="mid", label="max in bin")
    bottom.plot(t, binned["kv_mean"] * pct, lw=1, label="mean", **dot)
    pre = binned[binned["num_preemptions"] > 0]
    if len(pre):
        bottom.scatter(pre["t"], pre["kv_max"] * pct, s=8, color="red", zorder=3,
                       label=f"preempted ({int(pre['num_preemptions'].sum()):,})")
    peak = float(np.nanmax(binned["kv_max"])) * pct
    bottom.set_ylim(0, max(peak * 1.15, 1e-9) if peak > 0 else 1.0)
    bottom.set(ylabel="KV blocks used (% of pool)", xlabel="simulated time (s)",
               title=f"KV-cache usage ({result.kv_blocks:,} blocks)")
    bottom.legend(loc="upper right", fontsize=8)
    fig.suptitle(run_title(result))
    fig.tight_layout()
    return finish(fig, path, plt)


def _cluster_timeline(result, path, bins):
    """A cluster's timeline: per replica (its own iterations, binned on its own time span) the
    mean running requests and the mean KV usage in % of its pool."""
    plt = pyplot(path is not None)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 5.5), sharex=True)
    pct = 100.0 / result.kv_blocks
    for k, part in result.iterations.groupby("replica"):
        binned = bin_iterations(part, bins)
        dot = _dot(len(binned))
        top.plot(binned["t"], binned["running_mean"], lw=0.9, label=f"running, replica {k}",
                 **dot)
        bottom.plot(binned["t"], binned["kv_mean"] * pct, lw=0.9, **dot)
    top.set_ylim(bottom=0)
    top.set(ylabel="requests (mean in bin)", title=f"batch size per replica (max batch size "
                                                    f"{result.config.max_batch_size:,})")
    top.legend(loc="upper right", fontsize=8)
    bottom.set_ylim(bottom=0)
    bottom.set(ylabel="KV blocks used (% of pool)", xlabel="simulated time (s)",
               title=f"KV-cache usage per replica ({result.kv_blocks:,} blocks each)")
    fig.suptitle(run_title(result))
    fig.tight_layout()
    return finish(fig, path, plt)



def plot_replica_load(results, path=None):
    """Per-replica load share, busy fraction and KV usage of one Result or ``{label:
    Result}``; saved to ``path`` and closed when given."""
    plt = pyplot(path is not None)
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
    return finish(fig, path, plt)

