"""``sim run``: one simulation from the settings (:mod:`sim.cli.settings`), files out.

The settings and the output folder are checked before anything is simulated. Writes
``requests.parquet``, ``iterations.parquet``, ``summary.json`` (settings + metrics, strict JSON;
the same bytes for the same inputs), ``timing.json`` (the wall time, kept apart) and, with ``--plots`` (``plots = true``), two PNG figures (only when asked: importing
matplotlib and drawing cost ~1 s of a default run, ~4 s at 1M requests): :mod:`sim.cli.output`.
``--report FILE.html`` (or ``report`` in the TOML file) also writes the self-contained HTML
page of :mod:`sim.results.report` (checked writable before the run).
"""

from __future__ import annotations

import dataclasses
import sys
import warnings

from ..checks import plural
from ..costs.roofline_terms import moe_note, summary_line
from ..engine.core.policies import KNOBS
from .arguments import output_file, output_folder
from .build import build, warn_pool, warn_unused_seed, with_request_path
from .output import format_summary, write_bench_files, write_outputs
from .settings import (DEFAULT_SCENARIO, Names, add_run_args, check_router_used, given_value,
                       is_default_scenario, settings_from)

__all__ = ["add_parser", "cmd_run", "format_summary"]


def unused_acceptance(df, cfg) -> bool:
    """Whether the workload's per-request ``acceptance_rate`` goes unused (no speculation)."""
    return (cfg.speculative is None and "acceptance_rate" in df.columns
            and bool(df["acceptance_rate"].notna().any()))


def cmd_run(args) -> int:
    """``sim run``: check the settings and the output folder, simulate, write the files, print
    the scenario line and the summary (a progress bar on stderr for long runs in a terminal)."""
    from ..engine import run
    names = Names(args.config)
    s = settings_from(args, names, "run")
    check_router_used(s, names)
    out = output_folder(s["output"], names("output"))
    report, shown = given_value(args, s, "report")
    if report is not None:
        if not isinstance(report, str) or not report.endswith((".html", ".htm")):
            raise ValueError(f"{shown} must be a file name ending in .html, got {report!r}")
        report = output_file(report, shown)
    df, cfg = build(s, names)
    cfg = with_request_path(cfg, args, s)
    show_progress = not args.quiet and sys.stderr.isatty() and len(df) > 20_000
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="seed=")  # said here, of --seed as a whole
        warn_unused_seed("run", s, cfg, names)
        if unused_acceptance(df, cfg):  # said once, in the CLI's words
            print(f"sim run: warning: workload {s['workload']}: column acceptance_rate is "
                  f"ignored: speculative decoding is off (give --spec-tokens K and the "
                  f"draft's cost, or a [speculative] table in the TOML file, to use it)",
                  file=sys.stderr)
            warnings.filterwarnings("ignore", message="workload column acceptance_rate")
        warn_pool("run", s, cfg, names)
        res = run(df, dataclasses.replace(cfg, progress=show_progress))
    made = {}

    def document() -> dict:  # (made while write_outputs writes the parquet files)
        made["summary"] = res.summary(slo=s["slo"] or None)
        made["meta"] = _settings_used(s, args, cfg, res, df)
        made["findings"] = res.diagnose(made["summary"])
        return {"settings": made["meta"], "summary": made["summary"], "findings": [
            {"code": f.code, "message": f.message, "action": f.action, "value": f.value}
            for f in made["findings"]]}

    written = write_outputs(res, out, document, s["plots"], slo=s["slo"] or None)
    summary, meta, findings = made["summary"], made["meta"], made["findings"]
    policy = cfg.policy()
    resampled = df.attrs.get("resampled_from")
    if report is not None:
        from ..results.report import write_report
        write_report(res, report, slo=s["slo"] or None, findings=findings, settings=meta)
    fmt = given_value(args, s, "format")[0]
    if fmt is not None:
        written += write_bench_files(res, out, fmt, {
            "model": s["model"], "rate": meta.get("rate", s["rate"]),
            "concurrency": s["closed_loop_users"] if s.get("max_concurrency") is None
            else s["max_concurrency"], "burstiness": s.get("burstiness")})
    if not args.quiet:
        if is_default_scenario(s):
            print(f"default scenario: {DEFAULT_SCENARIO}\n")
        print(f"workload {s['workload']}: {plural(len(df), 'request')}; scheduler {policy!r}; "
              f"cost {meta['cost_model']}")
        if resampled:
            print(f"note: {s['workload']} holds {resampled:,} length pairs; the {len(df):,} "
                  f"requests sample them with replacement")
        cost = cfg.resolved_cost_model()
        if getattr(cost, "terms_profiled", True) is False:  # some terms assumed on this GPU
            print(f"note: {cost.terms_note}; roofline terms: {summary_line(cost.gpu_key)}")
        if getattr(cost, "gpu_key", None) and (line := moe_note(cost)):
            print(f"note: {line}")
        if " has no " in getattr(cost, "compute_note", ""):  # fp4/fp8 weights, weight-only
            print(f"note: {cost.compute_note}")
        print()
        print(format_summary(summary, max_batch_size=res.config.max_batch_size,
                             prefix_caching=res.config.prefix_caching,
                             names_prefixes=res.num_prefix_keyed > 0,
                             lora=res.config.lora))
        if findings:
            print("\nfindings:")
            for f in findings:
                print(f"  - {f.message}\n    try: {f.action}")
        print(f"\nwrote {', '.join(written)} to {out}/")
        if s["plots"] and "latency_cdfs.png" not in written:  # (save_plots: finished ones only)
            print("no latency_cdfs.png: no request finished")
        if s["plots"] and "timeline.png" not in written:  # (every request rejected at arrival)
            print("no timeline.png: no iteration ran")
        if report is not None:
            print(f"wrote the report to {report}")
    return 0


def _settings_used(s, args, cfg, res, df) -> dict:
    """``summary.json``'s settings: the run's settings and the values it used."""
    meta = dict(s)
    meta["cost_model"] = repr(cfg.resolved_cost_model())
    meta["kv_blocks"] = res.kv_blocks
    meta["max_model_len"] = cfg.resolved_max_model_len()  # the limit used (None: none)
    if given_value(args, s, "request_path")[1] is not None:  # the seconds used
        path = cfg.request_path
        meta["request_path"] = None if path is None else dataclasses.asdict(path)  # (off: None)
    for knob in ("max_batch_size", "block_size", "prefix_caching", "gpu_memory_utilization"):
        meta[knob] = getattr(res.config, knob)  # the values used (a None took the default)
    for knob in KNOBS:  # the policy knobs used (resolved)
        meta[knob] = getattr(res.config, knob)
    t = df["arrival_time"].to_numpy()
    if s["rate"] is None and s["closed_loop_users"] is None and len(t) > 1 and t[-1] > t[0]:
        meta["rate"] = (len(t) - 1) / float(t[-1] - t[0])  # the trace's own mean rate
    resampled = df.attrs.get("resampled_from")
    if resampled:
        meta["resampled_from"] = resampled
    return meta


def add_parser(sub):
    p = sub.add_parser("run", help="simulate a workload (no arguments: the default scenario)")
    add_run_args(p, "run")
    p.set_defaults(func=cmd_run)
