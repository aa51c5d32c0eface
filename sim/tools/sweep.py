"""Parameter sweeps: many ``run`` calls, in local worker processes (default) or on a Dask cluster.

Two forms:

    table = sweep(df, {"scheduler": ["chunked", "vllm"], "rate": [2, 4, 8]}, base=SimConfig(...))
    table = sweep([{"workload": df, "config": {"scheduler": "chunked"}, "label": {"x": 1}}, ...])

**Grid form**: the cartesian product of ``grid`` (field -> values: any :class:`SimConfig` field,
plus ``rate`` and ``num_requests``, which reshape the workload: time-scaled to the rate, its
first ``num_requests`` rows, and :data:`PARTS`, one field of a config object under ``sim run``'s
name for it: ``closed_loop_users``, ``think_time``, ``prefill_replicas``, ``decode_replicas``,
``link_bandwidth_gbps``, ``link_latency_s``, ``num_speculative_tokens``, ``acceptance_rate``,
``draft_model``, ``draft_cost_ratio``: :func:`point_config`), one row per point and repeat: the parameters, ``repeat`` and
``seed``, every summary metric, ``wall_seconds`` and ``error`` (empty, or why the point failed -
a point failing at run time never stops the others). Every point's config is built first
(:func:`check_grid`): a bad grid value is an error before anything runs. With ``out=`` (a
parquet path) the table is rewritten as points finish, and a later call with the same ``out``
skips the (point, repeat) pairs already there without an error (resume);
``table.attrs["computed"]`` says how many ran. The file keeps the rows of points not in this
grid (another run's values of the same fields) after the grid's own, never drops them; the
table returned holds the grid's points only, ``table.attrs["kept"]`` counts the others. Each row carries ``sweep_context``, a fingerprint
of the workload, base config, SLOs and the grid's fields: a file written by another sweep is
refused rather than mixed in (a row is found again by its grid fields' values alone, so with a
field dropped from the grid a row of another value of it would pass for the base config's).
The file holds a grid value that is an object (a ``SpeculativeConfig``, ``Disaggregation``,
``ClosedLoop``, a router function) as its repr, and a point is found again whatever the file's
types made of its numbers (1 read back as 1.0, None beside numbers as NaN).

**Repeats**: ``repeats=N`` runs each point N times with seeds ``seed, seed + 1, ...`` (``seed``:
the grid's or the base config's). The engine draws nothing but speculative acceptance, so
without speculation a repeat differs only through its workload: ``workload`` is then a function
``workload(seed=...) -> DataFrame`` (picklable for processes and Dask, e.g.
``functools.partial(workloads.load, "sharegpt", n=500, rate=4)``), called with each repeat's
seed; a fixed DataFrame with ``repeats > 1`` is refused (its rows would be identical) unless
speculative decoding is on (in the base config or the grid): its acceptance draws take the
seed. A function workload also works with ``repeats=1``.

**Progress**: a bar (tqdm, on stderr) counts finished points; ``progress=None`` shows it only
when stderr is a terminal, ``False`` never, ``True`` always.

**Jobs form** (the original): each job a dict with ``workload``, ``config`` overrides and
``label`` columns; one row per job; an error in a job raises.

Each point is independent and deterministic (``run`` is pure), so the table is the same whatever
runs it. Dask is imported only when ``client=`` (a ``dask.distributed.Client``) is given.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

RESHAPE = ("rate", "num_requests")  # grid fields that reshape the workload
# grid fields that set one field of a config object, under sim run's names for them: a grid
# over users, think times, pool sizes, links or speculation settings without writing objects
PARTS = {"closed_loop_users": ("closed_loop", "num_users"),
         "think_time": ("closed_loop", "think_time"),
         "prefill_replicas": ("disaggregation", "prefill_replicas"),
         "decode_replicas": ("disaggregation", "decode_replicas"),
         "link_bandwidth_gbps": ("disaggregation", "link_bandwidth_gbps"),
         "link_latency_s": ("disaggregation", "link_latency_s"),
         "num_speculative_tokens": ("speculative", "num_speculative_tokens"),
         "acceptance_rate": ("speculative", "acceptance_rate"),
         "draft_model": ("speculative", "draft_model"),
         "draft_cost_ratio": ("speculative", "draft_cost_ratio")}


def has_object(base, grid, owner) -> bool:
    """Whether some point of ``grid`` over ``base`` has the config object ``owner``
    (``speculative``, ``disaggregation``, ``closed_loop``): the base's, a value of the grid's
    own field, or one made from a :data:`PARTS` field of it."""
    return (getattr(base, owner, None) is not None
            or any(v is not None for v in grid.get(owner, ()))
            or any(PARTS[k][0] == owner for k in grid if k in PARTS))


def point_config(base, point):
    """The config of one grid ``point``: ``base`` with the point's ``SimConfig`` fields, then
    its :data:`PARTS` set on the config objects they belong to (the point's or the base's
    ``closed_loop``, ``disaggregation``, ``speculative``; a ``Disaggregation()`` of 1 + 1
    replicas where there is none; a closed loop or speculation where there is none from the
    point's parts alone, if they are enough to build one). ``rate`` and ``num_requests`` are
    the workload's (:func:`_point`)."""
    from ..engine.schedulers import override  # (a grid's kv_blocks replaces a base's utilization)
    config = override(base, **{k: v for k, v in point.items()
                               if k not in RESHAPE and k not in PARTS})
    parts = {}
    for k, v in point.items():
        if k in PARTS:
            owner, attr = PARTS[k]
            parts.setdefault(owner, {})[attr] = v
    if not parts:
        return config
    over = {}
    for owner, values in parts.items():
        given = getattr(config, owner)
        if given is not None:
            over[owner] = dataclasses.replace(given, **values)
            continue
        cls = _owner_class(owner)
        try:
            over[owner] = cls(**values)
        except TypeError:  # a required field the point does not give
            names = [k for k, (o, _) in PARTS.items() if o == owner and k in point]
            raise ValueError(f"{', '.join(names)} set(s) {owner}'s {sorted(values)}, but the "
                             f"base config has no {owner} and these alone cannot make one: "
                             f"give the base a {cls.__name__} ({_HOW[owner]})") from None
    return dataclasses.replace(config, **over)


_HOW = {"closed_loop": "sim run's closed_loop_users", "speculative": "a [speculative] table",
        "disaggregation": "prefill_replicas and decode_replicas"}


def _owner_class(owner):
    if owner == "closed_loop":
        from workloads import ClosedLoop
        return ClosedLoop
    if owner == "disaggregation":
        from ..engine.fleet.disaggregation import Disaggregation
        return Disaggregation
    from ..engine.speculation.settings import SpeculativeConfig
    return SpeculativeConfig


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


def _point(workload, params, base, slo, repeat=0):
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


def _context(df, base, slo, fields) -> str:
    """A fingerprint of what every point shares - the workload (its columns, or the function
    and arguments that draw it), the base config, the SLOs and the grid's ``fields`` (which
    identify a row: see the module docstring) - so that a resumed sweep never mixes rows of
    another (reprs without memory addresses: stable across processes)."""
    h = hashlib.sha1()
    if callable(df):
        f = getattr(df, "func", df)
        h.update(plain((getattr(f, "__module__", ""), getattr(f, "__qualname__", ""),
                        getattr(df, "args", ()), sorted(getattr(df, "keywords", {}).items())))
                 .encode())
    else:
        for c in ("arrival_time", "num_prompt_tokens", "num_output_tokens"):
            h.update(df[c].to_numpy().tobytes())
        h.update(plain(sorted(set(df.columns))).encode())
    if base is not None:
        h.update(plain([(f.name, getattr(base, f.name))
                        for f in dataclasses.fields(base)]).encode())
    h.update(plain(sorted((slo or {}).items())).encode())
    h.update(plain(sorted(fields, key=str)).encode())
    return h.hexdigest()[:16]


def plain(v) -> str:
    """``repr(v)`` without memory addresses: stable across processes."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(v))


def _stored(v):
    """A grid value as the parquet file holds it: a number, string, bool or None as is, any
    other object (a ``SpeculativeConfig``, ``Disaggregation``, ``ClosedLoop``, a router
    function) as its :func:`plain` repr, which Arrow can write and :func:`_key` reads back."""
    if v is None or isinstance(v, (bool, int, float, str)) or hasattr(v, "item"):
        return v
    return plain(v)


def _key_value(v):
    v = v.item() if hasattr(v, "item") else v  # numpy scalars
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float)):  # a column of ints and floats (rate = [1, 2.5]) reads
        return None if v != v else float(v)  # back as floats, None beside numbers as NaN
    return plain(v)


def _key(params, repeat) -> str:
    """A (point, repeat)'s identity, the same before and after a parquet round trip: numpy
    scalars, 1 and 1.0, None and NaN, an object and the repr the file holds are each one."""
    key = {k: _key_value(v) for k, v in params.items()}
    key["\0repeat"] = int(repeat)  # a name no grid field can have
    return json.dumps(key, sort_keys=True)


def _bar(total, done, progress):
    """A tqdm bar over ``total`` points, ``done`` of them already there (resume); see the
    module docstring for ``progress``."""
    from tqdm import tqdm  # the text bar (tqdm.auto warns in a notebook without ipywidgets)
    show = sys.stderr.isatty() if progress is None else bool(progress)
    return tqdm(total=total, initial=done, unit="point", desc="sweep", disable=not show,
                leave=False, file=sys.stderr)


def _shown(point) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in point.items())


def check_grid_fields(grid, rows=None) -> None:
    """Check ``grid``'s fields (``SimConfig``'s, ``rate``/``num_requests``, or :data:`PARTS`; a
    misspelt one gets a did-you-mean), that each holds a non-empty list, ``rate`` > 0 and ``num_requests`` in
    1..``rows`` (the workload's rows, when known)."""
    from ..checks import did_you_mean, positive_float, positive_int
    from ..engine import SimConfig
    if not isinstance(grid, dict) or not grid:
        raise ValueError(f"grid must be a non-empty dict of field -> list of values, got "
                         f"{grid!r}")
    fields = [f.name for f in dataclasses.fields(SimConfig)]
    known = fields + list(RESHAPE) + list(PARTS)
    unknown = sorted(set(grid) - set(known), key=str)
    if unknown:
        raise ValueError(f"grid field(s) {unknown} are neither SimConfig fields nor "
                         f"{RESHAPE} nor {sorted(PARTS)}{did_you_mean(unknown[0], known)}")
    for k, values in grid.items():
        if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__") or not len(
                values):
            raise ValueError(f"grid[{k!r}] must be a non-empty list of values, got {values!r}")
    for v in grid.get("rate", ()):
        positive_float("grid['rate']", v)
    for v in grid.get("num_requests", ()):
        n = positive_int("grid['num_requests']", v)
        if rows is not None and n > rows:
            raise ValueError(f"grid['num_requests'] {n} is more than the workload's {rows:,} "
                             f"requests")


def check_grid(workload, grid, base=None) -> list[dict]:
    """Every point of ``grid`` (field -> value dicts, in the sweep's order), all checked before
    anything runs: :func:`check_grid_fields` (with a DataFrame ``workload``'s rows; a function's
    are known only when it runs), then each point's ``dataclasses.replace(base, **fields)`` is
    built, so a bad value raises here, naming the grid point (so does a ``rate`` beside a
    ``closed_loop``, whose users ignore it). What fails only when a point runs
    (a model that does not fit its GPU) stays that point's error row."""
    from ..engine.config import as_config
    check_grid_fields(grid, None if callable(workload) else len(workload))
    base = as_config(base, "base")
    names = list(grid)
    points = [dict(zip(names, combo)) for combo in itertools.product(*grid.values())]
    for point in points:
        try:
            config = point_config(base, point)
        except (ValueError, TypeError) as e:
            raise type(e)(f"grid point {_shown(point)}: {e}") from None
        if point.get("rate") is not None and config.closed_loop is not None:
            raise ValueError(f"grid point {_shown(point)}: rate applies to an open loop; with "
                             f"closed_loop={config.closed_loop!r} the users issue the requests "
                             f"as theirs finish, so every rate gives the same run (drop rate "
                             f"from the grid, or vary closed_loop instead)")
    return points


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
    done = {}
    context = _context(df, base, slo, names)
    if out is not None and Path(out).exists():
        old = pd.read_parquet(out)
        if len(old) and ("sweep_context" not in old or (old["sweep_context"] != context).any()
                         or set(names) - set(old.columns)):
            raise ValueError(f"out={str(out)!r} holds rows of another sweep (a different "
                             f"workload, base config, SLOs or grid fields): resuming would mix "
                             f"them; write to another file or delete it")
        for row in old.to_dict("records"):
            done[_key({k: row[k] for k in names}, row.get("repeat", 0))] = row
    keys = [_key(p, r) for p, r in points]
    todo = [(p, r) for (p, r), k in zip(points, keys) if k not in done or done[k].get("error")]
    rows = {k: done[k] for k in keys if k in done and not done[k].get("error")}
    grid_keys = set(keys)
    others = [row for k, row in done.items() if k not in grid_keys]  # kept in the file
    bar = _bar(len(points), len(rows), progress)

    def finished(row):
        row["sweep_context"] = context
        rows[_key({k: row[k] for k in names}, row["repeat"])] = row
        bar.update(1)
        if out is not None:
            ordered = [rows[k] for k in keys if k in rows] + others
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            stored = [{k: _stored(v) if k in names else v for k, v in row.items()}
                      for row in ordered]
            pd.DataFrame(stored).to_parquet(out, index=False)

    params, reps = [p for p, _ in todo], [r for _, r in todo]
    with bar:
        if client is not None:
            from dask.distributed import as_completed as dask_completed
            with _dask(client) as c:
                n = len(todo)  # (keyword arguments of map are not mapped: all positional)
                futures = c.map(_point, [df] * n, params, [base] * n, [slo] * n, reps,
                                pure=False)
                for fut in dask_completed(futures):
                    finished(fut.result())
        else:
            workers = workers or min(len(todo), os.cpu_count() or 1)
            if workers <= 1 or len(todo) <= 1:
                for p, r in todo:
                    finished(_point(df, p, base, slo, r))
            else:
                with ProcessPoolExecutor(workers) as pool:
                    futs = [pool.submit(_point, df, p, base, slo, r) for p, r in todo]
                    for fut in as_completed(futs):
                        finished(fut.result())
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
    if grid is not None:
        return _grid_sweep(workload, grid, base, slo, repeats, workers, client, out, progress)
    if out is not None or repeats != 1:
        raise ValueError("out= (resume) and repeats= need the grid form: "
                         "sweep(workload, grid, repeats=..., out=...)")
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
