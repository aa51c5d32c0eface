"""``sim plan FILE.toml`` with a ``[day]`` table: the cheapest fleet for a day of traffic,
fixed or autoscaled (:func:`sim.tools.plan_day.plan_day`).

The file holds ``sim run``'s settings (the model, GPU and tensor parallelism of every replica;
the workload, drawn or time-scaled to ``rate`` when given, whose rate is the day's peak and
whose (prompt, output) pairs the day's requests take: :func:`workloads.day_like`), an
``[slo]`` table, ``attainment`` (the share of the day's requests that must meet it), a
``[day]`` table (:mod:`sim.cli.table_plan_day`: ``hours``, default 24; ``peak_to_trough``,
default 4; ``peak_hour``, default 14 x ``period_hours`` / 24; ``period_hours``, default 24;
``fixed``, fixed fleet sizes; any :class:`sim.Autoscaler` field: the policy every candidate
starts from) and an optional ``[space]`` of Autoscaler fields, each with its values (the
autoscaled candidates: their product). Every key is checked before any run and a bad one is a
one-line error naming the file and the key; ``objective``, ``latency``, ``tol`` and ``margin``
(a plan at one load's) are refused, not ignored. Writes to the output folder ``plan_day.csv`` (every
candidate, ranked ones first, why each other one was pruned), and for the winner
``day.png`` (replicas and rate over the day above, SLO attainment below:
:func:`sim.results.plots_autoscale.plot_autoscaled`), ``day_over_time.csv`` (per window of
a 48th of the day: arrivals, rate, attainment) and ``winner.toml``, the file with the winner
as its only candidate (:func:`day_winner`: ``sim plan winner.toml`` replays the winner's day).
Returns 1 when no candidate meets the SLO.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

NOT_A_DAYS = ("objective", "latency", "tol", "margin")  # (sim plan's keys of a plan at one load)
SHAPE = {"hours": 24.0, "peak_to_trough": 4.0, "peak_hour": None, "period_hours": 24.0}


def _fields() -> tuple:
    from ..engine.fleet.autoscaler import Autoscaler
    return tuple(f.name for f in dataclasses.fields(Autoscaler))


def _number(shown, value, positive=True):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value) or (positive and not value > 0):
        raise ValueError(f"{shown} must be a {'positive ' if positive else ''}number, got "
                         f"{value!r}")
    return float(value)


def read_day(day, space, config):
    """``(shape, fixed, policy, space)`` of the file ``config``'s ``[day]`` and ``[space]``
    tables, checked (see the module docstring)."""
    from ..engine.fleet.autoscaler import Autoscaler
    fields = _fields()
    known = (*SHAPE, "fixed", *fields)
    for key in day:
        if key not in known:
            raise ValueError(f"{config}: day.{key}: not a key of the day; known: "
                             f"{', '.join(known)}")
    shape = {k: (_number(f"{config}: day.{k}", day[k], positive=k != "peak_hour")
                 if k in day else v) for k, v in SHAPE.items()}
    if shape["peak_hour"] is None:
        shape["peak_hour"] = 14.0 * shape["period_hours"] / 24.0
    fixed = day.get("fixed", [])
    if not isinstance(fixed, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in fixed):
        raise ValueError(f"{config}: day.fixed must be a list of fleet sizes (integers >= 1), "
                         f"got {fixed!r}")
    try:
        policy = Autoscaler(**{k: v for k, v in day.items() if k in fields})
    except (ValueError, TypeError) as e:
        raise ValueError(f"{config}: day: {e}") from None
    for key, values in (space or {}).items():
        if key not in fields:
            raise ValueError(f"{config}: space.{key}: not an Autoscaler field (a [day] plan "
                             f"searches the fleet's policy); known: {', '.join(fields)}")
        if not isinstance(values, list) or not values:
            raise ValueError(f"{config}: space.{key} must be a non-empty list of values, got "
                             f"{values!r}")
    if not space and not fixed:
        raise ValueError(f"{config}: a [day] plan needs candidates: a [space] of Autoscaler "
                         f"fields or day.fixed fleet sizes")
    return shape, fixed, policy, dict(space or {})


def cmd_plan_day(args, s, names) -> int:
    """The day's plan (see the module docstring)."""
    import pandas as pd

    import workloads as wl

    from ..checks import plural
    from ..results.plots_autoscale import plot_autoscaled
    from ..tools.autoscale import run_autoscaled
    from ..tools.plan_day import SHOWN, plan_day, policies
    from .arguments import output_folder
    from .build import build_rescaled
    from .winner_toml import to_toml
    from .settings import given_value, read_toml
    from .table import BY_KEY
    own = {k: given_value(args, s, k)[0] for k in ("day", "space", "attainment")}
    for key in NOT_A_DAYS:
        value, shown = given_value(args, s, key)
        if value is not None:
            raise ValueError(f"{shown} {value!r} does not apply to a [day] plan (it ranks by "
                             f"the day's dollars, then GPU-hours): drop it or the [day] table")
    shape, fixed, policy, space = read_day(own["day"], own["space"], args.config)
    if not s["slo"]:
        raise ValueError(f"{args.config}: a plan needs an [slo] table (ttft, itl, tpot, e2e)")
    attainment = BY_KEY["attainment"].default if own["attainment"] is None \
        else own["attainment"]
    out = output_folder(s["output"], names("output"))
    (trace, config), s = build_rescaled(s, names, rescaled=False, fits=False)
    day = wl.day_like(trace, shape["hours"], peak_to_trough=shape["peak_to_trough"],
                      peak_hour=shape["peak_hour"], period_hours=shape["period_hours"],
                      seed=s["seed"])
    table = plan_day(day, s["slo"], base=config, space=space, fixed=fixed, policy=policy,
                     attainment=attainment, workers=args.workers, client=args.dask)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "plan_day.csv", index=False)
    ranked = table[table["status"] == "ranked"]
    print(f"{plural(len(day), 'request')} over {shape['hours']:g} h (peak "
          f"{wl.own_rate(trace):.4g} req/s, peak-to-trough {shape['peak_to_trough']:g}); "
          f"{plural(len(table), 'candidate')}, {len(ranked)} meet the SLOs for "
          f"{attainment:.1%} of the requests")
    if not len(ranked):
        print(f"no candidate meets the SLOs over the day: see plan_day.csv's reason column; "
              f"wrote plan_day.csv to {out}/")
        return 1
    best = ranked.iloc[0]
    winner_policy = next(p for knobs, p in policies(space, fixed, policy)
                         if all(best[k] == v for k, v in knobs.items() if v is not None))
    winner = run_autoscaled(day, config, winner_policy)
    window = shape["hours"] * 3600.0 / 48
    winner.over_time(s["slo"], window).to_csv(out / "day_over_time.csv", index=False)
    plot_autoscaled(winner, s["slo"], out / "day.png", window_s=window)
    cols = ["rank", *SHOWN, "usd", "gpu_hours", "cold_start_usd", "mean_replicas",
            "slo_attainment"]
    with pd.option_context("display.float_format", "{:.4g}".format, "display.width", 160):
        print(ranked[[c for c in cols if c in ranked]].head(10).to_string(index=False))
    (out / "winner.toml").write_text(to_toml(day_winner(read_toml(args.config, "plan"), best,
                                                        space, out)))
    print(f"\nwrote plan_day.csv, day.png, day_over_time.csv (the winner's day) and winner.toml "
          f"to {out}/ (replay: sim plan {out / 'winner.toml'})")
    return 0


def day_winner(loaded, best, space, out) -> dict:
    """The day plan file's settings (``loaded``) with the winner alone as its candidates: a
    fixed fleet's size as ``day.fixed``, an autoscaled winner's knobs as one-value ``[space]``
    lists, so that ``sim plan winner.toml`` runs the winner's day again (the same day: the
    file's workload, rate and seed; ``sim run`` has no autoscaler). Paths absolute, output the
    folder's ``winner/``, as :func:`sim.cli.plan.winner_settings`' are."""
    from .winner_toml import absolute_paths, plain
    s = {k: v for k, v in loaded.items() if k != "space"}
    day = {k: v for k, v in loaded["day"].items() if k != "fixed"}
    if best["kind"] == "fixed":
        day["fixed"] = [int(best["max_replicas"])]
    else:
        s["space"] = {k: [next((v for v in values if v == best[k]), plain(best[k]))]
                      for k, values in space.items()}  # (the file's value: 3, not 3.0)
    s["day"] = day
    return absolute_paths(s, out)
