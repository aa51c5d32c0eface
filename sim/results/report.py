"""One self-contained HTML page of a run, to send to a colleague: what was simulated, the
settings, the summary table, the findings of :func:`~sim.results.diagnose.diagnose` in words,
and the figures of :mod:`.plots` embedded as base64 PNG.

Invariants: the page needs nothing else - no network, no file beside it (every image is a
``data:image/png;base64`` URI, the style is inline, there is no script); every text from the run
(settings, labels, findings) is HTML-escaped; the file is written under a temporary name in its
folder and renamed into place, so a reader sees the previous page or the new one, never half of
one, and a failure leaves no temporary file behind. Figures: the latency CDFs (when a request
finished), the timeline (when an iteration ran) and, for runs of at most ``GANTT_MAX`` requests,
the per-request Gantt.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import math
from pathlib import Path

from .atomic import atomic_path

GANTT_MAX = 300  # requests: above this the Gantt view is left out (a bar per request)

STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;"
         "padding:2px 8px;text-align:left;font-size:90%}td.n{text-align:right}"
         "img{max-width:100%;border:1px solid #eee;margin:.5em 0}"
         ".finding{background:#fff4e5;border-left:4px solid #f90;padding:.4em .8em;margin:.4em 0}")


def _fmt(value) -> str:
    if value is None:  # (a setting left unset: its default, said where it is shown)
        return "not set"
    if isinstance(value, dict):
        return ", ".join(f"{k} = {_fmt(v)}" for k, v in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value) or "none"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return "n/a" if not math.isfinite(value) else f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table(rows) -> str:
    """Two-column table of (name, value); numbers right-aligned."""
    out = ["<table>"]
    for k, v in rows:
        cls = ' class="n"' if isinstance(v, (int, float)) and not isinstance(v, bool) else ""
        out.append(f"<tr><th>{html.escape(str(k))}</th><td{cls}>{html.escape(_fmt(v))}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


# the summary in sections a person reads: (heading, key prefixes); a key no section names goes
# to "Other" under its own name (a metric added later still shows)
SECTIONS = (("Requests", ("num_requests", "num_finished", "num_rejected")),
            ("Latency", ("ttft_", "itl_", "tpot_", "e2e_", "queueing_delay_",
                         "kv_transfer_time_")),
            ("SLOs", ("slo_", "goodput")),
            ("Throughput", ("duration", "request_throughput", "output_token_throughput",
                            "total_token_throughput")),
            ("Batch and KV cache", ("busy_fraction", "num_iterations", "mean_batch_size",
                                    "slot_utilization", "kv_", "num_preemptions",
                                    "max_preemptions", "prefill_", "prefix_")),
            ("Speculative decoding", ("spec_",)),
            ("Cost and energy", ("usd_", "energy_", "avg_power_")),
            ("Run", ("scheduler", "cost_model", "engine_overhead", "num_replicas", "num_gpus",
                     "wall_seconds")))
STATS = {"mean": "mean", "p50": "P50", "p90": "P90", "p95": "P95", "p99": "P99"}
METRICS = {"ttft": "TTFT", "itl": "ITL", "tpot": "TPOT", "e2e": "E2E",
           "queueing_delay": "queueing delay", "kv_transfer_time": "KV transfer time"}
LABELS = {  # key -> (label, unit); unit "%" shows a fraction as a percentage
    "num_requests": ("requests", ""), "num_finished": ("finished", ""),
    "num_rejected": ("rejected", ""),
    "num_rejected_context_length": ("rejected: over the context length", ""),
    "num_rejected_max_num_tokens": ("rejected: prompt over the token budget", ""),
    "num_rejected_kv_pool": ("rejected: more KV than the pool holds", ""),
    "num_rejected_conversation_abandoned": ("rejected: turns of abandoned conversations", ""),
    "slo_attainment": ("meet every SLO", "%"), "goodput": ("goodput", "req/s"),
    "goodput_per_gpu": ("goodput per GPU", "req/s"),
    "duration": ("window: first arrival to last finish", "s"),
    "request_throughput": ("request throughput", "req/s"),
    "output_token_throughput": ("output token throughput", "tok/s"),
    "total_token_throughput": ("total token throughput", "tok/s"),
    "busy_fraction": ("busy (an iteration running)", "%"),
    "num_iterations": ("iterations", ""), "mean_batch_size": ("mean batch", "requests"),
    "slot_utilization": ("batch slots in use", "%"), "kv_usage_mean": ("KV in use, mean", "%"),
    "kv_usage_max": ("KV in use, peak", "%"), "kv_blocks": ("KV pool", "blocks"),
    "kv_tokens": ("KV pool", "tokens"), "kv_pool": ("KV pool sized by", ""),
    "num_preemptions": ("preemptions", ""), "max_preemptions": ("most preemptions of one", ""),
    "prefill_tokens_computed": ("prefill tokens computed", "tokens"),
    "prefill_compute_ratio": ("prefill computed / prompt tokens", "x"),
    "prefix_hit_rate": ("prompt tokens from the prefix cache", "%"),
    "spec_acceptance_rate": ("draft tokens accepted", "%"),
    "spec_mean_acceptance_length": ("tokens per verification", "tokens"),
    "usd_per_hour": ("GPU cost", "$/h"),
    "usd_per_million_output_tokens": ("cost per million output tokens", "$"),
    "usd_per_million_total_tokens": ("cost per million prompt + output tokens", "$"),
    "energy_joules_per_output_token": ("energy per output token", "J"),
    "avg_power_watts": ("mean GPU power", "W"),
    "scheduler": ("scheduler", ""), "cost_model": ("cost model", ""),
    "engine_overheads": ("engine overheads", ""),
    "engine_overhead_per_request_s": ("engine overhead per request", "s"),
    "engine_overhead_per_request_layer_s": ("engine overhead per request per layer", "s"),
    "engine_overhead_per_request_total_s": ("engine overhead per request, all layers", "s"),
    "engine_overhead_per_iter_s": ("engine CPU per iteration", "s"),
    "engine_overhead_per_seq_s": ("engine CPU per sequence per iteration", "s"),
    "engine_overhead_overlap": ("engine CPU overlapped with the GPU", ""),
    "engine_overhead_per_prefill_iter_s": ("engine fixed time per prefill iteration", "s"),
    "engine_overhead_prefill_host_layer_s": ("engine host time per layer of a prefill "
                                             "iteration", "s"),
    "engine_overhead_prefill_host_launch_s": ("engine host time per kernel launch of a "
                                              "prefill iteration", "s"),
    "engine_overhead_prefill_launches": ("kernel launches of a prefill forward", ""),
    "engine_overhead_prefill_host_s": ("engine host time of a prefill iteration (its least)",
                                       "s"),
    "num_replicas": ("replicas", ""), "num_gpus": ("GPUs", ""),
    "wall_seconds": ("wall time to simulate", "s")}


def label(key) -> tuple:
    """``(label, unit)`` of a summary key: :data:`LABELS`, a latency statistic (``ttft_p99``:
    "TTFT P99", s), an SLO (``slo_ttft``: "TTFT SLO", s; ``slo_attainment_itl``: "meet the ITL
    SLO", %), else the key itself without a unit."""
    if key in LABELS:
        return LABELS[key]
    metric, _, stat = key.rpartition("_")
    if metric in METRICS and stat in STATS:
        return f"{METRICS[metric]} {STATS[stat]}", "s"
    if key.startswith("slo_attainment_") and key[15:] in METRICS:
        return f"meet the {METRICS[key[15:]]} SLO" + (" (every gap)" if key.endswith("itl")
                                                      else ""), "%"
    if key.startswith("slo_") and key[4:] in METRICS:
        return f"{METRICS[key[4:]]} SLO", "s"
    return key, ""


def _with_unit(value, unit) -> str:
    if unit == "%" and isinstance(value, float) and math.isfinite(value):
        return f"{value:.1%}"
    text = _fmt(value)
    return f"{text} {unit}" if unit and text != "n/a" else text


def summary_sections(summary) -> list:
    """``[(heading, [(label, value with its unit, key)])]``: the summary grouped
    (:data:`SECTIONS`), each metric by its label (:func:`label`); empty sections left out."""
    groups = {heading: [] for heading, _ in SECTIONS}
    groups["Other"] = []
    for key, value in summary.items():
        heading = next((h for h, prefixes in SECTIONS if any(
            key == p or (p.endswith("_") and key.startswith(p)) or key.startswith(p + "_")
            for p in prefixes)), "Other")
        name, unit = label(key)
        groups[heading].append((name, _with_unit(value, unit), key))
    return [(heading, rows) for heading, rows in groups.items() if rows]


def _summary_html(summary) -> list:
    parts = []
    for heading, rows in summary_sections(summary):
        parts.append(f"<h3>{html.escape(heading)}</h3><table>")
        for name, value, key in rows:
            parts.append(f"<tr><th>{html.escape(name)}</th><td class='n'>{html.escape(value)}"
                         f"</td><td><code>{html.escape(key)}</code></td></tr>")
        parts.append("</table>")
    return parts


def _png(draw) -> str:
    """``draw(buffer)`` saves a figure into the buffer; returns the ``<img>`` with it inline."""
    buf = io.BytesIO()
    draw(buf)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="figure" src="data:image/png;base64,{data}">'


def config_rows(config) -> list:
    """(field, value) for each field of the run's config, objects by their repr."""
    rows = []
    for f in dataclasses.fields(config):
        v = getattr(config, f.name)
        rows.append((f.name, v if v is None or isinstance(v, (bool, int, float, str)) else repr(v)))
    return rows


def _figures(result, slo) -> list:
    """The figures section: each figure that has something to draw, as an inline PNG."""
    from .plots import plot_gantt, plot_latencies, plot_timeline
    parts = ["<h2>Figures</h2>"]
    finished = bool((result.requests["status"] == "finished").any())
    if finished:
        parts.append(_png(lambda buf: plot_latencies(result, buf, slo=slo)))
    if len(result.iterations):
        parts.append(_png(lambda buf: plot_timeline(result, buf)))
        if len(result.requests) <= GANTT_MAX and finished:
            parts.append(_png(lambda buf: plot_gantt(result, buf, max_requests=GANTT_MAX)))
    if len(parts) == 1:  # (the heading alone read as figures lost)
        parts.append("<p>No figure: no request finished and no iteration ran (every request "
                     "was rejected at arrival).</p>")
    return parts


def _grid(rows) -> str:
    """A table whose first row is its header; numbers right-aligned."""
    out = ["<table>", "<tr>" + "".join(f"<th>{html.escape(str(h))}</th>" for h in rows[0])
           + "</tr>"]
    for row in rows[1:]:
        cells = []
        for v in row:
            cls = ' class="n"' if isinstance(v, (int, float)) and not isinstance(v, bool) else ""
            cells.append(f"<td{cls}>{html.escape(_fmt(v))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def render(result, *, slo=None, settings=None, findings=None, figures=True,
           sections=()) -> str:
    """The page as a string (see the module docstring). ``settings``: a dict of name -> value
    shown as the settings (e.g. the CLI's, with the workload; default: the run's config);
    ``findings``: defaults to ``result.diagnose()``; ``figures=False``: a page without them;
    ``sections``: (heading, rows) tables after the summary, rows[0] their header (``sim
    compare``'s measured vs simulated), or (heading, draw) figures, ``draw(buffer)`` saving a
    PNG into it (``sim plan``'s Pareto plot)."""
    from .plots import run_title
    summary = result.summary(slo=slo)
    findings = result.diagnose() if findings is None else findings
    title = run_title(result)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             f"</title><style>{STYLE}</style></head><body>",
             f"<h1>Simulation report</h1><p>{html.escape(title)}</p>"]
    parts.append("<h2>Findings</h2>")
    if findings:
        for f in findings:
            parts.append(f"<div class='finding' data-code='{html.escape(f.code)}'><b>"
                         f"{html.escape(f.message)}</b><br>Try: {html.escape(f.action)}</div>")
    else:
        parts.append("<p>No finding: nothing in this run matches a known problem.</p>")
    parts.append("<h2>Summary</h2>")
    parts += _summary_html(summary)
    for heading, rows in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        parts.append(_png(rows) if callable(rows) else _grid(rows))
    if figures:
        parts += _figures(result, slo)
    parts.append("<h2>Settings</h2>")
    rows = list(settings.items()) if settings else config_rows(result.config)
    parts.append(_table(rows + [("KV blocks in the pool", result.kv_blocks),
                                ("cost model", result.cost_model_name)]))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_report(result, path, *, slo=None, settings=None, findings=None,
                 figures=True, sections=()) -> Path:
    """Write :func:`render`'s page to ``path`` atomically (a temporary file in the same folder,
    renamed into place; the folder is created if missing); returns the path."""
    path = Path(path)
    page = render(result, slo=slo, settings=settings, findings=findings, figures=figures,
                  sections=sections)
    with atomic_path(path) as tmp:  # (the folder created if missing)
        tmp.write_text(page, encoding="utf-8")
    return path
