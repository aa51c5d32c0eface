"""Result hashes of 31 small configurations spanning the engine's features: a refactor that
must not change results (a module moved, a loop restructured) keeps every hash.

    python benchmarks/hashes.py                 # print name -> hash
    python benchmarks/hashes.py --write FILE    # store them (JSON)
    python benchmarks/hashes.py --check FILE    # exit 1 naming every configuration that differs

A hash covers every request's times, token counts, preemptions and rejection reason, every
iteration's columns, and the summary (wall-clock keys left out). The whole set runs in a few
seconds. ``benchmarks/hashes.json`` holds the hashes of the commit that last changed results
on purpose; dot products are summed in a fixed order (``sim.numerics``), not by the CPU's BLAS
kernel.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys

import numpy as np
import pandas as pd

import sim
import workloads as wl

WALL_KEYS = ("wall", "sim_speed", "requests_per_wall")


def _summary_bytes(summary: dict) -> bytes:
    out = []
    for key in sorted(summary):
        if any(w in key for w in WALL_KEYS):
            continue
        value = summary[key]
        if isinstance(value, float) and math.isnan(value):
            value = "nan"
        out.append(f"{key}={value!r}")
    return "\n".join(out).encode()


def digest(res) -> str:
    h = hashlib.sha1()
    for frame in (res.requests, res.iterations):
        for col in sorted(frame.columns):
            values = frame[col]
            if values.dtype.kind in "fiub":
                h.update(np.ascontiguousarray(values.to_numpy()).tobytes())
            else:
                h.update("\x00".join(map(str, values.tolist())).encode())
            h.update(col.encode())
    h.update(_summary_bytes(res.summary()))
    return h.hexdigest()[:16]


def _lengths(n, seed, prompt=600, output=150):
    return wl.synthetic(n, rate=20.0, prompt=wl.LogNormal(prompt, 0.8, max_tokens=6000),
                        output=wl.LogNormal(output, 0.8, max_tokens=2000), seed=seed)


def configurations():
    """name -> (workload, keyword settings of sim.run)."""
    base = _lengths(300, 1)
    burst = _lengths(300, 2).assign(arrival_time=0.0)
    shared = wl.shared_prefix(300, n_groups=4, system_prompt_tokens=1024,
                              user_tokens=wl.LogNormal(200, 0.5, max_tokens=2000),
                              output=wl.LogNormal(120, 0.5, max_tokens=1000), rate=15.0, seed=3)
    mooncake = wl.load("mooncake-conversation").head(300)
    convs = wl.multi_turn(40, turns=4, user_tokens=wl.LogNormal(300, 0.5, max_tokens=3000),
                          output=wl.LogNormal(100, 0.5, max_tokens=800), rate=2.0, seed=4)
    azure = wl.load("azure-code").head(400)
    spec = sim.SpeculativeConfig(num_speculative_tokens=4, acceptance_rate=0.8,
                                 draft_cost_ratio=0.05)
    c = {
        "static": (base, dict(scheduler="static", max_batch_size=32)),
        "continuous": (base, dict(scheduler="continuous", max_batch_size=64)),
        "chunked": (base, dict(scheduler="chunked")),
        "chunked_small_pool": (burst, dict(scheduler="chunked", kv_blocks=400)),
        "continuous_small_pool": (burst, dict(scheduler="continuous", kv_blocks=400)),
        "vllm": (base, dict(scheduler="vllm")),
        "vllm_prefix": (shared, dict(scheduler="vllm")),
        "vllm_prefix_small": (mooncake, dict(scheduler="vllm", kv_blocks=3000)),
        "sarathi": (base, dict(scheduler="sarathi")),
        "orca": (base, dict(scheduler="orca")),
        "sglang": (shared, dict(scheduler="sglang")),
        "sglang_small": (burst, dict(scheduler="sglang", kv_blocks=6000)),
        "tensorrt_llm": (base, dict(scheduler="tensorrt-llm")),
        "tensorrt_llm_max_util": (burst, dict(scheduler="tensorrt-llm", kv_blocks=300,
                                              capacity_scheduler_policy="max_utilization")),
        "tensorrt_llm_chunked": (burst, dict(scheduler="tensorrt-llm", enable_chunked_context=True,
                                            context_chunking_policy="equal_progress")),
        "speculative": (base, dict(scheduler="chunked", speculative=spec, seed=7)),
        "speculative_vllm": (shared, dict(scheduler="vllm", speculative=spec, seed=8)),
        "fp8": (base, dict(scheduler="chunked", model="llama-3.1-70b", tensor_parallel=2,
                           weight_dtype="fp8", kv_dtype="fp8")),
        "a100_int4": (base, dict(scheduler="vllm", gpu="a100", weight_dtype="int4")),
        "moe": (base, dict(scheduler="tensorrt-llm", model="mixtral-8x7b", tensor_parallel=2)),
        "cluster_rr": (azure, dict(scheduler="chunked", replicas=3)),
        "cluster_lo": (azure, dict(scheduler="vllm", replicas=3, router="least_outstanding")),
        "cluster_affinity": (shared, dict(scheduler="vllm", replicas=2,
                                          router="prefix_affinity")),
        "cluster_cache_aware": (shared, dict(scheduler="sglang", replicas=2,
                                             router="cache_aware")),
        "disaggregated": (azure, dict(scheduler="vllm", disaggregation=sim.Disaggregation(
            prefill_replicas=2, decode_replicas=1))),
        "disaggregated_link": (base, dict(scheduler="chunked", disaggregation=sim.Disaggregation(
            1, 1, link_bandwidth_gbps=5.0, link_latency_s=0.001))),
        "closed_loop": (base, dict(scheduler="chunked", closed_loop=wl.ClosedLoop(16, 0.5))),
        "closed_loop_sessions": (convs, dict(scheduler="vllm", closed_loop=wl.ClosedLoop(8))),
        "request_path": (base, dict(scheduler="vllm", request_path=sim.RequestPath(
            in_s=0.002, per_prompt_token_s=1e-6, out_s=0.0005))),
        "max_model_len": (base, dict(scheduler="chunked", max_model_len=1024)),
        "linear_cost": (base, dict(scheduler="continuous",
                                   cost_model=sim.LinearCost(0.005, 1e-4, 2e-5))),
    }
    return c


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write")
    p.add_argument("--check")
    p.add_argument("--only", nargs="*")
    args = p.parse_args(argv)
    got = {}
    for name, (df, kw) in configurations().items():
        if args.only and name not in args.only:
            continue
        got[name] = digest(sim.run(df, **kw))
        print(f"{name:24s} {got[name]}", flush=True)
    if args.write:
        with open(args.write, "w") as f:
            json.dump(got, f, indent=1, sort_keys=True)
    if args.check:
        with open(args.check) as f:
            want = json.load(f)
        bad = [n for n in got if want.get(n) != got[n]]
        if bad:
            print("differ:", ", ".join(bad), file=sys.stderr)
            return 1
        print(f"all {len(got)} identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
