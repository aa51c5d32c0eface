"""``sim run``: settings from flags and an optional TOML file, one simulation, files out.

Settings are the flags' names (``DEFAULTS``); a TOML file gives the same keys (plus an ``[slo]``
table) and flags override it. Writes ``requests.parquet``, ``iterations.parquet``,
``summary.json`` (settings + metrics) and, unless ``--no-plots``, two PNG figures.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tomllib
from pathlib import Path

from ..constants import CHUNK_SIZE
from ..engine.schedulers import POLICIES


def _first_line(cls) -> str:
    return (cls.__doc__ or cls.__name__).strip().splitlines()[0].rstrip(".")


# every setting of ``sim run`` with its default; a TOML file may give any of these keys
DEFAULTS = {
    "workload": "azure-conv", "num_requests": None, "rate": None, "scheduler": "chunked",
    "model": "llama-3.1-8b", "gpu": "h100", "tensor_parallel": 1, "max_batch_size": None,
    "chunk_size": None, "token_budget": None, "kv_blocks": None, "block_size": None, "seed": 0,
    "cost": "roofline", "profile": None, "output": "sim-out", "plots": True, "slo": {},
    "closed_loop_users": None, "think_time": 0.0, "prefix_caching": None,
}
DEFAULT_SCENARIO = ("Llama-3.1-8B (fp16) on one H100-80GB, roofline cost model; the Azure LLM "
                    "inference 2023 'conv' trace (19,366 requests over ~58 min, replayed); "
                    "chunked prefill (512-token budget), max batch 256, KV pool from the memory "
                    "budget")


def _add_run_args(p):
    """The flags of ``sim run``; each maps to a key of ``DEFAULTS`` (the TOML file's keys)."""
    p.add_argument("config", nargs="?", help="TOML file with the same settings as the flags")
    p.add_argument("--workload", "-w", help="bundled trace name or CSV/JSONL/parquet file")
    p.add_argument("--num-requests", "-n", type=int, dest="num_requests")
    p.add_argument("--rate", type=float, help="requests/s (time-scales a trace)")
    p.add_argument("--scheduler", "-s", choices=sorted(POLICIES), metavar="NAME",
                   help="; ".join(f"{name}: {_first_line(cls)}" for name, cls in POLICIES.items())
                   + " (default chunked)")
    p.add_argument("--model")
    p.add_argument("--gpu")
    p.add_argument("--tp", type=int, dest="tensor_parallel")
    p.add_argument("--max-batch-size", type=int, dest="max_batch_size",
                   help="most running requests (default: the scheduler's; 256 for the simple ones)")
    p.add_argument("--chunk-size", type=int, dest="chunk_size",
                   help=f"chunked: prefill token budget per iteration (default {CHUNK_SIZE})")
    p.add_argument("--token-budget", type=int, dest="token_budget",
                   help="continuous: cap on prompt tokens admitted per iteration (default none)")
    p.add_argument("--kv-blocks", type=int, dest="kv_blocks")
    p.add_argument("--prefix-caching", choices=["off", "block"], dest="prefix_caching",
                   help="prefix cache: off, or block (vLLM v1: full blocks keyed by the "
                        "workload's hash_ids) (default: the scheduler's; off for the simple "
                        "ones, block for vllm)")
    p.add_argument("--block-size", type=int, dest="block_size",
                   help="tokens per KV block (default: the scheduler's; 16)")
    p.add_argument("--seed", type=int)
    p.add_argument("--cost", help="roofline | constant:SECONDS | linear:BASE,PREFILL,DECODE,CONTEXT")
    p.add_argument("--profile", help="calibrated profile JSON (from `sim calibrate`)")
    p.add_argument("--closed-loop", type=int, dest="closed_loop_users",
                   help="closed loop with this many users")
    p.add_argument("--think-time", type=float, dest="think_time")
    for key in ("ttft", "itl", "tpot", "e2e"):
        p.add_argument(f"--slo-{key}", type=float, dest=f"slo_{key}", help=f"{key} SLO, seconds")
    p.add_argument("--output", "-o", help="output folder (default sim-out)")
    p.add_argument("--no-plots", action="store_false", dest="plots", default=None)
    p.add_argument("--quiet", "-q", action="store_true")


def settings_from(args) -> dict:
    """The run's settings: ``DEFAULTS``, then the TOML file (unknown keys are an error), then
    every flag given on the command line; ``--slo-*`` flags merge into the ``[slo]`` table."""
    s = dict(DEFAULTS)
    if args.config:
        path = Path(args.config)
        if not path.exists():
            raise SystemExit(f"sim: config file {args.config!r} does not exist")
        with open(path, "rb") as f:
            loaded = tomllib.load(f)
        unknown = set(loaded) - set(DEFAULTS)
        if unknown:
            raise SystemExit(f"sim: {args.config}: unknown setting(s) {sorted(unknown)}; "
                             f"known: {sorted(DEFAULTS)}")
        s.update(loaded)
    for key in DEFAULTS:
        v = getattr(args, key, None)
        if v is not None:
            s[key] = v
    slo = dict(s.get("slo") or {})
    for key in ("ttft", "itl", "tpot", "e2e"):
        v = getattr(args, f"slo_{key}", None)
        if v is not None:
            slo[key] = v
    s["slo"] = slo
    return s


def cost_model_from(s):
    """The cost model the settings name: ``--profile`` (a calibrated profile) wins, else
    ``--cost``: ``roofline`` (``None``: SimConfig builds the roofline of model on gpu),
    ``constant:SECONDS`` or ``linear:BASE,PREFILL,DECODE,CONTEXT``."""
    from ..costs.simple import ConstantCost, LinearCost
    if s["profile"]:
        from ..costs.calibrated import CalibratedCost
        cost = CalibratedCost.from_file(s["profile"])
        note = cost.warning()
        if note:
            print(f"sim run: warning: {note}", file=sys.stderr)
        return cost
    spec = str(s["cost"])
    if spec == "roofline":
        return None  # SimConfig resolves the roofline of model on gpu
    kind, _, rest = spec.partition(":")
    try:
        nums = [float(x) for x in rest.split(",") if x]
    except ValueError:
        raise SystemExit(f"sim: --cost {spec!r}: numbers expected after ':'") from None
    if kind == "constant" and len(nums) == 1:
        return ConstantCost(nums[0])
    if kind == "linear" and 1 <= len(nums) <= 4:
        return LinearCost(*nums)
    raise SystemExit(f"sim: --cost {spec!r}: use roofline, constant:SECONDS or "
                     f"linear:BASE,PREFILL,DECODE,CONTEXT")


def _prefix_caching(s):
    value = s["prefix_caching"]
    if value is None:
        return None
    if value in (False, "off", "false", "none"):
        return False
    return value


def build(s):
    """(workload DataFrame, SimConfig) from settings."""
    import workloads
    from ..engine import SimConfig
    df = workloads.load(s["workload"], n=s["num_requests"], rate=s["rate"], seed=s["seed"])
    closed = (workloads.ClosedLoop(s["closed_loop_users"], s["think_time"])
              if s["closed_loop_users"] else None)
    cfg = SimConfig(scheduler=s["scheduler"], cost_model=cost_model_from(s),
                    max_batch_size=s["max_batch_size"], chunk_size=s["chunk_size"],
                    token_budget=s["token_budget"], kv_blocks=s["kv_blocks"],
                    block_size=s["block_size"], prefix_caching=_prefix_caching(s),
                    model=s["model"], gpu=s["gpu"], tensor_parallel=s["tensor_parallel"], seed=s["seed"], closed_loop=closed)
    return df, cfg


def format_summary(summary) -> str:
    """The summary as the aligned plain-text table ``sim run`` prints (units in the labels)."""
    rows = [("requests", f"{summary['num_finished']:,} finished, {summary['num_rejected']:,} "
                         f"rejected of {summary['num_requests']:,}")]
    for key, label in (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("e2e", "E2E")):
        rows.append((f"{label} (s)", "mean {:.4g}  p50 {:.4g}  p90 {:.4g}  p99 {:.4g}".format(
            summary[f"{key}_mean"], summary[f"{key}_p50"], summary[f"{key}_p90"],
            summary[f"{key}_p99"])))
    rows += [
        ("throughput", f"{summary['request_throughput']:.3g} req/s, "
                       f"{summary['output_token_throughput']:,.0f} output tok/s, "
                       f"{summary['total_token_throughput']:,.0f} total tok/s"),
        ("batch", f"mean {summary['mean_batch_size']:.1f} running, slot utilization "
                  f"{summary['slot_utilization']:.0%}, busy {summary['busy_fraction']:.0%}"),
        ("KV cache", f"{summary['kv_blocks']:,} blocks, mean {summary['kv_usage_mean']:.0%}, "
                     f"max {summary['kv_usage_max']:.0%}, {summary['num_preemptions']:,} "
                     f"preemptions"),
    ]
    if "slo_attainment" in summary:
        rows.append(("SLOs", f"{summary['slo_attainment']:.1%} of requests meet all; goodput "
                             f"{summary['goodput']:.3g} req/s"))
    rows.append(("wall time", f"{summary['wall_seconds']:.2f} s"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def cmd_run(args) -> int:
    """``sim run``: simulate, write the files, print the scenario line and the summary (a
    progress bar on stderr for long runs in a terminal)."""
    from ..engine import run
    s = settings_from(args)
    df, cfg = build(s)
    show_progress = not args.quiet and sys.stderr.isatty() and len(df) > 20_000
    res = run(df, dataclasses.replace(cfg, progress=show_progress))
    summary = res.summary(slo=s["slo"] or None)
    out = Path(s["output"])
    out.mkdir(parents=True, exist_ok=True)
    res.requests.to_parquet(out / "requests.parquet", index=False)
    res.iterations.to_parquet(out / "iterations.parquet", index=False)
    meta = {k: v for k, v in s.items()}
    meta["cost_model"] = repr(cfg.resolved_cost_model())
    meta["kv_blocks"] = res.kv_blocks
    for knob in ("max_batch_size", "block_size", "prefix_caching", "gpu_memory_utilization"):
        meta[knob] = getattr(res.config, knob)  # the values used (a None took the default)
    (out / "summary.json").write_text(json.dumps({"settings": meta, "summary": summary},
                                                 indent=2, default=str))
    written = ["requests.parquet", "iterations.parquet", "summary.json"]
    if s["plots"]:
        from ..results.plots import save_plots
        written += [p.name for p in save_plots(res, out)]
    if not args.quiet:
        if not args.config and all(getattr(args, k, None) is None for k in
                                   ("workload", "model", "gpu", "scheduler")):
            print(f"default scenario: {DEFAULT_SCENARIO}\n")
        print(f"workload {s['workload']}: {len(df):,} requests; scheduler {cfg.policy()!r}; "
              f"cost {meta['cost_model']}\n")
        print(format_summary(summary))
        print(f"\nwrote {', '.join(written)} to {out}/")
    return 0


def add_parser(sub):
    p = sub.add_parser("run", help="simulate a workload (no arguments: the default scenario)")
    _add_run_args(p)
    p.set_defaults(func=cmd_run)
