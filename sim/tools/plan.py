"""The planner: the cheapest configuration that meets an SLO, over a search space.

    table = plan(df, {"ttft": 1.0, "tpot": 0.05}, attainment=0.9, rate=10.0,
                 space={"gpu": ["h100", "h200", "l40s"], "tensor_parallel": [1, 2],
                        "split": ["aggregated", "1:1"]},
                 base=SimConfig(model="llama-3.1-8b"), out="plan.parquet")
    table.iloc[0]          # the winner: its knobs, max_rate and every summary metric

Candidates are the product of ``space``'s lists (a ``SimConfig`` field each, or ``split``:
:mod:`.plan_space`), each applied to ``base``, in the space's order. Each gets a verdict with
its ``stage`` and ``reason``, the cheap ones first:

1. before any simulation (:mod:`.plan_space`): ``invalid`` (the config does not build, or a
   tensor parallelism the model's heads do not allow), ``duplicate``, ``memory`` (the weights
   do not fit, with the budget's advice), ``price`` (ranking by a dollar column and the GPU has
   no sourced price nor ``usd_per_gpu_hour``); a value invalid on its own and so in every
   candidate (``tensor_parallel = 0``, an unknown GPU) is an error instead
   (:func:`.plan_space.check_values`), before any candidate runs;
2. ``roofline``, with a target ``rate``: the upper bound of :func:`.plan_bounds.rate_bound`
   (raised by ``margin``) is below it;
3. the survivors are simulated (:func:`.plan_run.evaluate`): with a target ``rate``, one run
   there (``slo``: it misses the SLO at the target), then, for those meeting it that
   ``headroom`` names (``"pareto"``: on the frontier, the default; ``"all"``; ``"none"``), the
   capacity search from it up (:func:`sim.tools.capacity.max_rate`: ``max_rate``, the
   headroom; NaN when not searched, or when the workload is too short to load the candidate
   past the SLO); without a rate, the capacity search alone (``slo``: no rate meets it;
   ``workload``: every rate tried meets it, give more requests).

The rest are ranked by ``objective`` (a summary column, lower is better; default
``usd_per_million_output_tokens``) at the target rate, or at the capacity rate without one
(the dollars per million tokens when the fleet runs at the SLO's edge); ties by fewer GPUs,
then the space's order. One ranked with ``objective`` NaN is pruned at stage ``objective``.
The table: one row per candidate, ranked ones first (``rank`` 1, 2, ...; pruned ones NaN),
with the space's keys, ``status`` (``ranked`` or ``pruned``), ``stage``, ``reason``,
``max_rate`` and every summary metric; ``pareto`` marks the ranked candidates on the frontier
of ``objective`` vs ``latency`` (default ``ttft_p99``): none cheaper and faster at once.
``table.attrs``: ``simulated`` (candidates simulated by this call), ``resumed`` (read back
from ``out``), ``pruned_before`` (pruned without a simulation) and ``capacity_searches`` (run
by this call).

Runs on local processes (``workers``, default one per CPU) or a Dask ``client``; ``out``
(parquet) makes it resumable (:mod:`.plan_run`): interrupted and called again, it gives the same
table. ``progress``: a bar on stderr (None: only on a terminal), or a stream to draw it on.

Heterogeneous pools (prefill on one GPU type, decode on another): the space's pool keys
(``prefill_gpu``, ``decode_gpu``, ``decode_tensor_parallel``, ...) beside a ``P:D`` split; the
dollars sum each pool's GPUs at their prices, the KV crosses the network between two GPU types
(:mod:`sim.specs.links`). A ``disaggregation`` in ``base`` keeps its overrides where the space
sets none.
"""

from __future__ import annotations

import itertools
import math
import sys

import numpy as np
import pandas as pd

from ..engine.config import as_config
from .capacity import check_search
from .plan_bounds import rate_bound, workload_terms
from .plan_run import read_rows, run_candidates, write_rows
from .plan_space import check_space, check_values, static_verdict
from .sweep_backends import check_workers
from .sweep_resume import fingerprint, row_key

BOUND_MARGIN = 0.1  # the roofline stage prunes when bound x (1 + margin) < the target rate
HEADROOM = ("pareto", "all", "none")  # which candidates meeting a target get a capacity search


def _pareto(table, objective, latency) -> list:
    """Whether each row is ranked and no other ranked row is at least as good on both
    ``objective`` and ``latency`` and better on one (the cost-latency frontier)."""
    ranked = (table["status"] == "ranked").to_numpy()
    cost = table[objective].to_numpy(dtype=float)[ranked]
    lat = table[latency].to_numpy(dtype=float)[ranked]
    # (i, j): ranked row j dominates ranked row i (NaN compares false: it dominates nothing
    # and nothing dominates it, as the pairwise test had it)
    dominated = ((cost[None, :] <= cost[:, None]) & (lat[None, :] <= lat[:, None])
                 & ((cost[None, :] < cost[:, None]) | (lat[None, :] < lat[:, None]))).any(1)
    out = np.zeros(len(ranked), dtype=bool)
    out[ranked] = ~dominated
    return out.tolist()


def _bar(total, progress):
    from tqdm import tqdm
    stream = progress if hasattr(progress, "write") else sys.stderr
    show = sys.stderr.isatty() if progress is None else bool(progress)
    return tqdm(total=total, unit="candidate", desc="plan", disable=not show, leave=False,
                file=stream, mininterval=0)


def _headroom(found, keys, configs, headroom, objective, latency) -> list:
    """``(key, config)`` of the candidates that meet the target and get a capacity search:
    ``headroom`` ``"all"`` of them, ``"pareto"`` those on the frontier, ``"none"``."""
    if headroom == "none":
        return []
    ranked = [k for k in keys if found[k]["status"] == "ranked"
              and found[k].get(objective, math.nan) == found[k].get(objective, math.nan)]
    if headroom == "pareto" and ranked:
        t = pd.DataFrame([found[k] for k in ranked]).reindex(
            columns=["status", objective, latency])
        ranked = [k for k, on in zip(ranked, _pareto(t, objective, latency)) if on]
    return [(k, configs[k]) for k in ranked]


def _rank(rows, objective, latency) -> pd.DataFrame:
    table = pd.DataFrame(rows)
    for col in (objective, "num_gpus", latency):
        if col not in table:
            table[col] = math.nan
    for i in table.index[table["status"] == "ranked"]:
        if not table.at[i, objective] == table.at[i, objective]:
            table.loc[i, ["status", "stage", "reason"]] = [
                "pruned", "objective", f"{objective} is not defined for this candidate"]
    ranked = table["status"] == "ranked"
    key = table[objective].where(ranked, math.inf)
    table = table.assign(_key=key).sort_values(["_key", "num_gpus", "order"], kind="stable")
    table = table.drop(columns=["_key", "order"]).reset_index(drop=True)
    table.insert(0, "rank", [float(i + 1) if ok else math.nan
                             for i, ok in enumerate(table["status"] == "ranked")])
    table.insert(1, "pareto", _pareto(table, objective, latency))
    return table


def _check_args(workload, slo, attainment, rate, tol, margin):
    import workloads as wl
    check_search(slo, attainment, tol)  # (a bad one would prune every candidate alike)
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float))
                             or not rate > 0 or math.isinf(rate)):
        raise ValueError(f"rate must be a positive number of requests/s, got {rate!r}")
    if not (isinstance(margin, (int, float)) and margin >= 0):
        raise ValueError(f"margin must be a number >= 0, got {margin!r}")
    df = wl.validate(workload)
    if len(df) < 2:
        raise ValueError("plan needs a workload of at least two requests")
    return df


def plan(workload, slo, *, space, base=None, attainment=0.9, rate=None,
         objective="usd_per_million_output_tokens", latency="ttft_p99", tol=0.01,
         margin=BOUND_MARGIN, headroom="pareto", workers=None, client=None, out=None,
         progress=False) -> pd.DataFrame:
    """The ranked table of the candidates of ``space`` (see the module docstring)."""
    base = as_config(base, "base")
    space = check_space(space)
    check_workers(workers)
    df = _check_args(workload, slo, attainment, rate, tol, margin)
    context = fingerprint(df, base, {**slo, "\0attainment": attainment, "\0rate": rate,
                                     "\0tol": tol}, list(space))
    done = read_rows(out, context)
    if headroom not in HEADROOM:
        raise ValueError(f"headroom must be one of {HEADROOM}, got {headroom!r}")
    rows, jobs, seen, configs, pruned_before = [], [], {}, {}, 0
    terms = workload_terms(df)  # (the roofline bound's, computed once)
    verdicts = [static_verdict(base, dict(zip(space, values)), objective, seen)
                for values in itertools.product(*space.values())]
    check_values(space, [p[0] if p else None for _, p in verdicts])
    bar = _bar(len(verdicts), progress)
    for order, values in enumerate(itertools.product(*space.values())):
        knobs = dict(zip(space, values))
        row = {**knobs, "order": order, "status": "pruned", "stage": "", "reason": "",
               "max_rate": math.nan}
        config, pruned = verdicts[order]
        if pruned is None and rate is not None:
            bound, why = rate_bound(config, df, slo, attainment, terms)
            if bound * (1 + margin) < rate:
                pruned = ("roofline", f"at most {bound:.4g} req/s by the roofline bound "
                                      f"({why}), below the target {rate:g}")
        if pruned is not None:
            row["stage"], row["reason"] = pruned
            pruned_before += 1
            bar.update(1)
        else:
            key = row_key(knobs, 0)
            if key in done:
                bar.update(1)
            else:
                jobs.append((key, df, config, slo, attainment, rate, tol, "target"))
            row["plan_key"], configs[key] = key, config
        rows.append(row)
    found = dict(done)

    def finished(key, result):
        if "status" in result:  # (a first-phase row; a second phase's sets max_rate alone)
            found[key] = {**result, "plan_key": key, "plan_context": context,
                          "capacity_searched": float(rate is None)}
        else:
            found[key].update(result, capacity_searched=1.0)
        bar.update(1)
        if out is not None:
            write_rows(out, list(found.values()))

    keys = {row["plan_key"]: row for row in rows if "plan_key" in row}
    with bar:
        run_candidates(jobs, workers, client, finished)
        second = [] if rate is None else [
            (key, df, config, slo, attainment, rate, tol, "capacity")
            for key, config in _headroom(found, keys, configs, headroom, objective, latency)
            if not found[key].get("capacity_searched")]
        bar.total += len(second)
        bar.refresh()
        run_candidates(second, workers, client, finished)
    if out is not None and found:
        found = read_rows(out, context)  # (the same rows however many runs wrote them)
    for row in rows:
        key = row.pop("plan_key", None)
        if key is not None:
            result = {k: v for k, v in found[key].items()
                      if k not in ("plan_key", "plan_context", "capacity_searched")
                      and k not in row or k in ("status", "stage", "reason", "max_rate")}
            row.update(result)
    simulated = [r for r in found.values() if r.get("status") == "ranked"]
    if simulated and not any(objective in r and r[objective] == r[objective]
                             for r in simulated):
        raise ValueError(f"objective {objective!r} is not a summary metric")
    table = _rank(rows, objective, latency)
    table.attrs.update(simulated=len(jobs), resumed=len(rows) - pruned_before - len(jobs),
                       pruned_before=pruned_before, capacity_searches=len(second))
    return table
