"""Planner speed: a plan over >= 200 candidate configurations on 2 worker processes.

    python benchmarks/bench_plan.py [--workers 2] [--requests 400]

Llama-3.1-8B at a target 10 req/s, TTFT <= 1 s and TPOT <= 50 ms for 99 % of requests (TTFT
P99 <= 1 s), a ShareGPT-like synthetic workload (lognormal prompts mean 400 tokens, outputs mean
200, CV 0.7, seed 3); the space: 5 GPU types x TP 1, 2, 4 x fp16/fp8 weights x the vLLM and
SGLang presets x replicas 1, 2, 4 x aggregated, 1:1 and 1:2 prefill:decode (540 candidates,
some duplicates: a split's pools are its fleet). Reports the wall time, how many candidates
each stage pruned, how many were simulated and how many capacity searches ran (the Pareto
frontier's); the goal: <= 120 s on 2 cores. ``--model llama-3.1-70b``: a model the memory
fit and the roofline bound prune more of.
"""

from __future__ import annotations

import argparse
import json
import time

import workloads as wl
from sim import SimConfig
from sim.tools.plan import plan

SLO, ATTAINMENT, RATE = {"ttft": 1.0, "tpot": 0.05}, 0.99, 10.0
SPACE = {"gpu": ["a100", "h100", "h200", "l40s", "mi300x"], "tensor_parallel": [1, 2, 4],
         "weight_dtype": ["fp16", "fp8"], "scheduler": ["vllm", "sglang"],
         "replicas": [1, 2, 4], "split": ["aggregated", "1:1", "1:2"]}


def measure(workers=2, requests=400, rate=RATE, model="llama-3.1-8b") -> dict:
    df = wl.synthetic(requests, rate=rate, prompt=wl.LogNormal(400, 0.7, max_tokens=4000),
                      output=wl.LogNormal(200, 0.7, max_tokens=1000), seed=3)
    t = time.perf_counter()
    table = plan(df, SLO, attainment=ATTAINMENT, rate=rate, space=SPACE,
                 base=SimConfig(model=model), workers=workers, tol=0.05)
    wall = time.perf_counter() - t
    best = table.iloc[0]
    return {"candidates": len(table), "wall_s": round(wall, 1),
            "pruned_before_simulating": table.attrs["pruned_before"],
            "simulated": table.attrs["simulated"],
            "capacity_searches": table.attrs["capacity_searches"],
            "by_stage": {k: int(v) for k, v in table["stage"].replace("", "ranked")
                         .value_counts().items()},
            "winner": {k: (best[k].item() if hasattr(best[k], "item") else best[k])
                       for k in [*SPACE, "usd_per_million_output_tokens", "ttft_p99",
                                 "max_rate"]}}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rate", type=float, default=RATE, help="the target, req/s (default 10)")
    ap.add_argument("--model", default="llama-3.1-8b")
    a = ap.parse_args()
    print(json.dumps(measure(a.workers, a.requests, a.rate, a.model), indent=1))
