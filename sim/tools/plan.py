"""The planner: the cheapest configuration that meets an SLO, over a small search space.

    table = plan(df, {"ttft": 1.0, "tpot": 0.05}, attainment=0.9,
                 space={"gpu": ["h100", "h200", "l40s"], "tensor_parallel": [1, 2],
                        "scheduler": ["vllm", "sglang"]},
                 base=SimConfig(model="llama-3.1-8b"))
    table.iloc[0]          # the winner: its knobs, max_rate and every summary metric there

Candidates are the product of ``space``'s lists (each key a ``SimConfig`` field), each applied
to ``base``, in the space's order. Each is pruned before any simulation when it cannot be a
plan, with its ``stage`` and ``reason``:

1. ``invalid``: the config does not build (a ``SimConfig`` check, or a tensor parallelism the
   model's heads do not allow), the check's own message;
2. ``memory``: the weights do not fit the GPUs (the memory budget's message, with its advice);
3. ``price``: ranking by a dollar column, the GPU has no sourced price and no
   ``usd_per_gpu_hour`` (:mod:`sim.results.economics`).

Each survivor gets a capacity search (:func:`sim.tools.capacity.max_rate`: the highest rate
meeting ``slo`` at ``attainment``, within ``tol``); one with no such rate, or below the target
``rate`` when one is given, is pruned at stage ``slo``; one that meets the SLO at every rate
tried at stage ``workload`` (too few requests to load it: give more). The rest are ranked by
``objective`` (a summary column, lower is better: by default ``usd_per_million_output_tokens``
at the capacity rate, the dollars per million tokens when the fleet runs at the SLO's edge),
ties by fewer GPUs, then the space's order. The table: one row per candidate, ranked ones first
(``rank`` 1, 2, ...; pruned ones NaN), with the space's fields, ``status`` (``ranked`` or
``pruned``), ``stage``, ``reason``, ``max_rate`` and every summary metric at that rate;
``pareto`` marks the ranked candidates on the frontier of ``objective`` vs ``latency`` (default
``ttft_p99`` at the capacity rate): none cheaper and faster at once.

After the capacity search, a candidate whose ``objective`` is NaN there is pruned at stage
``objective``.

Not yet: roofline bounds as a second pruning stage, Dask, resuming, heterogeneous pools as a
search dimension (a ``disaggregation`` value in ``space`` is taken as given).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pandas as pd

from ..engine.config import SimConfig, as_config
from ..results.economics import price_missing
from .capacity import check_search, max_rate

FIELDS = frozenset(f.name for f in dataclasses.fields(SimConfig))


def _check_space(space) -> dict:
    if not isinstance(space, dict) or not space:
        raise ValueError(f"space must be a non-empty dict of SimConfig field -> list of values, "
                         f"got {space!r}")
    out = {}
    for key, values in space.items():
        if key not in FIELDS:
            raise ValueError(f"space key {key!r} is not a SimConfig field")
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise ValueError(f"space[{key!r}] must be a list of values, got {values!r}")
        out[key] = list(values)
        if not out[key]:
            raise ValueError(f"space[{key!r}] is empty")
    return out


def _prune(base, knobs, objective) -> tuple:
    """``(config, None)`` for a candidate worth simulating, else ``(None, (stage, reason))``."""
    try:
        config = dataclasses.replace(base, **knobs)
    except (TypeError, ValueError) as e:
        return None, ("invalid", str(e))
    try:
        config.resolved_kv_blocks()
    except (TypeError, ValueError) as e:
        text = str(e)
        return None, ("memory" if "fit" in text or "room" in text else "invalid", text)
    if objective.startswith("usd_"):
        missing = price_missing(config)
        if missing:
            return None, ("price", missing)
    return config, None


def _pareto(table, objective, latency) -> list:
    """Whether each row is ranked and no other ranked row is at least as good on both
    ``objective`` and ``latency`` and better on one (the cost-latency frontier)."""
    ranked = table["status"] == "ranked"
    cost, lat = table[objective].to_numpy(), table[latency].to_numpy()
    out = []
    for i, ok in enumerate(ranked):
        out.append(bool(ok) and not any(
            ranked.iloc[j] and cost[j] <= cost[i] and lat[j] <= lat[i]
            and (cost[j] < cost[i] or lat[j] < lat[i]) for j in range(len(table))))
    return out


def plan(workload, slo, *, space, base=None, attainment=0.9, rate=None,
         objective="usd_per_million_output_tokens", latency="ttft_p99",
         tol=0.01) -> pd.DataFrame:
    """The ranked table of the candidates of ``space`` (see the module docstring)."""
    base = as_config(base, "base")
    space = _check_space(space)
    check_search(slo, attainment, tol)  # (a bad one would prune every candidate alike)
    if rate is not None and not (isinstance(rate, (int, float)) and rate > 0):
        raise ValueError(f"rate must be a positive number of requests/s, got {rate!r}")
    rows = []
    for order, values in enumerate(itertools.product(*space.values())):
        knobs = dict(zip(space, values))
        row = {**knobs, "order": order, "status": "pruned", "stage": "", "reason": "",
               "max_rate": math.nan}
        config, pruned = _prune(base, knobs, objective)
        if pruned is None:
            try:
                cap = max_rate(workload, slo, attainment=attainment, config=config, tol=tol)
            except ValueError as e:  # every rate met the SLO: the workload is too short
                if str(e).startswith("slo keys"):  # an unknown SLO: no candidate's fault
                    raise
                pruned = ("workload" if str(e).startswith("every rate tried") else "slo", str(e))
            else:
                row["max_rate"] = cap.rate
                row.update({k: v for k, v in cap.summary.items() if k not in knobs})
                if objective not in cap.summary and cap.summary:
                    raise ValueError(f"objective {objective!r} is not a summary metric")
                if not cap.rate == cap.rate:
                    pruned = ("slo", f"no rate meets {slo} at attainment {attainment}")
                elif rate is not None and cap.rate < rate:
                    pruned = ("slo", f"serves at most {cap.rate:.4g} req/s within the SLO, "
                                     f"below the target {rate:g}")
        if pruned is None and not row.get(objective, math.nan) == row.get(objective, math.nan):
            pruned = ("objective", f"{objective} is not defined for this candidate")
        if pruned is None:
            row["status"] = "ranked"
        else:
            row["stage"], row["reason"] = pruned
        rows.append(row)
    table = pd.DataFrame(rows)
    ranked = table["status"] == "ranked"
    if objective not in table:
        table[objective] = math.nan
    if "num_gpus" not in table:
        table["num_gpus"] = math.nan
    key = table[objective].where(ranked, math.inf)
    table = table.assign(_key=key).sort_values(["_key", "num_gpus", "order"], kind="stable")
    table = table.drop(columns=["_key", "order"]).reset_index(drop=True)
    table.insert(0, "rank", [float(i + 1) if ok else math.nan
                             for i, ok in enumerate(table["status"] == "ranked")])
    if latency not in table:
        table[latency] = math.nan
    table.insert(1, "pareto", _pareto(table, objective, latency))
    return table
