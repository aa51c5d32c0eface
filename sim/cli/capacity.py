"""``sim capacity``: the highest request rate the configured replica serves within its SLOs.

Takes the same settings as ``sim run`` (flags or a TOML file, ``--request-path`` /
``request_path`` included; the table's rows for ``capacity``) plus ``--attainment`` and
``--tol``; at least one ``--slo-*`` limit is required. Prints the rate, goodput per GPU and the
rates tried (:func:`sim.tools.capacity.max_rate`). A length-only set needs no ``--rate``: the
search re-scales its arrivals, drawn at ``REFERENCE_RATE``
(:func:`~sim.cli.build.build_rescaled`).
"""

from __future__ import annotations

import warnings

from ..checks import plural
from .arguments import number
from .build import build_rescaled, warn_pool, warn_unused_seed, with_request_path
from .settings import Names, add_run_args, check_router_used, settings_from


# sim run's settings sim capacity refuses (cmd_capacity says why): hidden from its --help
REFUSED = ("output", "quiet", "plots", "closed_loop_users", "think_time")


def cmd_capacity(args) -> int:
    from ..tools.capacity import max_rate
    for flag, given in (("--output", args.output is not None), ("--quiet", args.quiet),
                        ("--plots" if args.plots else "--no-plots", args.plots is not None)):
        if given:  # (sim run's flags, parsed alike; a TOML file's keys are for sim run too)
            raise ValueError(f"{flag} is not used by sim capacity: it prints the highest rate "
                             f"and the rates tried, and writes no file")
    if args.think_time is not None:  # (before settings_from asks for --closed-loop with it)
        raise ValueError("--think-time is not used by sim capacity: it time-scales an open "
                         "loop's arrivals, with no users to think")
    names = Names(args.config)
    s = settings_from(args, names, "capacity")
    check_router_used(s, names)
    if not s["slo"]:
        raise ValueError("sim capacity needs at least one SLO: --slo-ttft, --slo-itl, "
                         "--slo-tpot or --slo-e2e (seconds), or an [slo] table")
    if s["closed_loop_users"] is not None:  # (before the workload is built: named as written)
        raise ValueError(f"{names('closed_loop_users')} {s['closed_loop_users']}: sim capacity "
                         f"time-scales an open loop's arrivals, and a closed loop's users issue "
                         f"requests as theirs finish (drop it; compare user counts with sim run "
                         f"or a sweep)")
    if s.get("max_concurrency") is not None:  # (the API's refusal names config.closed_loop)
        raise ValueError(f"{names('max_concurrency')} {s['max_concurrency']}: sim capacity "
                         f"time-scales an open loop's arrivals, and the cap holds requests back "
                         f"until others finish, its latencies counted from the send (drop it; "
                         f"compare caps with sim run or a sweep)")
    for flag, value, top in (("--attainment", args.attainment, 1), ("--tol", args.tol, None)):
        if value > 1 or (top is None and value == 1):
            raise ValueError(f"{flag} {value:g} must be {'at most 1' if top else 'below 1'} "
                             f"(a fraction)")
    (df, cfg), s = build_rescaled(s, names)  # (a length-only set: the search re-scales it)
    cfg = with_request_path(cfg, args, s)
    with warnings.catch_warnings():  # (no rate: said below, with the rates tried)
        warnings.filterwarnings("ignore", message="no rate meets")
        warnings.filterwarnings("ignore", message="seed=")  # said here, of --seed as a whole
        warn_unused_seed("capacity", s, cfg, names)
        warn_pool("capacity", s, cfg, names)
        cap = max_rate(df, s["slo"], attainment=args.attainment, config=cfg, tol=args.tol)
    limits = ", ".join(f"{k} <= {v:g} s" for k, v in s["slo"].items())
    print(f"workload {s['workload']}: {plural(len(df), 'request')}; scheduler {cfg.policy()!r}; "
          f"SLOs {limits} for {args.attainment:.0%} of requests")
    if cap.rate != cap.rate:
        print(f"no rate tried meets the SLOs, down to {cap.points['rate'].min():.4g} req/s "
              f"(best attainment {cap.points['slo_attainment'].max():.1%}): with the requests "
              f"that far apart each runs alone, and still misses the limits: "
              f"{cap.reason.split(': ', 1)[1]}")
        return 1
    print(f"max rate {cap.rate:.4g} req/s (within {args.tol:.1%}); goodput "
          f"{cap.summary['goodput']:.4g} req/s, {cap.goodput_per_gpu:.4g} per GPU "
          f"({plural(cap.num_gpus, 'GPU')})")
    if cap.rate_lo == cap.rate_lo:  # --bands: the search at the band's slow and fast ends
        print(f"{cfg.bands:.0%} band: {cap.rate_lo:.4g}-{cap.rate_hi:.4g} req/s (every step at "
              f"the slow and the fast end of the cost model's measured error)")
    print("rates tried:")
    for row in cap.points.itertuples():
        print(f"  {row.rate:10.4g} req/s  attainment {row.slo_attainment:6.1%}  "
              f"{'pass' if row.passed else 'fail'}")
    return 0


def add_parser(sub):
    p = sub.add_parser("capacity", help="the highest request rate that meets the SLOs")
    add_run_args(p, "capacity", hide=REFUSED)  # the refused: parsed (to say so), not listed
    p.add_argument("--attainment", type=number(float), default=0.9,
                   help="fraction of requests that must meet every SLO (default 0.9)")
    p.add_argument("--tol", type=number(float), default=0.01,
                   help="relative width of the final rate bracket (default 0.01)")
    p.set_defaults(func=cmd_capacity)
