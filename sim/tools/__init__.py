"""Tools built on the engine: sweeps, calibration on a device, validation.

``sweep`` (many runs in local processes or on a Dask cluster; Dask is imported only here),
``capacity`` (``max_rate``: the highest request rate within SLOs, by bracketing and bisection),
``calibration`` (time the kernels, then fit them inside executed engine iterations),
``validation`` (executed vs simulated latencies on this device). Library functions: they
return data and never print (the CLI prints).

May import: anything in ``sim`` but the CLI.
"""
