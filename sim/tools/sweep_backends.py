"""Where sweep points run: in this process, in local worker processes, or on a Dask cluster.

:func:`run_point` turns one grid point and repeat into its row (the workload reshaped to the
point's ``rate`` and ``num_requests``, the config of :func:`~sim.tools.sweep_grid.point_config`,
the run's summary, the wall time and the error, if any); :func:`run_job` one job of the jobs
form. :func:`run_points` and :func:`run_jobs` run many: ``client`` (a ``dask.distributed.Client``
or a scheduler address) on Dask, else ``workers`` local processes (default: one per CPU, at most
one per point; 1, or a single point, in this process).

Invariants: each point is independent and deterministic (``run`` is pure), so a row is the same
whatever backend runs it; a point failing at run time is recorded in its row's ``error`` and
never stops the others (a job's error raises); the functions shipped to workers are module-level
and take everything they need as arguments (picklable). This is the only module that imports
Dask, and only when a ``client`` is given.
"""

from __future__ import annotations

import os
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager

from .sweep_grid import point_config


def run_job(job, slo):
    """One job's row: its ``label`` columns and the summary of its run (an error raises)."""
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


def run_point(workload, params, base, slo, repeat=0):
    """One grid point and repeat: its row (parameters, repeat, seed, summary, wall time,
    error). ``workload``: a DataFrame, or a function of the seed that returns one."""
    import workloads as wl

    from ..engine import SimConfig, run
    base = base or SimConfig()
    row = dict(params)
    row["repeat"], row["seed"] = repeat, params.get("seed", base.seed)
    t = time.perf_counter()
    try:
        seed = row["seed"] = params.get("seed", base.seed) + repeat
        df = workload(seed=seed) if callable(workload) else workload
        w = df
        if params.get("num_requests") is not None:
            n = int(params["num_requests"])
            if not 1 <= n <= len(df):
                raise ValueError(f"num_requests={n} outside 1..{len(df)}")
            w = df.iloc[:n].reset_index(drop=True)
            w.attrs = dict(df.attrs)
        if params.get("rate") is not None:
            w = wl.scale_to_rate(w, params["rate"])
        config = point_config(base, {**params, "seed": seed})
        with warnings.catch_warnings():
            if "seed" not in params or callable(workload):  # the base's seed, or the
                # workload's too (drawn per seed): not the grid's choice of a seed unused
                warnings.filterwarnings("ignore", message="seed=")
            if "replicas" in params:  # the base's router, for the grid's points of several
                warnings.filterwarnings("ignore", message="router=")
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
def dask_client(client):
    """``client`` as a ``dask.distributed.Client``: one given is used as is; an address (a
    string) is connected for this sweep and closed after it. An address nothing answers at (or
    Dask not installed) is a ``ValueError`` naming it, before any point runs."""
    try:
        from dask.distributed import Client
    except ImportError:
        raise ValueError(f"client={client!r}: Dask is not installed (pip install "
                         f"'.[cluster]')") from None
    own = isinstance(client, str)
    if own:
        try:
            client = Client(client)
        except (OSError, TimeoutError) as e:  # refused, unknown host, timed out
            raise ValueError(f"client={client!r}: no Dask scheduler answers there "
                             f"({' '.join(str(e).split())[:200]})") from None
    try:
        yield client
    finally:
        if own:
            client.close()


class WorkerLost(RuntimeError):
    """Worker processes died (killed, out of memory) before returning some points' rows; the
    rows that did come back were all handed to ``finished`` first (nothing finished is lost)."""

    def __init__(self, lost, total, why, then=""):
        self.lost, self.total, self.why = lost, total, why
        super().__init__(f"{lost} of {total} points lost: their worker process died ({why})"
                         + (f"; {then}" if then else ""))


def check_workers(workers) -> None:
    """``workers`` is None (one process per CPU) or an integer >= 1: 0 is not "the default"."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise ValueError(f"workers must be None (one process per CPU) or an integer >= 1, "
                         f"got {workers!r}")


def run_points(df, todo, base, slo, workers, client, finished) -> None:
    """Run the (point, repeat) pairs ``todo`` over the workload ``df``, calling ``finished(row)``
    in this process as each row comes back (in the order they finish). A worker process that
    dies (``kill -9``, the OOM killer; on Dask after the scheduler's retries on other workers,
    ``distributed.scheduler.allowed-failures``) loses only the points it held: every row that
    comes back is handed on, then :class:`WorkerLost` says how many did not."""
    if client is not None:
        from dask.distributed import KilledWorker
        from dask.distributed import as_completed as dask_completed
        with dask_client(client) as c:
            n = len(todo)  # (keyword arguments of map are not mapped: all positional)
            futures = c.map(run_point, [df] * n, [p for p, _ in todo], [base] * n, [slo] * n,
                            [r for _, r in todo], pure=False)
            _collect(dask_completed(futures), KilledWorker, n, finished)
        return
    workers = workers or min(len(todo), os.cpu_count() or 1)
    if workers <= 1 or len(todo) <= 1:
        for p, r in todo:
            finished(run_point(df, p, base, slo, r))
    else:
        with ProcessPoolExecutor(workers) as pool:
            futs = [pool.submit(run_point, df, p, base, slo, r) for p, r in todo]
            _collect(as_completed(futs), BrokenProcessPool, len(futs), finished)


def _collect(completed, died, total, finished) -> None:
    """Hand each future's row to ``finished``; the futures whose worker ``died`` (that
    exception) are counted and raised as one :class:`WorkerLost` after all the others."""
    lost, why = 0, ""
    for fut in completed:
        try:
            row = fut.result()
        except died as e:
            lost, why = lost + 1, why or " ".join(f"{type(e).__name__}: {e}".split())[:160]
            continue
        finished(row)
    if lost:
        raise WorkerLost(lost, total, why)


def run_jobs(jobs, slo, workers, client) -> list[dict]:
    """The rows of ``jobs``, in job order."""
    if client is not None:
        with dask_client(client) as c:
            return c.gather(c.map(run_job, jobs, slo=slo, pure=False))
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    if workers <= 1 or len(jobs) <= 1:
        return [run_job(j, slo) for j in jobs]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(run_job, jobs, [slo] * len(jobs)))


def map_calls(fn, jobs, workers, client, finished) -> None:
    """``fn(job)`` for each of ``jobs`` on a Dask ``client``, else ``workers`` local processes
    (default: one per CPU; 1, or a single job, in this process), calling ``finished(result)``
    in this process as each comes back (in the order they finish). ``fn``: module-level."""
    if client is not None:
        from dask.distributed import as_completed as dask_completed
        with dask_client(client) as c:
            for fut in dask_completed(c.map(fn, jobs, pure=False)):
                finished(fut.result())
        return
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            finished(fn(job))
        return
    with ProcessPoolExecutor(workers) as pool:
        for fut in as_completed([pool.submit(fn, job) for job in jobs]):
            finished(fut.result())
