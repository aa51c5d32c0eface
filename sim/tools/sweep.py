"""Parameter sweeps: many ``run`` calls, in local worker processes (default) or on a Dask cluster.

Two forms:

    table = sweep(df, {"scheduler": ["chunked", "vllm"], "rate": [2, 4, 8]}, base=SimConfig(...))
    table = sweep([{"workload": df, "config": {"scheduler": "chunked"}, "label": {"x": 1}}, ...])

**Grid form**: the cartesian product of ``grid`` (field -> values: any :class:`SimConfig` field,
plus ``rate`` and ``num_requests``, which reshape the workload: time-scaled to the rate, its first
``num_requests`` rows), one row per point: the parameters, every summary metric, ``wall_seconds``
and ``error`` (empty, or why the point failed - a failing point never stops the others). With
``out=`` (a parquet path) the table is rewritten as points finish, and a later call with the same
``out`` skips the points already there without an error (resume); ``table.attrs["computed"]``
says how many points ran.

**Jobs form** (the original): each job a dict with ``workload``, ``config`` overrides and
``label`` columns; one row per job; an error in a job raises.

Each point is independent and deterministic (``run`` is pure), so the table is the same whatever
runs it. Dask is imported only when ``client=`` (a ``dask.distributed.Client``) is given.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

RESHAPE = ("rate", "num_requests")  # grid fields that reshape the workload


def _one(job, slo):
    from ..engine import run
    res = run(job["workload"], **job.get("config", {}))
    row = dict(job.get("label", {}))
    summary = res.summary(slo=slo)
    clash = sorted(set(row) & set(summary))
    if clash:
        raise ValueError(f"label key(s) {clash} would overwrite summary metrics of the same name; "
                         f"rename the label")
    row.update(summary)
    return row


def _point(df, params, base, slo):
    """One grid point: its row (parameters, summary, wall time, error)."""
    import workloads as wl

    from ..engine import SimConfig, run
    row = dict(params)
    t = time.perf_counter()
    try:
        w = df
        if params.get("num_requests") is not None:
            n = int(params["num_requests"])
            if not 1 <= n <= len(df):
                raise ValueError(f"num_requests={n} outside 1..{len(df)}")
            w = df.iloc[:n].reset_index(drop=True)
            w.attrs = dict(df.attrs)
        if params.get("rate") is not None:
            w = wl.scale_to_rate(w, params["rate"])
        fields = {k: v for k, v in params.items() if k not in RESHAPE}
        config = dataclasses.replace(base or SimConfig(), **fields)
        res = run(w, config)
        summary = res.summary(slo=slo)
        clash = sorted(set(row) & set(summary))
        row.update({f"summary_{k}" if k in clash else k: v for k, v in summary.items()})
        row["error"] = ""
    except Exception as e:  # recorded in the row; the other points go on
        row["error"] = f"{type(e).__name__}: {e}"
    row["wall_seconds"] = time.perf_counter() - t
    return row


@contextmanager
def _dask(client):
    """``client`` as a ``dask.distributed.Client``: one given is used as is; an address (a
    string) is connected for this sweep and closed after it."""
    from dask.distributed import Client
    own = isinstance(client, str)
    client = Client(client) if own else client
    try:
        yield client
    finally:
        if own:
            client.close()


def _key(params) -> str:
    """A point's identity, the same before and after a parquet round trip (numpy scalars)."""
    plain = {k: (v.item() if hasattr(v, "item") else v) for k, v in params.items()}
    return json.dumps(plain, sort_keys=True, default=str)


def _grid_sweep(df, grid, base, slo, workers, client, out):
    from ..engine import SimConfig
    import workloads as wl
    if not isinstance(grid, dict) or not grid:
        raise ValueError("grid must be a non-empty dict of field -> list of values")
    known = {f.name for f in dataclasses.fields(SimConfig)} | set(RESHAPE)
    unknown = sorted(set(grid) - known)
    if unknown:
        raise ValueError(f"grid field(s) {unknown} are neither SimConfig fields nor {RESHAPE}")
    for k, values in grid.items():
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__") or not len(values):
            raise ValueError(f"grid[{k!r}] must be a non-empty list of values, got {values!r}")
    df = wl.validate(df)
    names = list(grid)
    points = [dict(zip(names, combo)) for combo in itertools.product(*grid.values())]
    done = {}
    if out is not None and Path(out).exists():
        old = pd.read_parquet(out)
        for row in old.to_dict("records"):
            if not row.get("error"):
                done[_key({k: row[k] for k in names})] = row
    keys = [_key(p) for p in points]
    todo = [p for p, k in zip(points, keys) if k not in done]
    rows = dict(done)

    def finished(row):
        rows[_key({k: row[k] for k in names})] = row
        if out is not None:
            ordered = [rows[k] for k in keys if k in rows]
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            pd.DataFrame(ordered).to_parquet(out, index=False)

    if client is not None:
        from dask.distributed import as_completed as dask_completed
        with _dask(client) as c:
            futures = c.map(_point, [df] * len(todo), todo, base=base, slo=slo, pure=False)
            for fut in dask_completed(futures):
                finished(fut.result())
    else:
        workers = workers or min(len(todo), os.cpu_count() or 1)
        if workers <= 1 or len(todo) <= 1:
            for p in todo:
                finished(_point(df, p, base, slo))
        else:
            with ProcessPoolExecutor(workers) as pool:
                futs = [pool.submit(_point, df, p, base, slo) for p in todo]
                for fut in as_completed(futs):
                    finished(fut.result())
    table = pd.DataFrame([rows[k] for k in keys])
    table.attrs["computed"] = len(todo)
    return table


def sweep(workload, grid=None, *, base=None, slo=None, workers=None, client=None,
          out=None) -> pd.DataFrame:
    """Run ``grid`` over ``workload`` (a DataFrame), or, without a grid, ``workload`` is a list
    of jobs (see the module docstring); one row per point or job. ``workers``: local processes
    (default: CPU count; 1 = in this process). ``client``: a ``dask.distributed.Client``, or a
    scheduler address such as ``"tcp://host:8786"``, to run them on a cluster."""
    if grid is not None:
        return _grid_sweep(workload, grid, base, slo, workers, client, out)
    if out is not None:
        raise ValueError("out= (resume) needs the grid form: sweep(workload, grid, out=...)")
    jobs = list(workload)
    for i, job in enumerate(jobs):
        if not isinstance(job, dict) or "workload" not in job:
            raise ValueError(f"jobs[{i}] must be a dict with a 'workload' key")
    if client is not None:
        with _dask(client) as c:
            rows = c.gather(c.map(_one, jobs, slo=slo, pure=False))
    else:
        workers = workers or min(len(jobs), os.cpu_count() or 1)
        if workers <= 1 or len(jobs) <= 1:
            rows = [_one(j, slo) for j in jobs]
        else:
            with ProcessPoolExecutor(workers) as pool:
                rows = list(pool.map(_one, jobs, [slo] * len(jobs)))
    return pd.DataFrame(rows)
