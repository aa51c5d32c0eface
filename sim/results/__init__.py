"""Results: the ``Result`` of a run (DataFrames and summaries in the usual metric conventions)
and its plots.

``metrics`` (``Result``, percentiles, ITL, SLO attainment, goodput), ``plots`` (matplotlib,
imported lazily: nothing in the core imports it). A ``Result`` holds columns; the engine builds
it (:mod:`sim.engine.records`).

May import: ``sim.checks``, ``sim.constants``. Never the engine.
"""
