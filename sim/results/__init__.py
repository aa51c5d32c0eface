"""Results: the ``Result`` of a run (DataFrames and summaries in the usual metric conventions)
and its plots.

``metrics`` (``Result``, percentiles, ITL, SLO attainment, goodput), ``economics`` (the
summary's dollars and joules), ``diagnose`` (findings),
``plots`` (a package: a Result's figures, one module per family; matplotlib, imported lazily:
nothing in the core imports it), ``plots_sweep`` (a sweep table's figures), ``report`` (the
self-contained HTML page), ``atomic`` (files written whole or not at all). A ``Result`` holds columns; the engine builds it
(:mod:`sim.engine.core.records`).

May import: ``sim.checks``, ``sim.constants``, ``sim.specs`` (prices and power by GPU). Never
the engine.
"""

# the figures save_plots writes (``sim run --plots``): a run that writes none of one removes a
# previous run's from its output folder
FIGURES = ("latency_cdfs.png", "timeline.png")
