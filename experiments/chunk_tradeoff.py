"""Chunked prefill's trade-off: what each chunk size buys in inter-token latency and costs in TTFT.

    python experiments/chunk_tradeoff.py [--workload azure-conv] [--rate 12] [-n 4000]
                                         [--chunks 128,256,...,8192] [-o DIR]

One sweep (``sim.sweep``, local processes) of the ``chunked`` scheduler's ``chunk_size`` (the
per-iteration token budget, decodes included) over the same real trace (Azure conv, time-scaled
to ``--rate``; Llama-3.1-8B on an H100, roofline costs, max batch 128 so that every chunk of
128 tokens or more can hold a token for each running decode). Writes ``chunk_tradeoff.csv`` and
``chunk_tradeoff.png`` (P99 TTFT against P99 ITL, one point per chunk size:
``plot_chunk_tradeoff``).

What it shows: a long prompt prefilled in one iteration stalls every running decode for that
iteration, so P99 ITL grows with the chunk size; a small chunk keeps every gap short but spreads
each prompt over many iterations (each paying the iteration's fixed cost), so TTFT grows as the
chunk shrinks; and a chunk too small for the load lowers throughput below the arrival rate and
the queue (TTFT) runs away.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import workloads
from sim import SimConfig, sweep

CHUNKS = (128, 256, 512, 1024, 2048, 4096, 8192)
COLUMNS = ["chunk_size", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "tpot_p99",
           "request_throughput", "mean_batch_size", "error"]


def tradeoff(workload="azure-conv", rate=12.0, n=4000, chunks=CHUNKS, model="llama-3.1-8b",
             gpu="h100", max_batch_size=128, workers=None, seed=0):
    """One row per chunk size (``COLUMNS``), in chunk-size order."""
    df = workloads.load(workload, n=n, rate=rate, seed=seed)
    base = SimConfig(scheduler="chunked", model=model, gpu=gpu, max_batch_size=max_batch_size,
                     seed=seed)
    table = sweep(df, {"chunk_size": list(chunks)}, base=base, workers=workers, progress=False)
    return table[COLUMNS].sort_values("chunk_size", ignore_index=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="azure-conv")
    p.add_argument("--rate", type=float, default=12.0, help="requests/s (default 12)")
    p.add_argument("-n", type=int, default=4000, help="requests (default 4000)")
    p.add_argument("--chunks", default=",".join(map(str, CHUNKS)),
                   help="comma-separated chunk sizes in tokens")
    p.add_argument("--workers", type=int, default=None, help="local processes (default: CPUs)")
    p.add_argument("-o", "--output", default=None, help="folder for the table and plot")
    a = p.parse_args(argv)
    chunks = [int(c) for c in a.chunks.split(",")]
    table = tradeoff(a.workload, a.rate, a.n, chunks, workers=a.workers)
    with pd.option_context("display.float_format", "{:.4g}".format, "display.width", 160):
        print(table.to_string(index=False))
    if a.output:
        from sim.results.plots_sweep import plot_chunk_tradeoff
        out = Path(a.output)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "chunk_tradeoff.csv", index=False)
        plot_chunk_tradeoff(table, out / "chunk_tradeoff.png")
    return table


if __name__ == "__main__":
    main()
