"""Parameter sweeps: many ``run`` calls, in local worker processes (default) or on a Dask cluster.

Two forms:

    table = sweep(df, {"scheduler": ["chunked", "vllm"], "rate": [2, 4, 8]}, base=SimConfig(...))
    table = sweep([{"workload": df, "config": {"scheduler": "chunked"}, "label": {"x": 1}}, ...])

**Grid form**: the cartesian product of ``grid`` (field -> values: any :class:`SimConfig` field,
plus ``rate`` and ``num_requests``, which reshape the workload: time-scaled to the rate, its first
``num_requests`` rows, and :data:`~sim.tools.sweep_grid.PARTS`, one field of a config object under
``sim run``'s name for it: ``closed_loop_users``, ``think_time``, ``prefill_replicas``,
``decode_replicas``, ``link_bandwidth_gbps``, ``link_latency_s``, ``num_speculative_tokens``,
``acceptance_rate``, ``draft_model``, ``draft_cost_ratio``:
:func:`~sim.tools.sweep_grid.point_config`), one row per point and repeat: the parameters,
``repeat`` and ``seed``, every summary metric, ``wall_seconds`` and ``error`` (empty, or why the
point failed - a point failing at run time never stops the others). Every point's config is built
first (:func:`~sim.tools.sweep_grid.check_grid`): a bad grid value is an error before anything
runs. With ``out=`` (a parquet path) the table is rewritten as points finish, and a later call
with the same ``out`` skips the (point, repeat) pairs already there without an error (resume);
``table.attrs["computed"]`` says how many ran. The file keeps the rows of points not in this grid
(another run's values of the same fields) after the grid's own, never drops them; the table
returned holds the grid's points only, ``table.attrs["kept"]`` counts the others. Each row carries
``sweep_context``, a fingerprint of the workload, base config, SLOs and the grid's fields: a file
written by another sweep is refused rather than mixed in (a row is found again by its grid fields'
values alone, so with a field dropped from the grid a row of another value of it would pass for
the base config's). The file holds a grid value that is an object (a ``SpeculativeConfig``,
``Disaggregation``, ``ClosedLoop``, a router function) as its repr, and a point is found again
whatever the file's types made of its numbers (1 read back as 1.0, None beside numbers as NaN).

**Repeats**: ``repeats=N`` runs each point N times with seeds ``seed, seed + 1, ...`` (``seed``:
the grid's or the base config's). The engine draws nothing but speculative acceptance, so
without speculation a repeat differs only through its workload: ``workload`` is then a function
``workload(seed=...) -> DataFrame`` (picklable for processes and Dask, e.g.
``functools.partial(workloads.load, "sharegpt", n=500, rate=4)``), called with each repeat's
seed; a fixed DataFrame with ``repeats > 1`` is refused (its rows would be identical) unless
speculative decoding is on (in the base config or the grid): its acceptance draws take the
seed. A function workload also works with ``repeats=1``.

**Faults**: a worker process that dies (killed, out of memory) loses only the points it held:
every row that came back is kept (in ``out``'s file), then
:class:`~sim.tools.sweep_backends.WorkerLost` says how many were lost; the same call again
resumes, running those alone (no point lost or run twice). On Dask the scheduler first retries
a killed worker's points on the others.

**Progress**: a bar (tqdm, on stderr) counts finished points; ``progress=None`` shows it only
when stderr is a terminal, ``False`` never, ``True`` always.

**Jobs form** (the original): each job a dict with ``workload``, ``config`` overrides and
``label`` columns; one row per job; an error in a job raises.

Each point is independent and deterministic (``run`` is pure), so the table is the same whatever
runs it. Dask is imported only when ``client=`` (a ``dask.distributed.Client``) is given.

This module holds the two forms' entry point; the grid's fields and points are
:mod:`.sweep_grid`'s, where the points run :mod:`.sweep_backends`' (the only module that imports
Dask), and the resume file (fingerprint, row identity) :mod:`.sweep_resume`'s.
"""

from __future__ import annotations

import sys

import pandas as pd

from .sweep_backends import WorkerLost, check_workers, run_jobs, run_points
from .sweep_grid import check_grid, has_object
from .sweep_resume import fingerprint, read_done, row_key, write_rows


def _bar(total, done, progress):
    """A tqdm bar over ``total`` points, ``done`` of them already there (resume); see the
    module docstring for ``progress``."""
    from tqdm import tqdm  # the text bar (tqdm.auto warns in a notebook without ipywidgets)
    show = sys.stderr.isatty() if progress is None else bool(progress)
    return tqdm(total=total, initial=done, unit="point", desc="sweep", disable=not show,
                leave=False, file=sys.stderr)


def _grid_sweep(df, grid, base, slo, repeats, workers, client, out, progress):
    from ..checks import positive_int
    import workloads as wl
    positive_int("repeats", repeats)
    speculating = getattr(base, "speculative", None) is not None or (
        isinstance(grid, dict) and has_object(base, grid, "speculative"))  # (else: check_grid)
    if repeats > 1 and not callable(df) and not speculating:
        raise ValueError(f"repeats={repeats} needs a workload that depends on the seed: pass a "
                         f"function seed -> DataFrame, e.g. functools.partial(workloads.load, "
                         f"name, n=..., rate=...); without speculative decoding the engine draws "
                         f"nothing, so repeating one DataFrame would give {repeats} identical "
                         f"rows")
    if repeats > 1 and isinstance(grid, dict) and "seed" in grid:
        raise ValueError("grid['seed'] with repeats > 1: the repeats already take the seeds "
                         "seed, seed + 1, ...; give one or the other")
    if not callable(df):  # a function of the seed: run validates what it returns, per point
        df = wl.validate(df)
    combos = check_grid(df, grid, base)
    names = list(grid)
    points = [(combo, r) for combo in combos for r in range(repeats)]
    context = fingerprint(df, base, slo, names)
    done = read_done(out, context, names)
    keys = [row_key(p, r) for p, r in points]
    todo = [(p, r) for (p, r), k in zip(points, keys) if k not in done or done[k].get("error")]
    rows = {k: done[k] for k in keys if k in done and not done[k].get("error")}
    grid_keys = set(keys)
    others = [row for k, row in done.items() if k not in grid_keys]  # kept in the file
    bar = _bar(len(points), len(rows), progress)

    def finished(row):
        row["sweep_context"] = context
        rows[row_key({k: row[k] for k in names}, row["repeat"])] = row
        bar.update(1)
        if out is not None:
            write_rows(out, [rows[k] for k in keys if k in rows] + others, names)

    with bar:
        try:
            run_points(df, todo, base, slo, workers, client, finished)
        except WorkerLost as e:  # the rows that came back are in the file: say how to go on
            kept = (f"the {len(rows)} finished are in out={str(out)!r}: call again with the "
                    f"same out= to run the {e.lost} lost (a resume)" if out is not None else
                    "give out= (a parquet path) to keep finished points across a rerun")
            raise WorkerLost(e.lost, e.total, e.why, kept) from None
    table = pd.DataFrame([rows[k] for k in keys])
    table.attrs["computed"] = len(todo)
    table.attrs["kept"] = len(others)
    return table


def sweep(workload, grid=None, *, base=None, slo=None, repeats=1, workers=None, client=None,
          out=None, progress=None) -> pd.DataFrame:
    """Run ``grid`` over ``workload`` (a DataFrame, or a function ``seed -> DataFrame``), or,
    without a grid, ``workload`` is a list of jobs (see the module docstring); one row per point
    and repeat, or per job. ``repeats``: runs per point, seeds ``seed, seed + 1, ...``.
    ``workers``: local processes (default: CPU count; 1 = in this process). ``client``: a
    ``dask.distributed.Client``, or a scheduler address such as ``"tcp://host:8786"``, to run
    them on a cluster. ``progress``: the bar (None: only on a terminal)."""
    check_workers(workers)
    if grid is not None:
        return _grid_sweep(workload, grid, base, slo, repeats, workers, client, out, progress)
    if out is not None or repeats != 1:
        raise ValueError("out= (resume) and repeats= need the grid form: "
                         "sweep(workload, grid, repeats=..., out=...)")
    jobs = list(workload)
    for i, job in enumerate(jobs):
        if not isinstance(job, dict) or "workload" not in job:
            raise ValueError(f"jobs[{i}] must be a dict with a 'workload' key")
    return pd.DataFrame(run_jobs(jobs, slo, workers, client))
