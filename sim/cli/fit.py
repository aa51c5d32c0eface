"""``sim fit FILE...``: the roofline's efficiencies and per-iteration overhead fitted to
measured runs (:mod:`sim.tools.fit`), written as a profile ``sim run --profile`` uses.

Each ``FILE`` is any file ``sim compare`` reads (a guidellm sweep: each of its benchmarks is a
run). The engine's settings are ``sim compare``'s (``sim run``'s rows less the workload's and
the outputs'), less ``--cost`` and ``--profile``: the roofline is what is fitted. ``sim fit``'s
own settings are the rows of :mod:`sim.cli.table_fit` (``--holdout``, ``--write``,
``--max-evaluations``). Prints one row per run (its split, its requests, its error before and
after), the mean error of the fit runs and of the held-out runs before and after, and the
terms found.
"""

from __future__ import annotations

import json
import os

from ..checks import plural
from .arguments import output_file
from .compare import NOT_HERE, engine_config
from .settings import add_flags
from .table import rows_for
from .table_fit import ROWS

FITTED = ("cost", "profile")  # the cost model is what sim fit fits


def _own(args) -> dict:
    out = {}
    for row in ROWS:
        v = getattr(args, row.dest)
        out[row.key] = row.default if v is None else (row.check(row.flags[0], v)
                                                       if row.check else v)
    return out


def _pct(v) -> str:
    return "n/a" if v != v else f"{100 * v:.1f}%"


def format_fit(result) -> str:
    width = max([len("run")] + [len(r[0]) for r in result.rows])
    lines = [f"{'run':<{width}}  {'split':<8}  {'requests':>8}  {'roofline':>9}  "
             f"{'fitted':>8}"]
    for name, split, n, before, after in result.rows:
        lines.append(f"{name:<{width}}  {split:<8}  {n:>8}  {_pct(before):>9}  "
                     f"{_pct(after):>8}")
    for split in ("fit", "held-out"):
        if any(r[1] == split for r in result.rows):
            lines.append(f"{split} runs: mean error {_pct(result.mean_error(split, 'before'))} "
                         f"(roofline) -> {_pct(result.mean_error(split, 'after'))} (fitted)")
    t, b = result.terms, result.base
    lines.append(f"terms: compute_eff_scale {t['compute_eff_scale']:.4g}, memory_eff_scale "
                 f"{t['memory_eff_scale']:.4g}, overhead_s {t['overhead_s'] * 1e3:.4g} ms "
                 f"(roofline: 1, 1, {b['overhead_s'] * 1e3:.4g} ms); "
                 f"{plural(result.evaluations, 'evaluation')}")
    return "\n".join(lines)


def cmd_fit(args) -> int:
    from ..tools.fit import fit, profile_doc, runs_of
    own = _own(args)
    if not str(own["write"]).endswith(".json"):
        raise ValueError(f"--write must be a file name ending in .json, got {own['write']!r}")
    target = output_file(own["write"], "--write")
    seen = {}
    for path in args.measured:  # a file twice would be fitted to and held out at once
        key = os.path.realpath(path)
        if key in seen:
            raise ValueError(f"{path}: given twice (as {seen[key]} too): each measured run "
                             f"once, or a held-out run may be one the fit saw")
        seen[key] = path
    runs = [r for path in args.measured for r in runs_of(path)]
    if own["holdout"] is not None and own["holdout"] >= len(runs):
        raise ValueError(f"--holdout {own['holdout']}: must be below the number of measured "
                         f"runs, {len(runs)} (at least one to fit to)")
    s, cfg = engine_config(args)
    result = fit(runs, cfg, holdout=own["holdout"], max_evaluations=own["max_evaluations"])
    held = sum(r[1] == "held-out" for r in result.rows)
    print(f"fitted to {plural(len(runs) - held, 'measured run')} ({held} held out): "
          f"{s['model']} on {s['gpu']}, scheduler {cfg.policy()!r}; error: mean |relative "
          f"error| over sim compare's headline metrics\n")
    print(format_fit(result))
    target.write_text(json.dumps(profile_doc(result, cfg), indent=1) + "\n")
    print(f"\nwrote the profile to {target} (sim run --profile {target} ...)")
    return 0


def add_parser(sub):
    p = sub.add_parser("fit", help="fit the roofline's efficiencies and overhead to measured "
                                   "vllm bench / AIPerf / guidellm runs")
    p.add_argument("measured", metavar="FILE", nargs="+",
                   help="result files sim compare reads (vllm bench serve JSON, AIPerf "
                        "profile exports, guidellm benchmarks.json)")
    add_flags(p, [r for r in rows_for("run") if r.key not in NOT_HERE + FITTED])
    add_flags(p, rows_for("fit"))
    p.set_defaults(func=cmd_fit, config=None)
