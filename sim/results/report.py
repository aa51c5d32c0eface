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
import os
import uuid
from pathlib import Path

GANTT_MAX = 300  # requests: above this the Gantt view is left out (a bar per request)

STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;"
         "padding:2px 8px;text-align:left;font-size:90%}td.n{text-align:right}"
         "img{max-width:100%;border:1px solid #eee;margin:.5em 0}"
         ".finding{background:#fff4e5;border-left:4px solid #f90;padding:.4em .8em;margin:.4em 0}")


def _fmt(value) -> str:
    if isinstance(value, bool) or value is None:
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
    compare``'s measured vs simulated)."""
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
    parts.append(_table(list(summary.items())))
    for heading, rows in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        parts.append(_grid(rows))
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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
    try:  # O_EXCL: a fresh file; mode 0o666 less the umask, as open() would give the page
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(page)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
