"""The latency figure: the empirical CDFs of TTFT, ITL and E2E of one run or several.

:func:`plot_latencies` draws one row of three panels: TTFT (one point per finished request), ITL
(one point per token gap, pooled as :meth:`Result.itl`) and E2E (per finished request). x:
seconds, log scale; y: cumulative fraction. One curve per Result, to compare runs: pass
``{label: Result}`` (a bare Result is labelled by its scheduler). On each curve two dots mark its
P50 and P99 (x = the summary's percentile, the same numbers as :meth:`Result.summary`); ``slo``
draws each limit as a red dashed line on its panel (``ttft``, ``itl``, ``e2e``). The title says
what was simulated (:func:`~sim.results.plots.figure.run_title`). Non-finite values (rejected
requests) are left out.

Invariant: a run's ITL curve is its exact CDF. Beyond ``ITL_EXACT`` (2M) gaps it is computed
from the run's (gap, weight) pairs without materialising one value per token (the CDF's value at
each distinct gap: y = cumulative weight / total) and drawn at every k-th of them (k = pairs //
``ITL_POINTS``, 1M) and the last: deterministic, and the CDF's shape is kept.
"""

from __future__ import annotations

import numpy as np

from .figure import finish, need_columns, pyplot, run_title

SLO_PANELS = ("ttft", "itl", "e2e")  # the panels of plot_latencies, in order


def _finished(result, what):
    need_columns(result.requests, ("status", "ttft", "e2e", "arrival_time"), what)
    fin = result.requests[result.requests["status"] == "finished"]
    if not len(fin):
        raise ValueError(f"{what}: no finished request to plot ({len(result.requests)} "
                         f"requests in the result)")
    return fin



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
    requests: a run that rejected some says how many finished in its legend label. Saved to
    ``path`` (any format matplotlib infers from the suffix) and closed when given."""
    if not isinstance(results, dict):
        results = {results.scheduler_name: results}
    if not results:
        raise ValueError("plot_latencies: no result to plot (an empty dict)")
    unknown = sorted(set(slo or {}) - set(SLO_PANELS) - {"tpot"})
    if unknown:
        raise ValueError(f"plot_latencies: slo keys must be among {SLO_PANELS}, got {unknown}")
    fins = {label: _finished(res, f"plot_latencies({label!r})") for label, res in results.items()}
    plt = pyplot(path is not None)
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
    return finish(fig, path, plt)

