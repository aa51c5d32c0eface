"""``sim compare FILE``: a benchmark tool's measured run replayed through the simulator, measured
vs simulated per metric in the tool's own names.

``FILE`` is any file ``workloads.from_benchmark`` reads (``vllm bench serve`` result JSON,
AIPerf ``profile_export.jsonl`` / ``profile_export_aiperf.json``, guidellm ``benchmarks.json``
with ``--index`` for a sweep; ``--time-scale S`` for a run measured against ``sim serve
--time-scale S``). Its workload is replayed as the tool sent it: a closed loop of
the tool's concurrency, else an open loop at the requests' send times. The engine's settings
are ``sim run``'s rows of the settings table (``--model``, ``--gpu``, ``--scheduler``,
``--tp``, ...; the workload's own rows are left out: the file is the workload). Prints one row
per metric (:data:`sim.results.bench.metrics.HEADLINE`; ``--all``: every metric both have)
with the relative error (simulated - measured) / measured; ``--report FILE.html`` writes the
run's HTML page with the comparison table in it.
"""

from __future__ import annotations

import math

from ..checks import plural
from .arguments import output_file
from .build import as_written, config_from, with_request_path
from .settings import Names, add_flags, check_router_used, settings_from
from .table import rows_for

# sim run's rows sim compare does not take: the measured file is the workload and its loop
NOT_HERE = ("workload", "hash_block_tokens", "num_requests", "rate", "closed_loop_users",
            "think_time", "output", "plots", "quiet", "report", "seed")


def _fmt(x) -> str:
    return "nan" if x != x else f"{x:,.4g}"


def format_rows(rows) -> str:
    width = max([len("metric")] + [len(r[0]) for r in rows])
    lines = [f"{'metric':<{width}}  {'measured':>12}  {'simulated':>12}  {'error':>8}"]
    for name, m, s, err in rows:
        e = "n/a" if err != err else f"{(err if abs(err) >= 5e-4 else 0.0):+.1%}"
        lines.append(f"{name:<{width}}  {_fmt(m):>12}  {_fmt(s):>12}  {e:>8}")
    return "\n".join(lines)


def loop_of(measured) -> str:
    if measured.concurrency is not None:
        return f"closed loop of {plural(measured.concurrency, 'client')}"
    return "open loop at the requests' send times"


def engine_config(args):
    """``(settings, SimConfig)`` of the engine flags (``sim run``'s rows), checked through to
    its KV pool and cost model; an error names each setting as the user wrote it."""
    names = Names(None)
    s = settings_from(args, names, "run")
    check_router_used(s, names)
    try:
        cfg = config_from(s, names)
        cfg.resolved_kv_blocks()
        cfg.resolved_cost_model()
    except (ValueError, TypeError) as e:
        raise type(e)(as_written(str(e), s, names)) from None
    return s, with_request_path(cfg, args, s)


def cmd_compare(args) -> int:
    import workloads
    from ..engine import run
    from ..results.bench.metrics import HEADLINE, compare_rows, tool_metrics
    from ..tools.fit import replay_config
    if args.index is not None and args.index < 0:
        raise ValueError(f"--index {args.index} must be >= 0")
    report = None
    if args.report is not None:
        if not args.report.endswith((".html", ".htm")):
            raise ValueError(f"--report must be a file name ending in .html, got "
                             f"{args.report!r}")
        report = output_file(args.report, "--report")
    if not (math.isfinite(args.time_scale) and args.time_scale > 0):
        raise ValueError(f"--time-scale must be a number > 0, got {args.time_scale}")
    measured = workloads.from_benchmark(args.measured, index=args.index,
                                        time_scale=args.time_scale)
    s, cfg = engine_config(args)
    res = run(measured.workload, replay_config(cfg, measured))
    simulated = tool_metrics(res, measured.tool)
    rows = compare_rows(measured.metrics, simulated,
                        None if args.all else HEADLINE[measured.tool])
    print(f"measured: {args.measured} ({measured.tool}): "
          f"{plural(len(measured.workload), 'request')}"
          + (f", {measured.num_failed} failed (not replayed)" if measured.num_failed else "")
          + f"; {loop_of(measured)}")
    for note in measured.notes:
        print(f"note: {note}")
    print(f"simulated: {s['model']} on {s['gpu']}, scheduler {cfg.policy()!r}, cost "
          f"{cfg.resolved_cost_model()!r}; "
          f"{plural(int(res.summary()['num_rejected']), 'request')} rejected\n")
    if not rows:
        print("no metric in common (the file holds none of the tool's latency metrics)")
        return 1
    print(format_rows(rows))
    if report is not None:
        from ..results.report import write_report
        table = [("metric", "measured", "simulated", "relative error")] + rows
        write_report(res, report, settings={"measured file": str(args.measured),
                                            "tool": measured.tool, **{
                                                k: v for k, v in s.items()
                                                if k not in NOT_HERE and k != "extra"}},
                     sections=[(f"Measured ({measured.tool}) vs simulated", table)])
        print(f"\nwrote the report to {report}")
    return 0


def add_parser(sub):
    p = sub.add_parser("compare", help="replay a vllm bench / AIPerf / guidellm result and "
                                       "compare its metrics with the simulation's")
    p.add_argument("measured", metavar="FILE",
                   help="vllm bench serve result JSON, AIPerf profile_export.jsonl or "
                        "profile_export_aiperf.json, or guidellm benchmarks.json")
    p.add_argument("--index", type=int, default=None, metavar="I",
                   help="guidellm: which benchmark of a sweep (default: the only one)")
    p.add_argument("--time-scale", type=float, default=1.0, metavar="S",
                   help="the run was measured against 'sim serve --time-scale S': its times "
                        "are divided and its rates multiplied by S (default: 1)")
    p.add_argument("--all", action="store_true",
                   help="every metric both have (default: TTFT, TPOT, ITL, E2E and the "
                        "throughputs)")
    p.add_argument("--report", metavar="FILE.html", default=None,
                   help="also write the run's HTML page with the comparison in it (default: "
                        "none)")
    add_flags(p, [r for r in rows_for("run") if r.key not in NOT_HERE])
    p.set_defaults(func=cmd_compare, config=None)
