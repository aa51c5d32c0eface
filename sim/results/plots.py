"""Matplotlib figures of a :class:`~sim.results.metrics.Result` (sweep tables: :mod:`.plots_sweep`).

Nothing in the simulator core imports this module, and it imports matplotlib only inside the
functions, so ``import sim`` and ``sim.run`` never load matplotlib (tests/test_plots.py checks
it); the CLI imports it only when asked for plots. Every axis carries its unit.

Figures:

- :func:`plot_latencies`: one row of three panels, the empirical CDFs of TTFT (one point per
  finished request), ITL (one point per token gap, pooled as :meth:`Result.itl`) and E2E (per
  finished request). x: seconds, log scale; y: cumulative fraction. One curve per Result, to
  compare runs: pass ``{label: Result}`` (a bare Result is labelled by its scheduler). On each
  curve two dots mark its P50 and P99 (x = the summary's percentile, the same numbers as
  :meth:`Result.summary`); ``slo`` draws each limit as a red dashed line on its panel (``ttft``,
  ``itl``, ``e2e``). The title says what was simulated (:func:`run_title`). Non-finite values
  (rejected requests) are left out. Beyond ``ITL_EXACT`` (2M) gaps the ITL curve is computed from
  the run's (gap, weight) pairs without materialising one value per token (the CDF's value at
  each distinct gap: y = cumulative weight / total) and drawn at every k-th of them (k = pairs //
  ``ITL_POINTS``, 1M) and the last: deterministic, and the CDF's shape is kept.
- :func:`plot_timeline`: two stacked panels over simulated time, the iterations binned into at
  most ``bins`` equal time bins so that a million-request run stays readable. Top: per bin the
  time-weighted mean of running requests (a line), their max (a shaded band up to it) and the
  mean waiting requests; no max-batch-size line (it is in the title) to squeeze the real batch.
  Bottom: KV blocks used in % of the pool, mean and max per bin, on an axis scaled to the data
  (0 to 1.15 x the peak), and a red dot on each bin whose iterations preempted. A bin without
  iterations (idle time) is a gap. A cluster's result: per replica, the mean running requests
  and mean KV usage of its own iterations, binned.
- :func:`plot_gantt`: one bar per request (the first ``max_requests`` by arrival): waiting
  (arrival -> first scheduled), prefill (-> first token) and decode (-> finish), on simulated
  seconds; rejected requests have no bars (the title counts them).
- :func:`plot_replica_load`: a cluster's load per replica (:meth:`Result.replica_summary`):
  share of the requests, busy fraction and mean KV usage, bars side by side; ``{label:
  Result}`` compares runs (one group of bars per run).

With ``path`` a figure is saved (110 dpi) and closed, so batch runs do not accumulate open
figures; without, it stays open for a notebook. Every function returns the figure. Saving first
selects the non-interactive Agg backend (``matplotlib.use("Agg", force=False)``): that is
process-wide, so in a notebook it replaces the inline backend for later plots too. A Result with
nothing to draw, or a table without the columns a figure needs, raises ``ValueError`` naming it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import FIGURES

SLO_PANELS = ("ttft", "itl", "e2e")  # the panels of plot_latencies, in order


def _plt(headless):
    """pyplot, imported here (never at module import); ``headless``: switch to Agg first."""
    import matplotlib
    if headless:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    return plt


def _finish(fig, path, plt):
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return fig


def need_columns(df, columns, what) -> None:
    """``ValueError`` naming ``what`` and the columns of ``columns`` that ``df`` lacks."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what}: missing column(s) {missing}")


def _finished(result, what):
    need_columns(result.requests, ("status", "ttft", "e2e", "arrival_time"), what)
    fin = result.requests[result.requests["status"] == "finished"]
    if not len(fin):
        raise ValueError(f"{what}: no finished request to plot ({len(result.requests)} "
                         f"requests in the result)")
    return fin


def _name(x, default):
    if x is None:
        return default
    return x if isinstance(x, str) else getattr(x, "name", str(x))


def run_facts(result) -> dict:
    """What was simulated, in words: ``hardware`` (model on GPU, or the cost model when it is
    neither the roofline nor tied to a model), ``fleet`` (``4 replicas``, ``2P:1D`` prefill and
    decode replicas; None for one replica), ``scheduler``, ``rate`` (the workload's mean
    arrival rate, (n - 1) / arrival span; a closed loop's users and think time instead: its
    arrivals follow the completions) and ``n`` (requests)."""
    cfg = result.config
    if cfg.cost_model is None or cfg.model is not None or cfg.gpu is not None:
        hw = f"{_name(cfg.model, 'llama-3.1-8b')} on {_name(cfg.gpu, 'h100')}"
        if getattr(cfg, "tensor_parallel", 1) > 1:
            hw += f" x{cfg.tensor_parallel} (TP)"
    else:
        hw = f"cost model {result.cost_model_name}"
    disagg, replicas = getattr(cfg, "disaggregation", None), getattr(cfg, "replicas", 1)
    fleet = (f"{disagg.prefill_replicas}P:{disagg.decode_replicas}D" if disagg is not None
             else f"{replicas} replicas" if replicas > 1 else None)
    loop = getattr(cfg, "closed_loop", None)
    t = np.sort(result.requests["arrival_time"].to_numpy(dtype=np.float64))
    rate = f"{(len(t) - 1) / (t[-1] - t[0]):.3g} req/s" if len(t) > 1 and t[-1] > t[0] else None
    if loop is not None:
        rate = f"{loop.num_users} users" + (f", think {loop.think_time:g} s"
                                            if loop.think_time else "")
    return {"hardware": hw, "fleet": fleet, "scheduler": result.scheduler_name, "rate": rate,
            "n": f"n={len(result.requests):,}"}


def run_title(results) -> str:
    """The facts of :func:`run_facts` shared by every Result of ``results`` (one Result or a
    dict), joined: e.g. ``llama-3.1-8b on h100 · chunked · 4 req/s · n=200``."""
    facts = [run_facts(r) for r in (results.values() if isinstance(results, dict) else [results])]
    keep = [v for k, v in facts[0].items()
            if v is not None and all(f[k] == v for f in facts[1:])]
    return " · ".join(keep)


ITL_EXACT = 2_000_000  # gaps: up to this many, the ITL CDF has one point per gap
ITL_POINTS = 1_000_000  # beyond: the CDF drawn at about this many points


def _cdf(ax, values, label, y=None):
    """Empirical CDF of the finite ``values``: sorted x, y = 1/n .. 1 (or the ``y`` given with
    sorted ``values``); nothing drawn if none."""
    if y is None:
        v = np.sort(np.asarray(values, dtype=np.float64))
        v = v[np.isfinite(v)]
        y = np.arange(1, v.size + 1) / v.size
    else:
        v = values
    if v.size:
        return ax.plot(v, y, label=label)[0]
    return None


def _itl_for_cdf(res):
    """Every gap (at most ``ITL_EXACT``), else ``(x, y)``: the CDF at each distinct gap of the
    (gap, weight) pairs, thinned to every k-th point (see the module docstring)."""
    gaps, weights, extra = res._itl
    total = int(weights.sum()) + len(extra)
    if total <= ITL_EXACT:
        return res.itl()
    v, cum = res.itl_cdf()
    y = cum / total
    step = max(1, v.size // ITL_POINTS)
    idx = np.unique(np.r_[np.arange(0, v.size, step), v.size - 1])  # the last point: y = 1
    return v[idx], y[idx]


def plot_latencies(results, path=None, slo=None):
    """CDFs of TTFT, ITL and E2E with P50/P99 dots and ``slo`` lines (seconds by key);
    ``results`` is a Result or ``{label: Result}`` to compare. The CDFs are over finished
    requests: a run that rejected some says how many finished in its legend label. Saved to ``path`` (any format
    matplotlib infers from the suffix) and closed when given."""
    if not isinstance(results, dict):
        results = {results.scheduler_name: results}
    if not results:
        raise ValueError("plot_latencies: no result to plot (an empty dict)")
    unknown = sorted(set(slo or {}) - set(SLO_PANELS) - {"tpot"})
    if unknown:
        raise ValueError(f"plot_latencies: slo keys must be among {SLO_PANELS}, got {unknown}")
    fins = {label: _finished(res, f"plot_latencies({label!r})") for label, res in results.items()}
    plt = _plt(path is not None)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for label, res in results.items():
        fin = fins[label]
        itl = _itl_for_cdf(res)
        shown = label if len(fin) == len(res.requests) else (  # the CDFs are the finished ones'
            f"{label} ({len(fin):,} of {len(res.requests):,} finished)")
        p = {"ttft": np.percentile(fin["ttft"], (50, 99)), "itl": res.itl_percentiles((50, 99)),
             "e2e": np.percentile(fin["e2e"], (50, 99))}
        for ax, key, values in zip(axes, SLO_PANELS, (fin["ttft"], itl, fin["e2e"])):
            xy = values if isinstance(values, tuple) else (values, None)
            line = _cdf(ax, xy[0], shown, y=xy[1])
            if line is not None and np.isfinite(p[key]).all():
                ax.plot(p[key], [0.5, 0.99], "o", color=line.get_color(), ms=5,
                        label=f"_{label} P50/P99")  # '_': left out of the legend
                if len(results) == 1:
                    for x, y, name in zip(p[key], (0.5, 0.99), ("P50", "P99")):
                        ax.annotate(f"{name} {x:.3g} s", (x, y), xytext=(6, -10),
                                    textcoords="offset points", fontsize=8)
    for ax, key in zip(axes, SLO_PANELS):
        if slo and key in slo:
            ax.axvline(slo[key], color="red", ls="--", lw=1, label=f"SLO {slo[key]:g} s")
            ax.legend(loc="lower right", fontsize=8)
    for ax, title in zip(axes, ("TTFT", "inter-token latency", "end-to-end latency")):
        ax.set(title=title, xlabel="seconds (log scale)", ylabel="fraction of requests")
        ax.set_xscale("log")
        ax.grid(alpha=0.3)
    axes[1].set_ylabel("fraction of tokens")
    axes[2].legend(loc="lower right", fontsize=8)
    fig.suptitle(run_title(results))
    fig.tight_layout()
    return _finish(fig, path, plt)


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
    plt = _plt(path is not None)
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
    return _finish(fig, path, plt)


def _cluster_timeline(result, path, bins):
    """A cluster's timeline: per replica (its own iterations, binned on its own time span) the
    mean running requests and the mean KV usage in % of its pool."""
    plt = _plt(path is not None)
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
    return _finish(fig, path, plt)


# the columns every Gantt reads (a request path and disaggregation add their own)
GANTT_COLUMNS = ("arrival_time", "first_scheduled_time", "first_token_time", "finish_time")


def gantt_phases(result, fin) -> list:
    """``(label, start, end, color)`` per phase of the finished requests ``fin``: waiting,
    prefill and decode, with a request path (``engine_arrival_time``) its time in (arrival to
    the engine) and out (``out_s`` on the last token) as phases of their own, and with
    disaggregation (``kv_transfer_time``) the KV transfer between prefill and decode (the
    first token streams when it has landed)."""
    path = getattr(result.config, "request_path", None)
    out = float(path.out_s) if path is not None else 0.0
    first = fin["first_token_time"] - out  # the engine's times (the client's less out_s)
    end = fin["finish_time"] - out
    phases = []
    queued = fin["arrival_time"]
    if "engine_arrival_time" in fin:
        queued = fin["engine_arrival_time"]
        phases.append(("request path", fin["arrival_time"], queued, "tab:purple"))
    transfer = fin["kv_transfer_time"].fillna(0.0) if "kv_transfer_time" in fin else None
    prefilled = first if transfer is None else first - transfer  # (NaN: 1 token, no transfer)
    phases += [("waiting", queued, fin["first_scheduled_time"], "tab:gray"),
               ("prefill", fin["first_scheduled_time"], prefilled, "tab:orange")]
    if transfer is not None:
        phases.append(("KV transfer", prefilled, first, "tab:green"))
    phases.append(("decode", first, end, "tab:blue"))
    if path is not None:
        phases.append(("response path", end, fin["finish_time"], "tab:pink"))
    return phases


def plot_gantt(result, path=None, max_requests=100):
    """One row per request (the first ``max_requests`` by arrival), bars for waiting, prefill
    and decode in simulated seconds (and, where the run has them, the request path in and
    out and the KV transfer: :func:`gantt_phases`); saved to ``path`` and closed when
    given."""
    if isinstance(max_requests, bool) or not isinstance(max_requests, int) or max_requests < 1:
        raise ValueError(f"max_requests must be a positive integer, got {max_requests!r}")
    req = result.requests
    need_columns(req, ["status", *GANTT_COLUMNS], "plot_gantt")
    shown = req.sort_values("arrival_time", kind="stable").iloc[:max_requests]
    fin = shown[shown["status"] == "finished"]
    if not len(fin):
        raise ValueError(f"plot_gantt: no finished request among the first {len(shown)}")
    plt = _plt(path is not None)
    fig, ax = plt.subplots(figsize=(12, min(10.0, max(3.0, 0.12 * len(shown) + 1.5))))
    y = np.arange(len(shown))[(shown["status"] == "finished").to_numpy()]
    for label, start, end, color in gantt_phases(result, fin):
        ax.barh(y, end - start, left=start, height=0.8, color=color, label=label)
    ax.invert_yaxis()  # first arrival on top
    ax.set(xlabel="simulated time (s)", ylabel="request (by arrival)")
    rejected = len(shown) - len(fin)
    more = f" (first {len(shown):,} of {len(req):,})" if len(req) > len(shown) else ""
    ax.set_title(f"requests{more}" + (f"; {rejected} rejected (no bar)" if rejected else ""))
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)  # (off the bars)
    fig.suptitle(run_title(result))
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


def save_plots(result, outdir, slo=None) -> list[Path]:
    """Write ``latency_cdfs.png`` (when a request finished) and ``timeline.png`` (when an
    iteration ran) into ``outdir`` (created if missing); returns the paths written. One Result
    only: the timeline has no comparison form, so for several runs call :func:`plot_latencies`
    with a dict."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    paths = []
    if (result.requests["status"] == "finished").any():
        paths.append(outdir / FIGURES[0])
        plot_latencies(result, paths[-1], slo=slo)
    if len(result.iterations):
        paths.append(outdir / FIGURES[1])
        plot_timeline(result, paths[-1])
    return paths
