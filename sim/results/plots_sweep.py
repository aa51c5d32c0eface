"""Matplotlib figures of a sweep table (one row per point, as :func:`sim.sweep` returns).

matplotlib is imported lazily through :mod:`.plots.figure` (the only module that names it). Rows
whose ``error`` is not empty (failed points) are left out; several rows for one x (repeats, or grid
fields not shown) are averaged, and their min-max spread is drawn as a band. A table without the
needed columns, or with no successful row, raises ``ValueError`` naming them.

- :func:`plot_sweep`: any metric against the grid's first field, one line per combination of
  the others (what ``sim sweep`` draws per metric).
- :func:`plot_percentiles_vs_rate`: P50 / P90 / P99 of a latency against the request rate, one
  colour per ``by`` group; with ``slo`` a red line at the limit and, per group, a dotted
  vertical line at the knee: the highest rate whose P99 meets it (none drawn if no rate does).
- :func:`plot_chunk_tradeoff`: the chunked-prefill trade-off: one point per chunk size at
  (ITL metric, TTFT metric), joined in chunk-size order and labelled with the size, so the
  curve shows how a smaller chunk buys inter-token latency with time to first token.
"""

from __future__ import annotations

import numpy as np

from .plots.figure import finish, need_columns, pyplot

LATENCY = ("ttft", "itl", "tpot", "e2e", "queueing")


FIELD_UNITS = {"rate": "req/s", "chunk_size": "tokens", "token_budget": "tokens",
               "max_batch_size": "requests", "num_requests": "requests", "kv_blocks": "blocks",
               "block_size": "tokens", "tensor_parallel": "GPUs"}


def _unit(metric) -> str:
    return " (s)" if metric.split("_")[0] in LATENCY else ""


def _field_label(field) -> str:
    """A grid field with its unit, when it has one: ``rate (req/s)``."""
    return f"{field} ({FIELD_UNITS[field]})" if field in FIELD_UNITS else field


def _ok(table, columns, what):
    need_columns(table, columns, what)
    ok = table[table["error"] == ""] if "error" in table else table
    if not len(ok):
        raise ValueError(f"{what}: no successful row to plot ({len(table)} rows)")
    return ok


def _groups(table, by):
    if by is None:
        return [(None, table)]
    return [(k[0] if isinstance(k, tuple) and len(k) == 1 else k, g)
            for k, g in table.groupby(by if isinstance(by, list) else [by], sort=True)]


def _mean_band(part, x, metric):
    g = part.groupby(x, sort=True)[metric]
    return g.mean(), g.min(), g.max()


def plot_sweep(table, fields, metric, path=None):
    """A sweep's ``metric`` against its first grid field, one line per combination of the other
    ``fields`` (failed points are left out); units in seconds for latency metrics."""
    x, others = fields[0], list(fields[1:])
    ok = _ok(table, [x, metric] + others, "plot_sweep")
    plt = pyplot(path is not None)
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, part in _groups(ok, others or None):
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{k}={v}" for k, v in zip(others, key)) or metric
        mean, lo, hi = _mean_band(part, x, metric)
        line = ax.plot(mean.index, mean.to_numpy(), marker="o", label=label)[0]
        if (hi > lo).any():
            ax.fill_between(mean.index, lo, hi, alpha=0.2, color=line.get_color())
    ax.set_xlabel(_field_label(x))
    ax.set_ylabel(metric + _unit(metric))
    ax.set_title(f"{metric} by {x}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return finish(fig, path, plt)


def knee(table, metric="ttft", limit=None, x="rate"):
    """The highest ``x`` whose mean ``{metric}_p99`` is within ``limit`` (s), and every lower
    ``x`` too; ``None`` when the lowest fails."""
    mean = table.groupby(x, sort=True)[f"{metric}_p99"].mean()
    best = None
    for value, p99 in mean.items():
        if not p99 <= limit:
            break
        best = value
    return best


def plot_percentiles_vs_rate(table, metric="ttft", path=None, *, x="rate", by=None, slo=None):
    """P50, P90 and P99 of ``metric`` (``ttft``, ``itl``, ``tpot``, ``e2e``, ``queueing_delay``)
    against ``x`` (default ``rate``), one colour per value of ``by``; ``slo``: a limit in
    seconds, drawn with the knee (see the module docstring)."""
    cols = [f"{metric}_p{q}" for q in (50, 90, 99)]
    ok = _ok(table, [x] + cols + ([by] if by else []), "plot_percentiles_vs_rate")
    plt = pyplot(path is not None)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (key, part) in enumerate(_groups(ok, by)):
        color = colors[i % len(colors)]
        name = f"{by}={key} " if by else ""
        for col, style in zip(cols, (":", "--", "-")):
            mean, lo, hi = _mean_band(part, x, col)
            ax.plot(mean.index, mean.to_numpy(), style, marker="o", ms=3, color=color,
                    label=f"{name}{col.rsplit('_', 1)[1].upper()}")
            if (hi > lo).any():
                ax.fill_between(mean.index, lo, hi, alpha=0.15, color=color)
        if slo is not None:
            k = knee(part, metric, slo, x)
            if k is not None:
                ax.axvline(k, color=color, ls=":", lw=1.2, label=f"{name}knee: P99 within SLO "
                                                                 f"up to {k:g}")
    if slo is not None:
        ax.axhline(slo, color="red", ls="--", lw=1, label=f"SLO {slo:g} s")
    ax.set_yscale("log")
    ax.set(xlabel=_field_label(x), ylabel=f"{metric} (s, log scale)",
           title=f"{metric} percentiles by {x}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if by else 1)
    fig.tight_layout()
    return finish(fig, path, plt)


def plot_chunk_tradeoff(table, path=None, *, x="chunk_size", ttft="ttft_p99", itl="itl_p99",
                        by=None):
    """The TTFT / ITL trade-off across ``x`` (the chunk size, or any knob): one point per
    value at (mean ``itl``, mean ``ttft``), joined in ``x`` order and labelled with it."""
    ok = _ok(table, [x, ttft, itl] + ([by] if by else []), "plot_chunk_tradeoff")
    plt = pyplot(path is not None)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for key, part in _groups(ok, by):
        g = part.groupby(x, sort=True)[[itl, ttft]].mean()
        ax.plot(g[itl].to_numpy(), g[ttft].to_numpy(), marker="o",
                label=f"{by}={key}" if by else f"by {x}")
        for value, (xi, yi) in zip(g.index, g.to_numpy()):
            ax.annotate(f"{value:g}", (xi, yi), xytext=(5, 4), textcoords="offset points",
                        fontsize=8)
    ax.set(xlabel=itl + _unit(itl), ylabel=ttft + _unit(ttft),
           title=f"{ttft} vs {itl} across {x} (labels: {x})")
    if np.all(ok[[itl, ttft]].to_numpy() > 0):
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return finish(fig, path, plt)
