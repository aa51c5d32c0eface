"""Colocated vs disaggregated serving on the same GPUs: goodput per GPU under a TTFT/TPOT SLO.

    python experiments/disaggregation.py [-n 2000] [--gpus 4] [--rates 8,16,24]
                                         [--slo-ttft 1.0] [--slo-tpot 0.03] [-o DIR]

DistServe's question: with ``--gpus`` H100s serving Llama-3.1-8B (roofline costs, vLLM's rules:
8,192-token batches that mix whole prompts with decodes), is it better to run ``--gpus``
colocated replicas (least-outstanding routing) or to split them into a prefill pool and a
decode pool joined by NVLink (450 GB/s per direction, the H100 preset's), and in what ratio?
For each arrival rate of the Azure code trace (long prompts, short outputs, time-scaled), each
layout's SLO attainment (TTFT and TPOT both met) and goodput per GPU. Writes
``disaggregation.csv`` and ``goodput_per_gpu.png`` (goodput per GPU against the rate, one line
per layout).

What it shows: a prefill in the same batch as the decodes stretches their TPOT; a decode pool
never runs a prefill, so its TPOT stays at the decode-only step time, and a split whose
prefill pool keeps up with the arrivals meets a tight TPOT SLO at rates where colocated
replicas do not; a split with too few prefill GPUs loses on TTFT instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import workloads
from sim.engine import run
from sim.engine.fleet.disaggregation import Disaggregation

COLUMNS = ["slo_attainment", "goodput_per_gpu", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99",
           "kv_transfer_time_p99", "num_gpus"]


def layouts(gpus):
    """``{name: SimConfig overrides}``: colocated, and every P:D split of ``gpus``."""
    out = {"colocated": {"replicas": gpus, "router": "least_outstanding"}}
    for p in range(1, gpus):
        out[f"{p}P:{gpus - p}D"] = {"disaggregation": Disaggregation(p, gpus - p),
                                    "router": "least_outstanding"}
    return out


def compare(n=2000, gpus=4, rates=(8.0, 16.0, 24.0), slo=None, workload="azure-code", seed=0):
    slo = slo or {"ttft": 1.0, "tpot": 0.03}
    rows, results = [], {}
    for rate in rates:
        df = workloads.load(workload, n=n, rate=rate, seed=seed)
        for name, knobs in layouts(gpus).items():
            res = run(df, scheduler="vllm", model="llama-3.1-8b", gpu="h100", seed=seed,
                      **knobs)
            s = res.summary(slo=slo)
            rows.append({"rate": rate, "layout": name,
                         **{k: s.get(k, float("nan")) for k in COLUMNS}})
            results[(rate, name)] = res
    return pd.DataFrame(rows), results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=2000)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--rates", default="8,16,24", help="comma-separated requests/s")
    p.add_argument("--slo-ttft", type=float, default=1.0)
    p.add_argument("--slo-tpot", type=float, default=0.03)
    p.add_argument("-o", "--output", default=None, help="folder for the table and plot")
    a = p.parse_args(argv)
    rates = [float(x) for x in a.rates.split(",")]
    table, _ = compare(a.n, a.gpus, rates, {"ttft": a.slo_ttft, "tpot": a.slo_tpot})
    with pd.option_context("display.float_format", "{:.4g}".format, "display.width", 160):
        print(table.to_string(index=False))
    if a.output:
        from sim.results.plots_sweep import plot_sweep
        out = Path(a.output)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "disaggregation.csv", index=False)
        plot_sweep(table, ["rate", "layout"], "goodput_per_gpu", out / "goodput_per_gpu.png")
    return table


if __name__ == "__main__":
    main()
