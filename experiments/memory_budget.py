"""Which models fit where, at which precision: the memory budget of every model preset on every
GPU preset, at fp16, fp8 and int4 weights (fp16 KV), on one GPU and with tensor parallelism.

    python experiments/memory_budget.py [--tp 1,2,4,8] [-o DIR]

For each (model, GPU, weight precision) the smallest tensor-parallel degree (of ``--tp``) at
which the model fits with room for at least ``--min-seqs`` sequences of ``--seq-len`` tokens in
the KV cache, and the KV blocks per GPU at that degree (vLLM's accounting of the memory the GPU
reports: ``sim.memory_budget``). Nothing is simulated: this is the arithmetic a user does before
buying GPUs. Writes ``memory_budget.csv`` and ``memory_budget.png`` (one panel per precision:
the smallest TP per model and GPU; blank where even the largest TP does not fit).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from sim import get_gpu, gpu_presets, memory_budget, model_presets
from sim.specs.memory import blocks_needed

PRECISIONS = ("fp16", "fp8", "int4")


def table(tps=(1, 2, 4, 8), seq_len=4096, min_seqs=8, models=None, gpus=None):
    rows = []
    for model in models or sorted(model_presets()):
        for gpu in gpus or sorted(gpu_presets()):
            for w in PRECISIONS:
                row = {"model": model, "gpu": gpu, "weight_dtype": w, "min_tp": np.nan,
                       "kv_blocks": np.nan, "seqs": np.nan}
                for tp in tps:
                    try:
                        b = memory_budget(model, get_gpu(gpu).memory_gb, weight_dtype=w,
                                          tensor_parallel=tp)
                    except ValueError:  # a TP the model's heads do not split into
                        continue
                    seqs = b.kv_blocks // blocks_needed(seq_len, b.block_size) if b.fits else 0
                    if seqs >= min_seqs:
                        row |= {"min_tp": tp, "kv_blocks": b.kv_blocks, "seqs": seqs}
                        break
                rows.append(row)
    return pd.DataFrame(rows)


def plot(t, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models, gpus = sorted(t["model"].unique()), sorted(t["gpu"].unique())
    fig, axes = plt.subplots(1, len(PRECISIONS), figsize=(5 * len(PRECISIONS), 0.32 * len(models)
                                                          + 1.8), sharey=True)
    for ax, w in zip(axes, PRECISIONS):
        grid = (t[t["weight_dtype"] == w].pivot(index="model", columns="gpu", values="min_tp")
                .reindex(index=models, columns=gpus))
        ax.imshow(np.log2(grid.to_numpy(dtype=float)), cmap="viridis_r", vmin=0, vmax=3,
                  aspect="auto")
        for i in range(len(models)):
            for j in range(len(gpus)):
                v = grid.iloc[i, j]
                ax.text(j, i, "-" if np.isnan(v) else f"{int(v)}", ha="center", va="center",
                        fontsize=7, color="w" if not np.isnan(v) and v >= 4 else "k")
        ax.set(title=f"{w} weights: smallest TP", xticks=range(len(gpus)), xlabel="GPU")
        ax.set_xticklabels(gpus, rotation=45, ha="right", fontsize=8)
    axes[0].set(yticks=range(len(models)))
    axes[0].set_yticklabels(models, fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", default="1,2,4,8", help="tensor-parallel degrees to try")
    p.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence (4096)")
    p.add_argument("--min-seqs", type=int, default=8, help="sequences the KV cache must hold")
    p.add_argument("-o", "--output", default=None, help="folder for the table and the plot")
    a = p.parse_args(argv)
    t = table(tuple(int(x) for x in a.tp.split(",")), a.seq_len, a.min_seqs)
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(t.pivot_table(index="model", columns=["weight_dtype", "gpu"], values="min_tp")
              .to_string())
    if a.output:
        out = Path(a.output)
        out.mkdir(parents=True, exist_ok=True)
        t.to_csv(out / "memory_budget.csv", index=False)
        plot(t, out / "memory_budget.png",
             f"smallest tensor-parallel degree holding {a.min_seqs} x {a.seq_len}-token "
             f"sequences (vLLM accounting; '-': not with TP <= {a.tp.split(',')[-1]})")
    return t


if __name__ == "__main__":
    main()
