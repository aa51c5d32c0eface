"""Parameter sweeps: many ``run`` calls, in local worker processes (default) or on a Dask cluster.

    table = sweep([{"workload": df, "config": {"scheduler": "chunked"}, "label": {"x": 1}}, ...])

Each job is independent and deterministic (``run`` is pure), so the table is the same whatever
runs it. Dask is imported only when ``client=`` (a ``dask.distributed.Client``) is given.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

import pandas as pd


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


def sweep(jobs, *, slo=None, workers=None, client=None) -> pd.DataFrame:
    """Run every job (``workload``, ``config`` overrides, ``label`` columns); one row per job.

    ``workers``: local processes (default: CPU count; 1 = in this process). ``client``: a
    ``dask.distributed.Client`` to run the jobs on a cluster instead.
    """
    jobs = list(jobs)
    for i, job in enumerate(jobs):
        if not isinstance(job, dict) or "workload" not in job:
            raise ValueError(f"jobs[{i}] must be a dict with a 'workload' key")
    if client is not None:
        futures = client.map(_one, jobs, slo=slo, pure=False)
        rows = client.gather(futures)
    else:
        workers = workers or min(len(jobs), os.cpu_count() or 1)
        if workers <= 1 or len(jobs) <= 1:
            rows = [_one(j, slo) for j in jobs]
        else:
            with ProcessPoolExecutor(workers) as pool:
                rows = list(pool.map(_one, jobs, [slo] * len(jobs)))
    return pd.DataFrame(rows)
