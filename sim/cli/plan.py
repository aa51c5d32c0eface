"""``sim plan FILE.toml``: the cheapest configuration that meets the SLO, over a search space.

The file holds ``sim run``'s settings (the base of every candidate; ``rate``, when given, is
the target load, and the workload is drawn or time-scaled to it), an ``[slo]`` table, a
``[space]`` table and the plan's own keys (:mod:`sim.cli.table_plan`: ``attainment``,
``objective``, ``latency``, ``tol``, ``margin``). It runs :func:`sim.tools.plan.plan` on local
processes (``--workers``) or a Dask scheduler (``--dask``), with a progress bar on a terminal,
and writes to the output folder:

- ``plan.parquet``: the simulated candidates, rewritten as each finishes; a re-run of the same
  file resumes from it (killed or not, the same table);
- ``plan.csv``: the ranked table (every candidate, every summary metric, why each pruned one
  was pruned, the Pareto column), and ``pareto.png``, cost against latency;
- ``winner.toml``: the file's ``sim run`` settings with the winner's values, replaying
  ``winner-workload.parquet``, the requests as the plan ran the winner (time-scaled to the
  target rate, or to its capacity without one; output in ``winner/``): ``sim run
  winner.toml`` gives the plan's numbers;
- ``plan.html``: the HTML report of that replay, with the candidates and the Pareto plot as
  sections.

A file with a ``[day]`` table plans a day of traffic instead (fixed fleets against autoscaled
ones): :mod:`sim.cli.plan_day`.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..checks import plural
from .arguments import number, out_named, output_folder
from .build import build_rescaled
from .settings import Names, add_flags, given_value, read_toml, settings_from
from .table import BY_KEY, SHARED
from .table_plan import ROWS
from .winner_toml import absolute_paths, plain, to_toml

POOL_TARGETS = (("prefill_pool",), ("decode_pool",))
OWN = tuple(row.key for row in ROWS)  # the plan's keys: not sim run's (left out of the winner)


def _space(raw, config):
    """The ``[space]`` table as API fields -> values (each checked by its row), and the API
    field -> TOML key map."""
    space, keys = {}, {}
    for key, values in raw.items():
        shown = f"{config}: space.{key}"
        if not isinstance(values, list) or not values:
            raise ValueError(f"{shown} must be a non-empty list of values, got {values!r}")
        if key == "split":
            space[key], keys[key] = values, key
            continue
        row = BY_KEY.get(key)
        if row is not None and row.to in POOL_TARGETS:  # (a pool's knob: sim.cli.table_hetero)
            space[key] = [row.check(shown, v) if row.check else v for v in values]
            keys[key] = key
            continue
        if row is None or row.to != ("config",) or row.commands != SHARED:
            known = sorted(r.key for r in BY_KEY.values()
                           if r.to in POOL_TARGETS or (r.to == ("config",)
                                                       and r.commands == SHARED))
            raise ValueError(f"{shown}: not a sim run setting of the config; known: "
                             f"{', '.join(known)}, split")
        space[row.api_field] = [row.check(shown, v) if row.check else v for v in values]
        keys[row.api_field] = key
    return space, keys


def winner_settings(loaded, best, keys, workload, out) -> dict:
    """The plan file's ``sim run`` settings with the winner's values, replaying ``workload``
    (the file of the requests as the plan ran them, at the target rate or the winner's
    capacity) as it is (see the module docstring)."""
    s = {k: v for k, v in loaded.items() if k not in OWN + ("rate", "num_requests", "seed")}
    for field, key in keys.items():
        value = plain(best[field])
        if key != "split":
            s[key] = value
            continue
        for k in ("prefill_replicas", "decode_replicas"):
            s.pop(k, None)
        if value != "aggregated":
            p, d = (int(x) for x in value.split(":"))
            s.update(prefill_replicas=p, decode_replicas=d)
            s.pop("replicas", None)
    if "prefill_replicas" not in s:  # (aggregated: no pools, so no pool's knobs)
        for key in [k for k in s if BY_KEY.get(k) and BY_KEY[k].to in POOL_TARGETS]:
            s.pop(key)
    s["workload"] = str(workload)
    return absolute_paths(s, out)


def _report(table, df, cfg, space, slo, objective, latency, path) -> None:
    from ..engine import run
    from ..results.plots_plan import plot_pareto
    from ..results.report import write_report
    from ..tools.plan_space import candidate_config
    best = table.iloc[0]
    config = candidate_config(cfg, {k: plain(best[k]) for k in space})
    cols = ["rank", *space, objective, latency, "max_rate", "stage", "reason"]
    rows = [cols] + [[plain(r[c]) if c in r else "" for c in cols]
                     for _, r in table.iterrows()]
    rows = [[("" if isinstance(v, float) and math.isnan(v) else v) for v in r] for r in rows]
    write_report(run(df, config), path, slo=slo, sections=[
        ("Plan: every candidate (the winner first)", rows),
        ("Plan: cost against latency", lambda buf: plot_pareto(table, objective, latency,
                                                               buf))])


def _dask_named(error, address) -> ValueError:
    """A library error naming ``client=`` in the words of ``--dask``."""
    if address is None:
        return error
    return ValueError(str(error).replace(f"client={address!r}", f"--dask {address!r}", 1))


def cmd_plan(args) -> int:
    from ..tools.plan import plan
    from ..tools.plan_space import SpaceValueError
    names = Names(args.config)
    s = settings_from(args, names, "plan")
    loaded = read_toml(args.config, "plan")
    if "day" in s["extra"]:  # a day of traffic: sim.cli.plan_day
        from .plan_day import cmd_plan_day
        try:
            return cmd_plan_day(args, s, names)
        except ValueError as e:
            raise _dask_named(e, args.dask) from None
    if "space" not in s["extra"]:
        raise ValueError(f"{args.config}: a plan needs a [space] table (key = [values, ...])")
    own = {row.key: given_value(args, s, row.key)[0] for row in ROWS}
    own = {k: (BY_KEY[k].default if v is None else v) for k, v in own.items()}
    space, keys = _space(own["space"], args.config)
    if not s["slo"]:
        raise ValueError(f"{args.config}: a plan needs an [slo] table (ttft, itl, tpot, e2e)")
    target = s["rate"]  # the target load (None: each candidate's capacity is ranked)
    out = output_folder(s["output"], names("output"))
    (df, cfg), s = build_rescaled(s, names, fits=False)  # (the space sets tp, gpu, ...)
    kwargs = dict(space=space, base=cfg, attainment=own["attainment"], rate=target,
                  objective=own["objective"], latency=own["latency"], tol=own["tol"],
                  margin=own["margin"], workers=args.workers, client=args.dask,
                  out=Path(out) / "plan.parquet", progress=False if args.no_progress else None)
    try:
        table = plan(df, s["slo"], **kwargs)
    except SpaceValueError as e:
        raise ValueError(f"{args.config}: space.{keys[e.key]} value {e.value!r} is invalid on "
                         f"its own (so in every candidate): {e.reason}") from None
    except ValueError as e:
        raise out_named(_dask_named(e, args.dask), kwargs["out"], out,
                         names("output")) from None
    Path(out).mkdir(parents=True, exist_ok=True)
    table.to_csv(Path(out) / "plan.csv", index=False)
    a = table.attrs
    stages = table.loc[table["status"] == "pruned", "stage"].value_counts()
    print(f"{plural(len(table), 'candidate')}: {a['pruned_before']} pruned before simulating, "
          f"{a['simulated']} simulated now, {a['resumed']} read back from plan.parquet; "
          f"pruned by stage: {', '.join(f'{k} {v}' for k, v in stages.items()) or 'none'}")
    ranked = table[table["status"] == "ranked"]
    if not len(ranked):
        built = table[table["stage"] != "invalid"]
        why = (f"no candidate meets the SLOs{f' at {target:g} req/s' if target else ''}"
               if len(built) else f"no candidate is a valid configuration (the first: "
                                  f"{table['reason'].iloc[0]})")
        print(f"{why}: see plan.csv's reason column; wrote plan.csv to {out}/")
        return 1
    import pandas as pd

    from ..results.plots_plan import plot_pareto
    plot_pareto(table, own["objective"], own["latency"], Path(out) / "pareto.png")
    best = ranked.iloc[0]
    rate = target if target is not None else best["max_rate"]
    if rate == rate:  # (NaN: no target, and the workload too short to find the edge)
        import workloads as wl
        replayed = wl.scale_to_rate(df, rate)  # the requests as the plan ran the winner
        wl.save(replayed, Path(out) / "winner-workload.parquet")
        winner = winner_settings(loaded, best, keys, Path(out) / "winner-workload.parquet",
                                 out)
        (Path(out) / "winner.toml").write_text(to_toml(winner))
        _report(table, replayed, cfg, space, s["slo"], own["objective"], own["latency"],
                Path(out) / "plan.html")
    cols = ["rank", "pareto", *space, own["objective"], own["latency"], "max_rate"]
    with pd.option_context("display.float_format", "{:.4g}".format, "display.width", 160):
        print(ranked[cols].head(10).to_string(index=False))
    if rate == rate:
        print(f"\nwrote plan.parquet, plan.csv, pareto.png, winner.toml (with "
              f"winner-workload.parquet, the requests at {rate:.4g} req/s) and plan.html to "
              f"{out}/ (replay: sim run {Path(out) / 'winner.toml'})")
    else:
        print(f"\nwrote plan.parquet, plan.csv and pareto.png to {out}/; no winner.toml: "
              f"the workload is too short to find the winner's capacity (give more requests "
              f"or a target rate)")
    return 0


def add_parser(sub):
    p = sub.add_parser("plan", help="the cheapest configuration that meets the SLOs")
    p.add_argument("config", help="TOML file: sim run's settings, [slo], [space] and the "
                                  "plan's keys; with a [day] table, a plan over a day of "
                                  "traffic (fixed against autoscaled fleets)")
    p.add_argument("--workers", type=number(int), default=None,
                   help="local worker processes (default: the CPU count)")
    p.add_argument("--dask", default=None, metavar="ADDRESS",
                   help="run on a Dask scheduler, e.g. tcp://host:8786 (pip install "
                        "'.[cluster]') (default: local processes)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (default: one on a terminal)")
    add_flags(p, [row for row in ROWS if row.flags] + [BY_KEY["output"]])
    p.set_defaults(func=cmd_plan)
