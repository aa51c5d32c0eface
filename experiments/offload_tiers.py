"""KV offload on and off on the Mooncake conversation trace: TTFT, hits and throughput
against the offload tier's size and read bandwidth.

    python experiments/offload_tiers.py [-n 300] [--rate 0.5] [--kv-blocks 20000]
                                        [--sizes 0,50,200,800,2000] [--bandwidths 50,5,1]

One vLLM replica (Llama-3.1-8B on an H100, roofline costs, block prefix cache, a pool of
``--kv-blocks`` blocks) under a one-tier write-back chain (``sim.KVTierChain``: a tier of
each size, per GPU, at each read bandwidth; size 0 is no tier, bit-identical). Prints one
row per (size, bandwidth): prefix and tier hit rates, mean and P99 TTFT, its split into
queue / load / prefill, and request throughput.

What it shows: the tier's hits grow with its size until it holds every block the trace ever
evicts (then the hit rate is an unbounded GPU pool's); their gain is the prefill they skip,
so TTFT falls with size at PCIe-class bandwidth, while at a low enough bandwidth loading a
block costs more than prefilling it and the same hits make TTFT worse than no tier.
"""

from __future__ import annotations

import argparse

import pandas as pd

import sim
import workloads

COLUMNS = ["size_gb", "read_gbps", "prefix_hit_rate", "offload_hit_rate", "ttft_mean",
           "ttft_p99", "ttft_queue_mean", "ttft_load_mean", "ttft_prefill_mean",
           "request_throughput"]


def offload_sweep(n=300, rate=0.5, kv_blocks=20_000, sizes=(0, 50, 200, 800, 2000),
                  bandwidths=(50.0, 5.0, 1.0)) -> pd.DataFrame:
    """One row per (size, bandwidth) (``COLUMNS``); size 0 once (no tier)."""
    df = workloads.load("mooncake-conversation", n=n, rate=rate)
    rows = []
    for size in sizes:
        for bw in bandwidths[:1] if not size else bandwidths:
            tier = sim.KVTierChain((sim.KVTier(size, read_gbps=bw),))
            s = sim.run(df, scheduler="vllm", model="llama-3.1-8b", gpu="h100",
                        kv_blocks=kv_blocks, kv_offload=tier).summary()
            rows.append({"size_gb": size, "read_gbps": bw if size else float("nan"),
                         **{k: s[k] for k in COLUMNS[2:]}})
    return pd.DataFrame(rows, columns=COLUMNS)


def _floats(text):
    return tuple(float(x) for x in text.split(","))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=300)
    p.add_argument("--rate", type=float, default=0.5)
    p.add_argument("--kv-blocks", type=int, default=20_000)
    p.add_argument("--sizes", type=_floats, default=(0, 50, 200, 800, 2000))
    p.add_argument("--bandwidths", type=_floats, default=(50.0, 5.0, 1.0))
    a = p.parse_args(argv)
    table = offload_sweep(a.n, a.rate, a.kv_blocks, a.sizes, a.bandwidths)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))


if __name__ == "__main__":
    main()
