"""The settings of ``sim plan`` of its own: the search space and how candidates are judged
(rows of the CLI's one table, :mod:`sim.cli.table`, appended there as ``ROWS``).

A plan file holds ``sim run``'s settings (the base of every candidate; ``rate`` is the target
load) plus these keys; ``[space]`` maps a ``sim run`` key whose value goes to the config
(``gpu``, ``tensor_parallel``, ``weight_dtype``, ``scheduler``, ``max_batch_size``,
``chunk_size``, ``replicas``, ``router``, ...), ``split`` or a pool's key
(:mod:`sim.cli.table_hetero`: ``prefill_gpu``, ``decode_gpu``, ...) to a list of values
(:mod:`sim.tools.plan_space`). Loads nothing beyond the CLI's argument helpers.
"""

from __future__ import annotations

from .arguments import at_least_zero, number, typed
from .setting import Setting

PLAN = ("plan",)


def _fraction(shown, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{shown} must be a fraction in (0, 1], got {value!r}")
    return float(value)


def _tol(shown, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"{shown} must be in (0, 1), got {value!r}")
    return float(value)


def _space(shown, value):
    if not isinstance(value, dict) or not value:
        raise ValueError(f"{shown} must be a table of key = [values, ...], got {value!r}")
    return value


S = Setting
ROWS = (
    S("space", (), ("plan",), commands=PLAN, check=_space, kind="table: key = [values, ...]",
      help="the search space: sim run keys that set the config (gpu, tensor_parallel, "
           "weight_dtype, scheduler, max_batch_size, chunk_size, replicas, router, ...), "
           "split ('aggregated' or 'P:D' prefill:decode replicas) and a split's pool keys "
           "(prefill_gpu, decode_gpu, prefill_tensor_parallel, ...), each with its values",
      default_help="required"),
    S("attainment", ("--attainment",), ("plan",), parse=number(float), metavar="FRACTION",
      check=_fraction, commands=PLAN, default=0.9,
      help="fraction of requests that must meet every SLO", default_help="default 0.9"),
    S("objective", ("--objective",), ("plan",), metavar="METRIC", commands=PLAN,
      check=typed(str, "a summary key"), default="usd_per_million_output_tokens",
      help="the summary key to minimise (usd_per_hour, num_gpus, "
           "energy_joules_per_output_token, ...)",
      default_help="default usd_per_million_output_tokens"),
    S("latency", ("--latency",), ("plan",), metavar="METRIC", commands=PLAN,
      check=typed(str, "a summary key"), default="ttft_p99",
      help="the latency of the cost-latency Pareto frontier", default_help="default ttft_p99"),
    S("tol", ("--tol",), ("plan",), parse=number(float), metavar="FRACTION", check=_tol,
      commands=PLAN, default=0.05, help="relative width of each capacity search's final bracket",
      default_help="default 0.05"),
    S("margin", ("--margin",), ("plan",), parse=number(float), metavar="FRACTION",
      check=at_least_zero, commands=PLAN, default=0.1,
      help="prune by the roofline bound only when bound x (1 + margin) is below the target",
      default_help="default 0.1"),
)
del S
