"""The planner for a day of traffic: the cheapest fleet policy, fixed or autoscaled, whose day
meets the SLO.

    table = plan_day(day, {"ttft": 1.0}, attainment=0.99, base=SimConfig(model=..., gpu=...),
                     space={"min_replicas": [1, 2], "max_replicas": [4, 5],
                            "target": [8, 16]}, fixed=[3, 4, 5])
    table.iloc[0]   # the winner: its policy, usd, gpu_hours, slo_attainment over the day

Candidates: the product of ``space``'s lists of :class:`~sim.engine.fleet.autoscaler.
Autoscaler` fields (in the space's order, the first key varying slowest; the other fields
``policy``'s, default the Autoscaler's), then one fixed fleet per entry of ``fixed``
(``min_replicas = max_replicas = n``: every replica paid all day). Each runs the whole day
(:func:`sim.tools.autoscale.run_autoscaled`) and gets a verdict: ``invalid`` (the policy does
not build: its check's message), ``slo`` (the share of the day's requests meeting every limit of
``slo`` is below ``attainment``), else ranked by ``usd`` over the day (the paid replica-seconds
at the GPU's price, cold starts included), ties by ``gpu_hours``, then the candidates' order.
The table: one row per candidate, ranked ones first (``rank`` 1, 2, ...), with ``kind``
(``autoscaled`` or ``fixed``), the policy's fields, ``status``, ``stage``, ``reason`` and the
day's summary (:meth:`AutoscaledRun.summary`: ``usd``, ``gpu_hours``, ``cold_start_usd``,
``peak_replicas``, ``mean_replicas``, ``slo_attainment``, ...). Runs on local processes
(``workers``) or a Dask ``client`` (:func:`sim.tools.sweep_backends.map_calls`); deterministic,
whatever runs it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pandas as pd

from ..engine.fleet.autoscaler import Autoscaler

FIELDS = tuple(f.name for f in dataclasses.fields(Autoscaler))
SHOWN = ("kind", "metric", "target", "min_replicas", "max_replicas", "scale_down_delay_s")


def policies(space, fixed, policy) -> list:
    """``[(knobs, Autoscaler or the error's message)]``, in the candidates' order."""
    space = dict(space or {})
    for key, values in space.items():
        if key not in FIELDS:
            raise ValueError(f"space key {key!r} is not an Autoscaler field; known: "
                             f"{', '.join(FIELDS)}")
        if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__") \
                or not list(values):
            raise ValueError(f"space[{key!r}] must be a non-empty list of values, got {values!r}")
    out = []
    combos = [dict(zip(space, v)) for v in itertools.product(*map(list, space.values()))] \
        if space else []
    combos = [("autoscaled", c) for c in combos] + [
        ("fixed", {"min_replicas": n, "max_replicas": n, "initial_replicas": None})
        for n in (fixed or ())]
    for kind, knobs in combos:
        try:
            out.append(({"kind": kind, **knobs}, dataclasses.replace(policy, **knobs)))
        except (ValueError, TypeError) as e:
            out.append(({"kind": kind, **knobs}, str(e)))
    if not out:
        raise ValueError("plan_day needs candidates: a space of Autoscaler fields or fixed "
                         "fleet sizes")
    return out


def _day(job):
    i, workload, config, policy, slo = job
    from .autoscale import run_autoscaled
    return i, run_autoscaled(workload, config, policy).summary(slo=slo)


def plan_day(workload, slo, *, base=None, space=None, fixed=(), policy=None, attainment=0.9,
             workers=None, client=None) -> pd.DataFrame:
    """The day's candidates ranked (see the module docstring)."""
    from ..engine.config import as_config
    from .sweep_backends import map_calls
    if not isinstance(slo, dict) or not slo:
        raise ValueError(f"slo must be a non-empty dict of per-request limits, got {slo!r}")
    if isinstance(attainment, bool) or not isinstance(attainment, (int, float)) \
            or not 0 < attainment <= 1:
        raise ValueError(f"attainment must be a fraction in (0, 1], got {attainment!r}")
    config = as_config(base)
    policy = policy or Autoscaler()
    if not isinstance(policy, Autoscaler):
        raise TypeError(f"policy must be a sim.Autoscaler, got {policy!r}")
    cands = policies(space, fixed, policy)
    rows = [dict(knobs) for knobs, _ in cands]
    for row, (_, p) in zip(rows, cands):
        if isinstance(p, Autoscaler):
            row.update({k: getattr(p, k) for k in SHOWN[1:]})
            if row["kind"] == "fixed":  # (no scaling: its metric and target do not apply)
                row.update(metric="", target=math.nan)
        else:
            row.update(status="pruned", stage="invalid", reason=p)
    jobs = [(i, workload, config, p, slo) for i, (_, p) in enumerate(cands)
            if isinstance(p, Autoscaler)]

    def finished(result):
        i, summary = result
        ok = summary["slo_attainment"] >= attainment
        rows[i].update(summary, status="ranked" if ok else "pruned", stage="" if ok else "slo",
                       reason="" if ok else (f"{summary['slo_attainment']:.1%} of the day's "
                                             f"requests meet the SLO, below {attainment:.1%}"))
    map_calls(_day, jobs, workers, client, finished)
    table = pd.DataFrame(rows)
    table["order"] = range(len(table))
    ranked = table["status"] == "ranked"
    table = pd.concat([table[ranked].sort_values(["usd", "gpu_hours", "order"], kind="stable"),
                       table[~ranked]], ignore_index=True).drop(columns="order")
    table.insert(0, "rank", [float(i + 1) if ok else math.nan
                             for i, ok in enumerate(table["status"] == "ranked")])
    return table
