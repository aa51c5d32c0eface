"""KV budget vs batch size: preemptions, recomputed prefill and latency as the KV pool shrinks.

    python experiments/kv_budget.py [--workload sharegpt] [--rate 4] [-n 2000]
                                    [--kv-blocks 1000,1500,...] [--batch-sizes 8,16,...] [-o DIR]

The same requests (ShareGPT lengths, Poisson arrivals at ``--rate``; Llama-3.1-8B on an H100,
roofline costs, chunked prefill) served with every pair of KV pool size (``kv_blocks``, blocks of
16 tokens; the H100's memory budget would give 28,343) and ``max_batch_size``. For each run:
preemptions (in all and the most of one request), ``prefill_compute_ratio`` (prefill tokens
computed / prompt tokens: a preempted request recomputes its prompt and what it had generated),
TTFT / E2E / ITL, throughput, the mean batch, the batch the pool can hold (``kv_blocks`` / the
mean blocks a request ends with) and the codes of ``Result.diagnose()``'s findings. Writes
``kv_budget.csv`` and ``kv_budget.png`` (four panels against the pool size, one line per batch
size, a cross where the "KV pool too small" finding fires).

What it shows: the batch a scheduler may run is capped by the KV memory, not by
``max_batch_size``: once the pool holds fewer requests than the load keeps running, the newest
requests are preempted and recompute their prefill, throughput falls below the arrival rate and
the queue (TTFT) grows without bound, and ``diagnose()`` says "KV pool too small" with the
cheat sheet's advice — compare KV memory with the budget before raising the batch size: with
a small pool a larger ``max_batch_size`` only adds preemptions.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

import workloads
from sim.engine import run

KV_BLOCKS = (1000, 1500, 2000, 3000, 4000, 6000, 8000)
BATCH_SIZES = (8, 16, 32, 64, 256)
METRICS = ["num_preemptions", "max_preemptions", "prefill_compute_ratio", "ttft_p50", "ttft_p99",
           "e2e_p50", "itl_p99", "request_throughput", "mean_batch_size", "num_rejected"]


def kv_budget(workload="sharegpt", rate=4.0, n=2000, kv_blocks=KV_BLOCKS,
              batch_sizes=BATCH_SIZES, model="llama-3.1-8b", gpu="h100", block_size=16, seed=0):
    """One row per (kv_blocks, max_batch_size): ``METRICS``, ``pool_batch`` and ``findings``
    (the finding codes, space-separated)."""
    df = workloads.load(workload, n=n, rate=rate, seed=seed)
    tokens = df["num_prompt_tokens"] + df["num_output_tokens"]
    mean_blocks = float(np.ceil(tokens / block_size).mean())
    rows = []
    for blocks in kv_blocks:
        for batch in batch_sizes:
            res = run(df, scheduler="chunked", model=model, gpu=gpu, kv_blocks=blocks,
                      block_size=block_size, max_batch_size=batch, seed=seed)
            s = res.summary()
            rows.append({"kv_blocks": blocks, "max_batch_size": batch,
                         "pool_batch": blocks / mean_blocks, **{k: s[k] for k in METRICS},
                         "findings": " ".join(f.code for f in res.diagnose())})
    return pd.DataFrame(rows)


def plot(table, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [("num_preemptions", "preemptions", "linear"),
              ("prefill_compute_ratio", "prefill computed / prompt tokens", "linear"),
              ("ttft_p50", "TTFT P50 (s, log scale)", "log"),
              ("request_throughput", "throughput (req/s)", "linear")]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    for ax, (metric, label, scale) in zip(axes.flat, panels):
        for batch, g in table.groupby("max_batch_size"):
            line = ax.plot(g["kv_blocks"], g[metric], marker="o", ms=3,
                           label=f"max batch {batch}")[0]
            hit = g[g["findings"].str.contains("kv_pool_too_small")]
            ax.scatter(hit["kv_blocks"], hit[metric], marker="x", s=60, color=line.get_color())
        ax.set(ylabel=label, yscale=scale)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("KV pool (blocks of 16 tokens)")
    axes[0, 0].legend(fontsize=8, title="x: 'KV pool too small'", title_fontsize=8)
    fig.suptitle("KV pool size vs max batch size (Llama-3.1-8B, H100, chunked prefill)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="sharegpt")
    p.add_argument("--rate", type=float, default=4.0, help="requests/s (default 4)")
    p.add_argument("-n", type=int, default=2000, help="requests (default 2000)")
    p.add_argument("--kv-blocks", default=",".join(map(str, KV_BLOCKS)))
    p.add_argument("--batch-sizes", default=",".join(map(str, BATCH_SIZES)))
    p.add_argument("-o", "--output", default=None, help="folder for the table and plot")
    a = p.parse_args(argv)
    table = kv_budget(a.workload, a.rate, a.n, [int(x) for x in a.kv_blocks.split(",")],
                      [int(x) for x in a.batch_sizes.split(",")])
    with pd.option_context("display.float_format", "{:.4g}".format, "display.width", 200):
        print(table.to_string(index=False))
    if a.output:
        out = Path(a.output)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "kv_budget.csv", index=False)
        plot(table, out / "kv_budget.png")
    return table


if __name__ == "__main__":
    main()
