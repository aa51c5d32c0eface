"""What every benchmark-file reader returns, and the checks they share.

A :class:`Measured` is a benchmark tool's run read back: the workload it sent (one row per
successful request in the schema of :mod:`workloads.schema`: arrival time, prompt and output
tokens), how it sent them (``concurrency``: a closed loop of that many clients; else an open
loop at the arrivals, ``rate`` the configured rate when the tool had one) and what it measured,
``metrics``: the tool's own metric names, definitions and units (``mean_ttft_ms`` for ``vllm
bench serve``, ``time_to_first_token.avg`` for AIPerf, ``time_to_first_token_ms.mean`` for
guidellm). ``per_request`` says whether the workload came from per-request records; without
them (a vLLM result saved without ``--save-detailed``, an AIPerf summary alone) it is rebuilt
from the run's configuration and mean lengths, and ``notes`` says so.

Invariants: the workload passes :func:`workloads.validate`; failed requests are not in it
(their lengths are unknown or partial) but counted in ``num_failed``; every error is one
``ValueError`` line naming the file and the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..schema import validate

TOOLS = ("vllm-bench", "aiperf", "guidellm")


@dataclass(frozen=True, eq=False)
class Measured:
    """One measured run: see the module docstring."""

    tool: str
    workload: pd.DataFrame
    metrics: dict
    source: str
    concurrency: int | None = None
    rate: float | None = None
    per_request: bool = True
    num_failed: int = 0
    notes: tuple = field(default_factory=tuple)


def fail(path, where, what):
    """The one-line error: ``FILE: FIELD: what is wrong``."""
    raise ValueError(f"{path}: {where}: {what}")


def number(value, path, where, *, allow_none=False):
    """``value`` as a float, else the one-line error naming ``where``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(path, where, f"must be a number, got {value!r:.60}")
    return float(value)


def count(value, path, where, *, minimum=0):
    """``value`` as an int >= ``minimum`` (a float holding an integer is accepted)."""
    v = number(value, path, where)
    if not math.isfinite(v) or v != round(v) or v < minimum:
        fail(path, where, f"must be an integer >= {minimum}, got {value!r}")
    return int(v)


def listed(doc, key, path, where=None):
    """``doc[key]``, which must be a list."""
    value = doc.get(key)
    if not isinstance(value, list):
        fail(path, where or key, f"must be a list, got {type(value).__name__}")
    return value


def table(doc, key, path, where=None):
    """``doc[key]``, which must be a JSON object."""
    value = doc.get(key)
    if not isinstance(value, dict):
        fail(path, where or key, f"must be an object, got {type(value).__name__}")
    return value


def workload(arrivals, prompts, outputs, path) -> pd.DataFrame:
    """The workload frame of per-request values, arrivals made relative to the first and the
    rows sorted by arrival (stable: ties keep the file's order)."""
    if not len(arrivals):
        fail(path, "requests", "no successful request: nothing to replay")
    t = np.asarray(arrivals, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    df = pd.DataFrame({"arrival_time": t[order] - t.min(),
                       "num_prompt_tokens": np.asarray(prompts)[order],
                       "num_output_tokens": np.asarray(outputs)[order]})
    return validate(df, source=str(path))


def rebuilt(n, prompt_tokens, output_tokens, rate, path) -> pd.DataFrame:
    """``n`` requests of the run's mean lengths, evenly spaced at ``rate`` (None: all at 0)."""
    if n < 1:
        fail(path, "completed", "no successful request: nothing to replay")
    t = np.arange(n) / rate if rate else np.zeros(n)
    df = pd.DataFrame({"arrival_time": t,
                       "num_prompt_tokens": max(1, round(prompt_tokens)),
                       "num_output_tokens": max(1, round(output_tokens))}, index=range(n))
    return validate(df, source=str(path))


def describe_stats(values, stats, percentile_names) -> dict:
    """``{stat: value}`` of ``values``: ``mean``/``avg``, ``median``, ``std`` (numpy's,
    population), ``min``, ``max`` as named in ``stats`` (our name -> the tool's), and numpy's
    linear-interpolation percentiles ``{tool's name: q}``; NaN for no values."""
    v = np.asarray(values, dtype=np.float64)
    nan = float("nan")
    funcs = {"mean": np.mean, "median": np.median, "std": np.std, "min": np.min, "max": np.max}
    out = {name: (float(funcs[ours](v)) if v.size else nan) for ours, name in stats.items()}
    for name, q in percentile_names.items():
        out[name] = float(np.percentile(v, q)) if v.size else nan
    return out
