"""Where the planner's simulations run, and its resume file.

:func:`evaluate` is one surviving candidate's verdict and metrics: with a target ``rate``, one
run at that rate (missing the SLO there prunes it at stage ``slo``: its capacity is below the
target), and, as a second phase for the candidates the planner asks it of, the capacity search
from the target up (``max_rate``, the headroom); without one, the capacity search alone.
:func:`run_candidates` runs many: on a Dask client (:func:`sim.tools.sweep_backends.
map_calls`), in local worker processes, or, with one worker or one candidate, in this
process.

Resume (``out=``, a parquet path): each evaluated row is written as it finishes (to a
temporary file, then renamed: a run killed mid-write leaves the previous file whole); a later
plan with the same ``out`` reads the rows back by their knobs (:func:`sim.tools.sweep_resume.
row_key`) and simulates only the others. Every row carries ``plan_context``, the fingerprint of
the workload, base config, SLO, attainment, target rate, tolerance and space keys: a file of
another plan is refused.

A candidate failing at run time (a ``ValueError``/``TypeError``) is pruned at stage ``error``
with the message; the others go on. Invariants: a candidate's row depends only on its
arguments (``run`` is pure), so it is the same whatever runs it and whether it was read back;
the function shipped to workers is module-level and picklable.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

import pandas as pd

from ..results.metrics import SLO_KEYS


def _meets(summary, slo, attainment) -> bool:
    ok = True
    if any(k in SLO_KEYS for k in slo):
        ok = summary["slo_attainment"] >= attainment
    return ok and all(summary[k] == summary[k] and summary[k] <= v
                      for k, v in slo.items() if k not in SLO_KEYS)


def evaluate(df, config, slo, attainment, rate, tol, phase="target") -> dict:
    """One candidate's row: ``status`` (``ranked``/``pruned``), ``stage``, ``reason``,
    ``max_rate`` and every summary metric. ``phase``: ``"target"``, the run at the target
    ``rate``; ``"capacity"``, only the capacity search from it up (``{"max_rate": ...}``);
    without a target, the capacity search and the summary at the capacity."""
    import workloads as wl

    from ..engine import run
    per_request = {k: v for k, v in slo.items() if k in SLO_KEYS} or None
    row = {"status": "ranked", "stage": "", "reason": "", "max_rate": math.nan}
    if rate is not None and phase == "target":
        summary = run(wl.scale_to_rate(df, rate), config).summary(slo=per_request)
        unknown = [k for k in slo if k not in SLO_KEYS and k not in summary]
        if unknown:
            raise ValueError(f"slo keys {unknown} are neither per-request SLOs {SLO_KEYS} nor "
                             f"summary metrics")
        row.update(summary)
        if not _meets(summary, slo, attainment):
            got = summary.get("slo_attainment", math.nan)
            row.update(status="pruned", stage="slo",
                       reason=f"misses the SLO at the target {rate:g} req/s (attainment "
                              f"{got:.1%}): its capacity is below the target")
        return row
    cap = _capacity(df, config, slo, attainment, rate, tol)
    if rate is not None:  # (the headroom of a candidate meeting the target)
        return {"max_rate": cap if isinstance(cap, float) else cap.rate}
    if isinstance(cap, tuple):
        row.update(status="pruned", stage=cap[0], reason=cap[1])
        return row
    row["max_rate"] = cap.rate
    row.update(cap.summary)
    if not cap.rate == cap.rate:
        row.update(status="pruned", stage="slo",
                   reason=f"no rate meets {slo} at attainment {attainment}")
    return row


def _capacity(df, config, slo, attainment, rate, tol):
    """``max_rate``'s answer; from a target ``rate`` that passes, NaN when every rate tried
    passes (the workload too short to find the edge); without one, ``(stage, reason)`` when
    the search cannot answer."""
    from .capacity import max_rate
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (no rate meets: the row says so)
        try:
            return max_rate(df, slo, attainment=attainment, config=config, tol=tol, start=rate)
        except ValueError as e:
            if str(e).startswith("slo keys"):  # an unknown SLO: no candidate's fault
                raise
            if rate is not None and str(e).startswith("every rate tried"):
                return math.nan  # meets the target; the workload is too short for its edge
            return ("workload" if str(e).startswith("every rate tried") else "slo", str(e))


def _call(args):
    key, df, config, slo, attainment, rate, tol, phase = args
    try:
        return key, evaluate(df, config, slo, attainment, rate, tol, phase)
    except (ValueError, TypeError) as e:  # the candidate's, at run time: its row says why
        if str(e).startswith("slo keys"):
            raise
        return key, {"status": "pruned", "stage": "error", "reason": f"{type(e).__name__}: {e}",
                     "max_rate": math.nan}


def run_candidates(jobs, workers, client, finished) -> None:
    """Evaluate ``jobs`` (``(key, df, config, slo, attainment, rate, tol, phase)`` tuples),
    calling ``finished(key, row)`` in this process as each comes back (in the order they finish):
    :func:`sim.tools.sweep_backends.map_calls`."""
    from .sweep_backends import map_calls
    if jobs:
        map_calls(_call, jobs, workers, client, lambda result: finished(*result))


def read_rows(out, context) -> dict:
    """The rows of the plan file ``out`` by their ``plan_key`` (``{}`` without a file); a
    file of another plan is a ``ValueError``."""
    if out is None or not Path(out).exists():
        return {}
    old = pd.read_parquet(out)
    if len(old) and ("plan_context" not in old or (old["plan_context"] != context).any()):
        raise ValueError(f"out={str(out)!r} holds rows of another plan (a different workload, "
                         f"base config, SLO, target rate or space): resuming would mix them; "
                         f"write to another file or delete it")
    return {row["plan_key"]: row for row in old.to_dict("records")}


def write_rows(out, rows) -> None:
    """``rows`` (dicts) to the parquet file ``out``, whole or not at all."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pd.DataFrame(rows).to_parquet(tmp, index=False)
    os.replace(tmp, path)
