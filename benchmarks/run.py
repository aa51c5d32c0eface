"""The performance scenarios, each in a fresh process: requests per wall-second, wall time,
peak memory, a checksum of the results, and the ratio to a bare SimPy loop of as many events
timed in the same process (this machine's speed drifts; ratios do not).

    python benchmarks/run.py [--scenario NAME ...] [--scale 1.0] [--json]

Scenarios (``--scale`` multiplies the request counts; 0.1 for a quick look):

1. ``chunked`` - 100k requests, lognormal prompts (mean ~1,000) and outputs (mean ~250),
   saturated, max batch 256, chunked prefill, KV blocks from the memory budget (the engine
   benchmark's first case, ``benchmarks/bench_engine.py``);
2. ``vllm_prefix_spec`` - the ``vllm`` preset with prefix caching on a shared-prefix workload
   (16 system prompts of 2,000 tokens) and speculative decoding (k = 4, acceptance 0.8);
3. ``mooncake`` - the whole Mooncake conversation trace with prefix caching (``vllm``);
4. ``sim_run_1m`` - 1,000,000 requests of scenario 1 end to end through ``sim run`` (a parquet
   workload file in, parquet / JSON out: figures are written only when asked); wall and peak
   memory of the whole command;
5. ``cluster`` - scenario 1 over 4 replicas behind ``least_outstanding``, and ``disaggregated``
   - scenario 1 (a tenth of it) on 3 prefill + 1 decode replicas.
6. ``sglang`` - scenario 1 with the ``sglang`` preset (its defaults: max batch 1,024, the
   admission reservation over every running request's outputs left): guards the reservation's
   O(prefilling) bookkeeping (a scan of the running set cost 1.8 ms per iteration at 790).

Two references, timed in the same process: the bare SimPy loop (one timeout per iteration and
nothing else: the floor of any one-event-per-iteration engine; ``ratio_to_bare_simpy``), and for
``chunked`` the plain per-request simulator (``bench_engine.per_request_reference``: one object
per request, a pass over the running requests every iteration; ``ratio_to_per_request_loop``,
above 1 when the engine is faster).

The checksum (SHA-1 of the requests' finish times and the iteration durations) is the same on
every run of a scenario: the engine is deterministic.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (this folder is on the path when run as a script)
from bench_engine import bare_simpy, per_request_reference, workload

HERE = Path(__file__).resolve().parent
SCENARIOS = ("chunked", "vllm_prefix_spec", "mooncake", "sim_run_1m", "cluster",
             "disaggregated", "sglang")


def _checksum(res) -> str:
    h = hashlib.sha1(res.requests["finish_time"].to_numpy().tobytes())
    h.update(res.iterations["duration"].to_numpy().tobytes())
    return h.hexdigest()[:12]


def _engine(name, scale):
    import numpy as np
    import workloads as wl
    from sim import Disaggregation, SpeculativeConfig
    from sim.engine import run
    n = max(1000, int(100_000 * scale))
    kw = dict(model="llama-3.1-8b", gpu="h100", max_batch_size=256)
    if name == "chunked":
        df = workload(n)
        kw |= dict(scheduler="chunked")
    elif name == "vllm_prefix_spec":
        df = wl.shared_prefix(n, n_groups=16, system_prompt_tokens=2000,
                              user_tokens=wl.LogNormal(200, 1.0, max_tokens=4000),
                              output=wl.LogNormal(250, 1.0, max_tokens=4096), rate=1000.0)
        kw = dict(scheduler="vllm", model="llama-3.1-8b", gpu="h100",
                  speculative=SpeculativeConfig(num_speculative_tokens=4, acceptance_rate=0.8,
                                                draft_cost_ratio=0.05))
    elif name == "mooncake":
        df = wl.load("mooncake-conversation")
        if scale < 1:
            df = df.iloc[:max(100, int(len(df) * scale))]
        kw = dict(scheduler="vllm", model="llama-3.1-8b", gpu="h100")
    elif name == "cluster":
        df = workload(n)
        kw |= dict(scheduler="chunked", replicas=4, router="least_outstanding")
    elif name == "disaggregated":
        df = workload(max(1000, n // 10))
        kw |= dict(scheduler="chunked",
                   disaggregation=Disaggregation(prefill_replicas=3, decode_replicas=1))
    elif name == "sglang":
        df = workload(n)
        kw = dict(scheduler="sglang", model="llama-3.1-8b", gpu="h100")
    else:
        raise ValueError(name)
    t = time.perf_counter()
    res = run(df, **kw)
    wall = time.perf_counter() - t
    iters = len(res.iterations)
    bare = bare_simpy(iters)
    extra = {}
    if name == "chunked":  # the plain per-request simulator, same workload (O(running) a step)
        ref, ref_iters = per_request_reference(df)
        extra = {"per_request_loop_s": round(ref, 3), "per_request_loop_iterations": ref_iters,
                 "ratio_to_per_request_loop": round(ref / wall, 2)}
    return {"requests": len(df), "iterations": iters, "wall_s": round(wall, 3),
            "requests_per_s": round(len(df) / wall), "ratio_to_bare_simpy": round(bare / wall, 4),
            **extra,
            "checksum": _checksum(res),
            "finished": int((res.requests["status"] == "finished").sum()),
            "mean_acceptance_length": res.summary().get("spec_mean_acceptance_length"),
            "prefix_hit_rate": round(float(np.nan_to_num(res.summary()["prefix_hit_rate"])), 4)}


def _sim_run(scale):
    n = max(1000, int(1_000_000 * scale))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.parquet"
        workload(n).to_parquet(path)
        cmd = [sys.executable, "-c", "import sys; from sim.cli import main; sys.exit(main())",
               "run", "-w", str(path), "-o", str(Path(tmp) / "out"), "-q"]
        t = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        subprocess.run(cmd, check=True)
        wall = time.perf_counter() - t
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        summary = json.loads((Path(tmp) / "out" / "summary.json").read_text())
    events = summary["summary"]["num_iterations"]
    bare = bare_simpy(events)
    return {"requests": n, "iterations": events, "wall_s": round(wall, 3),
            "requests_per_s": round(n / wall), "ratio_to_bare_simpy": round(bare / wall, 4),
            "peak_rss_mb": round(max(peak, before) / 1024),
            "checksum": hashlib.sha1(json.dumps(summary["summary"]["e2e_p99"]).encode())
            .hexdigest()[:12]}


def one(name, scale) -> dict:
    """Run scenario ``name`` in this process (call it in a fresh one for its peak memory)."""
    out = _sim_run(scale) if name == "sim_run_1m" else _engine(name, scale)
    if "peak_rss_mb" not in out:
        out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return {"scenario": name, **out}


def _positive(text) -> float:
    """``--scale``: a positive number (the request counts it multiplies have a floor of 1,000,
    which would otherwise hide a zero or negative scale)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", nargs="*", choices=SCENARIOS, default=list(SCENARIOS))
    p.add_argument("--scale", type=_positive, default=1.0, help="multiplies the request counts")
    p.add_argument("--json", action="store_true", help="print one JSON list")
    p.add_argument("--inside", help=argparse.SUPPRESS)  # run one scenario in this process
    a = p.parse_args(argv)
    if a.inside:
        print(json.dumps(one(a.inside, a.scale)))
        return None
    rows = []
    for name in a.scenario:
        done = subprocess.run([sys.executable, __file__, "--inside", name, "--scale",
                               str(a.scale)], check=True, capture_output=True, text=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        if not a.json:
            print(rows[-1], flush=True)
    if a.json:
        print(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
