"""Precision trade-off: memory, latency and throughput of one workload across weight and KV
precisions, on one GPU and with tensor parallelism.

    python experiments/precision_tradeoff.py [--model llama-3.1-70b] [--gpu h100] [-n 400]
                                             [--rate 2] [-o DIR]

For each (weight_dtype, kv_dtype, tensor_parallel) the memory budget (weights per GPU, KV
blocks) and a run of the same requests (ShareGPT lengths, Poisson arrivals) on the roofline of
that precision: TTFT, TPOT, throughput. A setting that does not fit is a row with the budget's
advice instead of numbers (the 70B model does not fit one 80 GB GPU at fp16). Writes
``precision.csv`` and ``precision.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import workloads
from sim import SimConfig, get_gpu, memory_budget
from sim.engine import run

SETTINGS = [("fp16", "fp16", 1), ("fp8", "fp16", 1), ("fp8", "fp8", 1), ("int4", "fp16", 1),
            ("int4", "fp8", 1), ("fp16", "fp16", 2), ("fp8", "fp8", 2)]
GiB = 2 ** 30


def tradeoff(model="llama-3.1-70b", gpu="h100", n=400, rate=2.0, seed=0, settings=SETTINGS):
    df = workloads.load("sharegpt", n=n, rate=rate, seed=seed)
    rows = []
    for w, kv, tp in settings:
        b = memory_budget(model, get_gpu(gpu).memory_gb, weight_dtype=w, kv_dtype=kv,
                          tensor_parallel=tp)
        row = {"weight_dtype": w, "kv_dtype": kv, "tensor_parallel": tp,
               "weights_gib_per_gpu": b.weights_bytes / tp / GiB, "kv_blocks": b.kv_blocks,
               "fits": b.fits}
        if b.fits:
            s = run(df, SimConfig(model=model, gpu=gpu, weight_dtype=w, kv_dtype=kv,
                                  tensor_parallel=tp, seed=seed)).summary()
            row |= {k: s[k] for k in ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99",
                                      "output_token_throughput", "num_preemptions")}
            row["output_tok_s_per_gpu"] = s["output_token_throughput"] / tp
        else:
            row["advice"] = b.advice
        rows.append(row)
    return pd.DataFrame(rows)


def plot(table, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = table[table["fits"]]
    labels = [f"w {r.weight_dtype} / kv {r.kv_dtype} / tp{r.tensor_parallel}"
              for r in t.itertuples()]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, col, what in zip(axes, ("kv_blocks", "tpot_p50", "output_tok_s_per_gpu"),
                             ("KV blocks (pool)", "TPOT P50 (s)", "output tokens/s per GPU")):
        ax.barh(labels, t[col])
        ax.set(xlabel=what)
        ax.invert_yaxis()
    for ax in axes[1:]:
        ax.set_yticklabels([])
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3.1-70b")
    p.add_argument("--gpu", default="h100")
    p.add_argument("-n", type=int, default=400, help="requests (default 400)")
    p.add_argument("--rate", type=float, default=2.0, help="requests/s (default 2)")
    p.add_argument("-o", "--output", default=None, help="folder for the table and the plot")
    a = p.parse_args(argv)
    table = tradeoff(a.model, a.gpu, a.n, a.rate)
    with pd.option_context("display.float_format", "{:.4g}".format, "display.width", 220,
                           "display.max_colwidth", 60):
        print(table.drop(columns=["advice"], errors="ignore").to_string(index=False))
    for r in table[~table["fits"]].itertuples():
        print(f"w {r.weight_dtype} / kv {r.kv_dtype} / tp{r.tensor_parallel}: {r.advice}")
    if a.output:
        out = Path(a.output)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "precision.csv", index=False)
        plot(table, out / "precision.png",
             f"{a.model} on {a.gpu}: {a.n} ShareGPT requests at {a.rate:g} req/s (roofline)")
    return table


if __name__ == "__main__":
    main()
