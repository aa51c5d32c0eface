"""``sim sweep FILE.toml``: a grid of runs from a TOML file; writes the table and a plot per
metric.

The file holds the settings of ``sim run`` (the base of every point) plus a ``[grid]`` table
(field -> list of values: any ``SimConfig`` field, plus ``rate`` and ``num_requests``, and the
settings that set one field of a config object: ``closed_loop_users``, ``think_time``,
``prefill_replicas``, ``decode_replicas``, ``link_bandwidth_gbps``, ``link_latency_s``,
``num_speculative_tokens``, ``acceptance_rate``, ``draft_model``, ``draft_cost_ratio``), an
optional ``metrics`` list (default TTFT/ITL P99 and throughput) and an optional ``repeats``
(``--repeats`` overrides it): runs per point with seeds ``seed, seed + 1, ...``, the workload
drawn again with each (Poisson arrivals at ``rate``, resampled lengths; a replayed trace's own
timing does not change with the seed). A progress bar on a terminal (``--no-progress``: none).
Writes ``sweep.parquet``
(rewritten as points finish; a re-run resumes, and keeps the rows of points not in its grid:
an earlier run's other values), ``sweep.csv`` and ``<metric>.png`` (the metric
against the grid's first field, one line per combination of the others).
"""

from __future__ import annotations

import functools
from pathlib import Path

from ..checks import plural
from .arguments import number, out_named, output_folder
from .build import build_rescaled, parts, seed_changes_nothing
from .settings import Names, add_flags, given_value, settings_from
from .table import BY_KEY

METRICS = list(BY_KEY["metrics"].default)


def in_file(check, config, *args):
    """``check(*args)``, its error prefixed with the TOML file's name."""
    try:
        return check(*args)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{config}: {e}") from None


def _has(owner):
    """Whether a sweep's points have ``owner`` (a config object):
    :func:`sim.tools.sweep_grid.has_object`."""
    def has(slo, cfg, grid):
        from ..tools.sweep_grid import has_object  # (on use: sim run's start-up loads no sweep)
        return has_object(cfg, grid, owner)
    return has


NEEDS = (  # summary keys only some runs have: (prefixes, what the sweep needs for them)
    (("goodput", "slo_"), lambda slo, cfg, grid: bool(slo), "an [slo] table"),
    (("kv_transfer_time",), _has("disaggregation"), "prefill_replicas and decode_replicas"),
    (("spec_",), _has("speculative"), "a [speculative] table"),
)


def _check_metrics(config, metrics, slo, cfg, grid) -> None:
    """Before anything runs: a metric that no point of this sweep can have (goodput without
    SLOs, a KV transfer time without disaggregation, an acceptance rate without speculation)
    was found missing only after every point had run."""
    for m in metrics:
        for prefixes, present, what in NEEDS:
            if m.startswith(prefixes) and not present(slo, cfg, grid):
                raise ValueError(f"{config}: metrics: {m!r} is in the summary of a run with "
                                 f"{what} only; this sweep has none")


def cmd_sweep(args) -> int:
    import pandas as pd

    from ..results.atomic import atomic_path
    from ..results.plots_sweep import plot_sweep
    from ..tools.sweep import sweep
    from ..tools.sweep_backends import WorkerLost
    from ..tools.sweep_grid import check_grid, check_grid_fields
    names = Names(args.config)
    s = settings_from(args, names, "sweep")
    grid = s["extra"].get("grid")
    if not isinstance(grid, dict) or not grid:
        raise ValueError(f"{args.config}: a sweep needs a [grid] table (field = [values, ...])")
    in_file(check_grid_fields, args.config, grid)  # before build: a grid rate may be the base's
    metrics = s["extra"].get("metrics", METRICS)
    if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
        raise TypeError(f"{args.config}: metrics must be a list of summary keys, got {metrics!r}")
    repeats = given_value(args, s, "repeats")[0] or BY_KEY["repeats"].default
    out = output_folder(s["output"], names("output"))
    # a trace's own timing, or a length-only set's arrivals at a reference rate: each grid
    # rate re-scales them (a grid of closed_loop_users: its users ignore them)
    (df, cfg), s = build_rescaled(s, names, fits=False,  # (the grid may set tp, gpu, ...)
                                  rescaled="rate" in grid or "closed_loop_users" in grid)
    if repeats > 1:  # each repeat draws the workload again with its seed
        import workloads
        load = {k: v for k, v in parts(s)["workload"].items() if k != "seed"}
        df = functools.partial(workloads.load, **load)
        if seed_changes_nothing(s, cfg):
            raise ValueError(f"{names('workload')} {s['workload']!r} gives the same requests "
                             f"for every seed (a replayed trace), so {repeats} repeats would "
                             f"be identical: use a length-only set (e.g. sharegpt) whose "
                             f"arrivals are drawn per seed, or speculative "
                             f"decoding or --router random, whose draws take the seed")
    in_file(check_grid, args.config, df, grid, cfg)  # every point, before anything runs
    _check_metrics(args.config, metrics, s["slo"], cfg, grid)
    try:
        table = sweep(df, grid, base=cfg, slo=s["slo"] or None, repeats=repeats,
                      workers=args.workers, client=args.dask, out=Path(out) / "sweep.parquet",
                      progress=False if args.no_progress else None)
    except WorkerLost as e:  # the rows that came back are in the file
        raise ValueError(f"{e.lost} of {e.total} points lost: their worker process died "
                         f"({e.why}); the finished ones are in {out}/sweep.parquet: run the "
                         f"same command again to run the lost ones (a resume)") from None
    except ValueError as e:  # the library names its arguments (client=, out=): name the flags
        if args.dask is not None:
            e = ValueError(str(e).replace(f"client={args.dask!r}", f"--dask {args.dask!r}", 1))
        raise out_named(e, Path(out) / "sweep.parquet", out, names("output")) from None
    Path(out).mkdir(parents=True, exist_ok=True)
    with atomic_path(Path(out) / "sweep.csv") as tmp:
        table.to_csv(tmp, index=False)
    missing = [m for m in metrics if m not in table.columns]
    if missing and (table["error"] == "").any():
        raise ValueError(f"{args.config}: metrics {missing} are not summary keys (the runs "
                         f"are kept in sweep.parquet: a re-run with the metrics fixed resumes)")
    for m in metrics:
        if m in table.columns:
            plot_sweep(table, list(grid), m, Path(out) / f"{m}.png")
    failed = int((table["error"] != "").sum())
    cols = (list(grid) + (["repeat", "seed"] if repeats > 1 else [])
            + [m for m in metrics if m in table.columns] + ["error"])
    with pd.option_context("display.float_format", "{:.4g}".format, "display.width", 160):
        print(table[cols].to_string(index=False))
    what = "run" if repeats > 1 else "point"
    print(f"\n{plural(len(table), what)} ({table.attrs['computed']} run now, {failed} failed); "
          f"wrote sweep.parquet, sweep.csv and {plural(len(metrics), 'plot')} to {out}/")
    if table.attrs.get("kept"):  # a re-run with other grid values: their rows stay in the file
        print(f"sweep.parquet also keeps {plural(table.attrs['kept'], 'row')} of grid points "
              f"not in this grid (an earlier run's values)")
    return 0


def add_parser(sub):
    p = sub.add_parser("sweep", help="a grid of runs from a TOML file with a [grid] table")
    p.add_argument("config", help="TOML file: sim run's settings plus [grid] (and metrics)")
    p.add_argument("--workers", type=number(int), default=None,
                   help="local worker processes (default: the CPU count)")
    p.add_argument("--dask", default=None, metavar="ADDRESS",
                   help="run on a Dask scheduler, e.g. tcp://host:8786 (pip install "
                        "'.[cluster]') (default: local processes)")
    add_flags(p, [BY_KEY["repeats"]])
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (default: one on a terminal)")
    add_flags(p, [BY_KEY["output"]])
    p.set_defaults(func=cmd_sweep)
