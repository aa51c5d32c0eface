"""Engine presets side by side on a real trace with prefix sharing: what each engine's rules give.

    python experiments/compare_presets.py [--workload mooncake-conversation] [--rate 0.5]
                                          [-n 1000] [-o DIR]

Runs the presets (``vllm``, ``sarathi``, ``orca``, ``sglang``, ``tensorrt-llm``) and our simple ``chunked`` and
``continuous`` policies on the same requests (Mooncake's multi-turn conversation trace, whose
``hash_ids`` say which prompt blocks repeat), plus ``vllm`` with its prefix cache turned off.
Each preset brings its engine's defaults (batch size, token budget, block size, prefix caching);
the table shows the latency each gives, its prefix-cache hit rate, and how much prefill it
recomputed after preemptions. Writes ``presets.csv`` and ``presets_latency_cdfs.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import workloads
from sim.engine import run

COLUMNS = ["ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "e2e_p50", "request_throughput",
           "prefix_hit_rate", "prefill_compute_ratio", "num_preemptions", "max_preemptions"]
RUNS = {  # label -> SimConfig overrides
    "vllm": {"scheduler": "vllm"},
    "vllm (no prefix cache)": {"scheduler": "vllm", "prefix_caching": False},
    "sarathi": {"scheduler": "sarathi"},
    "orca": {"scheduler": "orca"},
    "sglang": {"scheduler": "sglang"},
    "tensorrt-llm": {"scheduler": "tensorrt-llm"},
    "chunked": {"scheduler": "chunked"},
    "continuous": {"scheduler": "continuous"},
}


def compare(workload="mooncake-conversation", rate=0.5, n=1000, model="llama-3.1-8b",
            gpu="h100", seed=0):
    df = workloads.load(workload, n=n, rate=rate, seed=seed)
    results = {label: run(df, model=model, gpu=gpu, seed=seed, **kw) for label, kw in RUNS.items()}
    table = pd.DataFrame({k: {c: r.summary()[c] for c in COLUMNS} for k, r in results.items()}).T
    return table, results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="mooncake-conversation")
    p.add_argument("--rate", type=float, default=0.5, help="requests/s (default 0.5)")
    p.add_argument("-n", type=int, default=1000, help="requests (default 1000)")
    p.add_argument("-o", "--output", default=None, help="folder for the table and plot")
    a = p.parse_args(argv)
    table, results = compare(a.workload, a.rate, a.n)
    with pd.option_context("display.float_format", "{:.4g}".format, "display.width", 200):
        print(table.to_string())
    if a.output:
        from sim.results.plots import plot_latencies
        out = Path(a.output)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "presets.csv")
        plot_latencies(results, out / "presets_latency_cdfs.png")
    return table


if __name__ == "__main__":
    main()
