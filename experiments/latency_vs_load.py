"""Latency against load, per scheduler: TTFT and ITL P50/P99 as the request rate rises, and the knee.

    python experiments/latency_vs_load.py [--workload sharegpt] [-n 3000] [--rates 1,2,...]
                                          [--slo-ttft 2] [--slo-itl 0.1] [-o DIR]

One ``sim.sweep`` over ``scheduler`` x ``rate``: the same requests (ShareGPT lengths, Poisson
arrivals drawn once, time-scaled to each rate) served by Llama-3.1-8B on an H100 (roofline
costs) under ``static``, ``continuous``, ``chunked``, ``vllm`` and ``sarathi``, each with its
own defaults. For each scheduler the knee is the highest rate whose P99 (and every lower rate's)
stays within the SLO (``sim.results.plots_sweep.knee``), for TTFT and for ITL, beside the
highest throughput it reached. Writes ``latency_vs_load.csv`` (one row per point),
``latency_knees.csv`` (one row per scheduler) and ``latency_vs_load_ttft.png`` /
``latency_vs_load_itl.png`` (``plot_percentiles_vs_rate``: P50/P90/P99 by rate, the SLO and
each scheduler's knee).

What it shows: latency stays flat until a scheduler's throughput saturates, then TTFT grows
by orders of magnitude within one or two steps of rate (the queue grows without bound). Static
batching saturates first and never meets a tight TTFT SLO (a batch runs until its longest
request finishes, so even at light load a request waits for the batch before it); continuous
batching and vLLM's rules reach the highest throughput but let long prefills stall the running
decodes, so their P99 ITL passes the SLO long before their TTFT does; chunked prefill's
512-token budget (``chunked``, and ``sarathi``, whose admission rule adds nothing here) keeps P99
ITL within the SLO at every rate and pays for it in TTFT and throughput.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import workloads
from sim import SimConfig, sweep
from sim.results.plots_sweep import knee

SCHEDULERS = ("static", "continuous", "chunked", "vllm", "sarathi")
RATES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12)
COLUMNS = ["scheduler", "rate", "ttft_p50", "ttft_p90", "ttft_p99", "itl_p50", "itl_p90",
           "itl_p99", "request_throughput", "mean_batch_size", "num_preemptions", "error"]


def latency_vs_load(workload="sharegpt", n=3000, rates=RATES, schedulers=SCHEDULERS,
                    model="llama-3.1-8b", gpu="h100", workers=None, seed=0):
    """One row per (scheduler, rate) (``COLUMNS``)."""
    df = workloads.load(workload, n=n, rate=1.0, seed=seed)
    grid = {"scheduler": list(schedulers), "rate": [float(r) for r in rates]}
    table = sweep(df, grid, base=SimConfig(model=model, gpu=gpu, seed=seed), workers=workers,
                  progress=False)
    return table[COLUMNS]


def knees(table, slo_ttft=2.0, slo_itl=0.1):
    """Per scheduler: the TTFT and ITL knees (``NaN``: not even the lowest rate meets the SLO)
    and the highest throughput reached."""
    rows = {}
    for name, part in table[table["error"] == ""].groupby("scheduler", sort=False):
        k_ttft, k_itl = knee(part, "ttft", slo_ttft), knee(part, "itl", slo_itl)
        rows[name] = {"ttft_knee": float("nan") if k_ttft is None else k_ttft,
                      "itl_knee": float("nan") if k_itl is None else k_itl,
                      "max_throughput": part["request_throughput"].max()}
    return pd.DataFrame(rows).T


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="sharegpt")
    p.add_argument("-n", type=int, default=3000, help="requests per point (default 3000)")
    p.add_argument("--rates", default=",".join(map(str, RATES)), help="comma-separated req/s")
    p.add_argument("--schedulers", default=",".join(SCHEDULERS))
    p.add_argument("--slo-ttft", type=float, default=2.0, help="P99 TTFT limit, s (default 2)")
    p.add_argument("--slo-itl", type=float, default=0.1, help="P99 ITL limit, s (default 0.1)")
    p.add_argument("--workers", type=int, default=None, help="local processes (default: CPUs)")
    p.add_argument("-o", "--output", default=None, help="folder for the tables and plots")
    a = p.parse_args(argv)
    rates = [float(r) for r in a.rates.split(",")]
    table = latency_vs_load(a.workload, a.n, rates, a.schedulers.split(","), workers=a.workers)
    kn = knees(table, a.slo_ttft, a.slo_itl)
    with pd.option_context("display.float_format", "{:.4g}".format, "display.width", 160):
        print(table.to_string(index=False))
        print(f"\nknees (P99 TTFT <= {a.slo_ttft:g} s, P99 ITL <= {a.slo_itl:g} s), req/s:")
        print(kn.to_string())
    if a.output:
        from sim.results.plots_sweep import plot_percentiles_vs_rate
        out = Path(a.output)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "latency_vs_load.csv", index=False)
        kn.to_csv(out / "latency_knees.csv", index_label="scheduler")
        for metric, slo in (("ttft", a.slo_ttft), ("itl", a.slo_itl)):
            plot_percentiles_vs_rate(table, metric, out / f"latency_vs_load_{metric}.png",
                                     by="scheduler", slo=slo)
    return table, kn


if __name__ == "__main__":
    main()
