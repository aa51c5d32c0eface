"""Matplotlib figures of a :class:`~sim.results.metrics.Result` (a sweep table's:
:mod:`sim.results.plots_sweep`), one module per family of figures:

- :mod:`.latency` - :func:`plot_latencies`, the CDFs of TTFT, ITL and E2E, to compare runs;
- :mod:`.load` - :func:`plot_timeline`, batch size and KV-cache usage over simulated time
  (:func:`bin_iterations`), and :func:`plot_replica_load`, a cluster's load per replica;
- :mod:`.gantt` - :func:`plot_gantt`, one bar per request and phase (:func:`gantt_phases`);
- :mod:`.figure` - what they share: pyplot on first use, saving, column checks, the title
  (:func:`run_title`, :func:`run_facts`).

Every name above is importable from here (``from sim.results.plots import plot_latencies``);
:func:`save_plots` writes a run's figures into a folder (``sim run --plots``). Nothing in the
simulator core imports this package, and matplotlib is imported only inside the functions, so
``import sim`` and ``sim.run`` never load matplotlib (tests/test_plots.py checks it); the CLI
imports it only when asked for plots. Every axis carries its unit. With ``path`` a figure is
saved and closed, without it stays open; every function returns the figure; a Result with
nothing to draw, or a table without the columns a figure needs, raises ``ValueError`` naming it.

May import: the rest of ``sim.results`` (``FIGURES``); NumPy, and matplotlib (in
:mod:`.figure` only, inside its functions).
"""

from __future__ import annotations

from pathlib import Path

from .. import FIGURES
from .figure import run_facts, run_title
from .gantt import gantt_phases, plot_gantt
from .latency import plot_latencies
from .load import bin_iterations, plot_replica_load, plot_timeline

__all__ = ["bin_iterations", "gantt_phases", "plot_gantt", "plot_latencies", "plot_replica_load",
           "plot_timeline", "run_facts", "run_title", "save_plots"]


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
