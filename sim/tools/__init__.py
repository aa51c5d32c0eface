"""Tools built on the engine: sweeps, calibration on a device, validation.

``sweep`` (many runs in local processes or on a Dask cluster), ``sweep_grid`` (a grid's fields
and points, checked before anything runs), ``sweep_backends`` (where the points run; the only
module that imports Dask), ``sweep_resume`` (the parquet file a sweep resumes from),
``capacity`` (``max_rate``: the highest request rate within SLOs, by bracketing and bisection),
``plan`` (``plan``: the cheapest candidate of a search space that meets an SLO, with the
reason each other one was pruned),
``calibration`` (time the kernels, then fit them inside executed engine iterations),
``validation`` (executed vs simulated latencies on this device). Library functions: they
return data and never print (the CLI prints).

May import: anything in ``sim`` but the CLI.
"""
