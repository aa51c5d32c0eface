"""Capacity per GPU type: the highest request rate each GPU preset serves within one SLO pair.

    python experiments/capacity_per_gpu.py [--model llama-3.1-8b] [--gpus a100,h100,...]
                                           [-n 2000] [--slo-ttft 2] [--slo-itl 0.1]
                                           [--price h100=USD ...] [-o DIR]

For each GPU preset (``a100``, ``h100``, ``h200``, ``l40s``, ``b200``, ``mi300x``; roofline
costs from each preset's peak FLOPs and bandwidth, the KV pool from its memory budget) the
model's memory budget first: where the weights leave no room for a KV block the row says so,
with the budget's advice, and nothing runs. Where it fits, ``sim.max_rate`` finds the highest
rate of the same requests (ShareGPT lengths, time-scaled) at which 90 % of them meet both SLOs
(TTFT and every inter-token gap), and the goodput per GPU there. With ``--price GPU=USD`` (a
price per GPU-hour; none is shipped, bring your own) the row adds requests per dollar and
dollars per million requests, so GPUs compare per unit of cost. Writes ``capacity_per_gpu.csv``
and ``capacity_per_gpu.png`` (goodput per GPU, and per dollar when prices are given).

What it shows: capacity under a latency SLO follows the GPU's memory bandwidth and KV pool, not
its name: on Llama-3.1-8B the B200 serves about twice an H100's rate and the L40S under a third of
it; a model too big for a GPU is a row of advice (quantize, or tensor parallelism), not a crash.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import workloads
from sim import SimConfig, get_gpu, max_rate, memory_budget

GPUS = ("a100", "h100", "h200", "l40s", "b200", "mi300x")
COLUMNS = ["gpu", "fits", "kv_blocks", "max_rate", "goodput_per_gpu", "ttft_p99", "itl_p99",
           "slo_attainment", "rates_tried", "advice"]


def capacity_per_gpu(model="llama-3.1-8b", gpus=GPUS, n=2000, slo=None, attainment=0.9,
                     tensor_parallel=1, scheduler="chunked", workload="sharegpt", tol=0.01,
                     prices=None, seed=0):
    """One row per GPU (``COLUMNS``; with ``prices``, a dict GPU -> USD per GPU-hour, also
    ``usd_per_gpu_hour``, ``requests_per_usd`` and ``usd_per_million_requests``)."""
    slo = slo or {"ttft": 2.0, "itl": 0.1}
    df = workloads.load(workload, n=n, rate=4.0, seed=seed)
    rows = []
    for gpu in gpus:
        b = memory_budget(model, get_gpu(gpu).memory_gb, tensor_parallel=tensor_parallel)
        row = {"gpu": gpu, "fits": b.fits}
        if b.fits:
            config = SimConfig(model=model, gpu=gpu, tensor_parallel=tensor_parallel,
                               scheduler=scheduler, seed=seed)
            cap = max_rate(df, slo, attainment=attainment, config=config, tol=tol)
            s = cap.summary
            row |= {"kv_blocks": s.get("kv_blocks"), "max_rate": cap.rate,
                    "goodput_per_gpu": cap.goodput_per_gpu, "ttft_p99": s.get("ttft_p99"),
                    "itl_p99": s.get("itl_p99"), "slo_attainment": s.get("slo_attainment"),
                    "rates_tried": len(cap.points), "advice": ""}
        else:
            row["advice"] = b.advice
        rows.append(row)
    table = pd.DataFrame(rows).reindex(columns=COLUMNS)
    if prices:
        table["usd_per_gpu_hour"] = table["gpu"].map(prices)
        table["requests_per_usd"] = table["goodput_per_gpu"] * 3600 / table["usd_per_gpu_hour"]
        table["usd_per_million_requests"] = 1e6 / table["requests_per_usd"]
    return table


def plot(table, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = table[table["fits"]]
    priced = "requests_per_usd" in t and t["requests_per_usd"].notna().any()
    panels = [("goodput_per_gpu", "goodput per GPU (req/s within the SLOs)")]
    if priced:
        panels.append(("requests_per_usd", "requests per USD (within the SLOs)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, (col, label) in zip(axes[0], panels):
        part = t[t[col].notna()]
        ax.barh(part["gpu"], part[col])
        ax.set(xlabel=label)
        ax.invert_yaxis()
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _price(text):
    gpu, sep, usd = text.partition("=")
    try:
        value = float(usd)
    except ValueError:
        value = float("nan")
    if not sep or not gpu or not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"--price must be GPU=USD per GPU-hour with USD > 0, got {text!r}")
    return gpu.strip().lower(), value


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--gpus", default=",".join(GPUS), help="comma-separated GPU presets")
    p.add_argument("--tensor-parallel", type=int, default=1, help="GPUs per replica")
    p.add_argument("-n", type=int, default=2000, help="requests per trial (default 2000)")
    p.add_argument("--slo-ttft", type=float, default=2.0, help="TTFT limit, s (default 2)")
    p.add_argument("--slo-itl", type=float, default=0.1, help="ITL limit, s (default 0.1)")
    p.add_argument("--attainment", type=float, default=0.9)
    p.add_argument("--price", type=_price, action="append", default=[], metavar="GPU=USD",
                   help="price per GPU-hour of one preset (repeatable; none is shipped)")
    p.add_argument("-o", "--output", default=None, help="folder for the table and plot")
    a = p.parse_args(argv)
    gpus = [g.strip().lower() for g in a.gpus.split(",")]
    prices = dict(a.price)
    unknown = sorted(set(prices) - set(gpus))
    if unknown:
        p.error(f"--price for {unknown}, not among --gpus {gpus}")
    table = capacity_per_gpu(a.model, gpus, a.n, {"ttft": a.slo_ttft, "itl": a.slo_itl},
                             a.attainment, a.tensor_parallel, prices=prices or None)
    with pd.option_context("display.float_format", "{:.4g}".format, "display.width", 200,
                           "display.max_colwidth", 60):
        print(table.to_string(index=False))
    if a.output:
        out = Path(a.output)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "capacity_per_gpu.csv", index=False)
        plot(table, out / "capacity_per_gpu.png",
             f"{a.model}, TP {a.tensor_parallel}: TTFT <= {a.slo_ttft:g} s and ITL <= "
             f"{a.slo_itl:g} s for {a.attainment:.0%} of requests")
    return table


if __name__ == "__main__":
    main()
