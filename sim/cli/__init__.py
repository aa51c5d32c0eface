"""The ``sim`` command: parses arguments, calls the library, prints and writes files.

    sim run [CONFIG.toml] [--workload NAME|FILE] [--scheduler chunked] ...   the main job
    sim capacity [CONFIG.toml] --slo-ttft 2 ...   the highest rate meeting the SLOs
    sim sweep SWEEP.toml [--workers 4]            a grid of runs ([grid] table)
    sim workload list | describe NAME|FILE [--plot PNG]
    sim memory MODEL --gpu h100 [--weight-dtype int8] [--tp 2]
    sim calibrate [--budget 120] [--output PROFILE.json]
    sim validate [--profile PROFILE.json]

Modules: ``main`` (the parser, one-line errors), ``table`` (every setting of run, capacity and
sweep: flag, TOML key, target, check, default, help), ``settings`` (defaults, TOML file, flags,
checked), ``build`` (settings to workload and ``SimConfig``), ``run`` and ``output`` (``sim
run`` and its files), ``capacity``, ``sweep``, ``info`` (workload, memory), ``device``
(calibrate, validate), ``arguments`` (the checks every command shares).

The only package that prints or parses argv. Errors the user can fix end as one line on
stderr and exit status 2.

May import: anything in ``sim``; nothing in ``sim`` imports it.
"""

from .main import main

__all__ = ["main"]
