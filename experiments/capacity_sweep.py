"""Where does it break? Sweep the request rate and find the knee of P99 TTFT.

    python experiments/capacity_sweep.py [--workload sharegpt] [--rates 2,4,...] [-n 3000]

For each rate the same requests (same seed, same lengths) are replayed faster; the table shows
throughput saturating while P99 TTFT explodes once the replica can no longer keep up, and the
highest rate that meets the TTFT/ITL SLOs for 90% of requests (the capacity under SLO).
Runs in parallel worker processes (``sim.sweep``).
"""

from __future__ import annotations

import argparse

import pandas as pd

import workloads
from sim import sweep

SLO = {"ttft": 2.0, "itl": 0.1}


def capacity(workload="sharegpt", rates=(2, 4, 6, 8, 10, 12, 14), n=3000, model="llama-3.1-8b",
             gpu="h100", workers=None):
    base = workloads.load(workload, n=n, rate=1.0, seed=0)
    jobs = [dict(workload=workloads.scale_to_rate(base, r), label={"rate": r},
                 config=dict(model=model, gpu=gpu)) for r in rates]
    table = sweep(jobs, slo=SLO, workers=workers)
    cols = ["rate", "request_throughput", "ttft_p50", "ttft_p99", "itl_p99", "slo_attainment",
            "num_preemptions"]
    table = table[cols]
    ok = table[table["slo_attainment"] >= 0.9]
    best = float(ok["rate"].max()) if len(ok) else float("nan")
    return table, best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="sharegpt")
    p.add_argument("--rates", default="2,4,6,8,10,12,14")
    p.add_argument("-n", type=int, default=3000)
    p.add_argument("--workers", type=int, default=None)
    a = p.parse_args(argv)
    table, best = capacity(a.workload, [float(r) for r in a.rates.split(",")], a.n,
                           workers=a.workers)
    with pd.option_context("display.float_format", "{:.4g}".format, "display.width", 160):
        print(table.to_string(index=False))
    print(f"\ncapacity under SLO {SLO} for 90% of requests: {best:g} req/s")
    return table, best


if __name__ == "__main__":
    main()
