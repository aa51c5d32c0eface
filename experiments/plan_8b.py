"""Llama-3.1-8B at 10 req/s with TTFT P99 <= 1 s: H100 vs H200 vs L40S vs MI300X, aggregated
vs disaggregated; the cheapest configuration of each option.

    python experiments/plan_8b.py [-o DIR] [--quick] [-n 800] [--rate 10] [--ttft 1.0]
                                  [--workload sharegpt] [--workers 2]

For each GPU type, :func:`sim.plan` searches its aggregated fleets (tensor parallelism x
replicas, round-robin) and its disaggregated ones (prefill:decode splits
x tensor parallelism) at the target rate; the SLO is TTFT <= ``--ttft`` for 99 % of the
requests (TTFT P99 <= 1 s). Costs are the sourced on-demand prices of
``sim/data/gpu_prices.csv``; the roofline cost model prices every iteration. The L40S has no
NVLink, so its disaggregated pools are on two machines joined by the network link of
:mod:`sim.specs.links` (32 GB/s per direction: its PCIe Gen4 x16); the others' pools share
their scale-up link. Writes to ``DIR``: ``plan_8b.csv`` (every candidate of every option, with
its ``option``), ``plan_8b_best.csv`` (the cheapest of each option: the table printed) and
``plan_8b_pareto.png`` (dollars per million output tokens against TTFT P99, the frontier over
all options labelled). ``--quick``: 150 requests and a small space (the test's size).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import sim
import workloads
from sim.results.plots_plan import plot_pareto
from sim.specs.links import network_link_gbps
from sim.tools.plan import _pareto

GPUS = ("h100", "h200", "l40s", "mi300x")
OBJECTIVE, LATENCY = "usd_per_million_output_tokens", "ttft_p99"
COLUMNS = ["option", "tensor_parallel", "replicas", "split", "num_gpus", "usd_per_hour",
           OBJECTIVE, "energy_joules_per_output_token", "ttft_p99", "tpot_p99",
           "slo_attainment"]


def spaces(quick) -> dict:
    """``{layout: space}`` searched for every GPU type."""
    if quick:
        return {"aggregated": {"tensor_parallel": [1], "replicas": [1, 2, 4],
                               "split": ["aggregated"]},
                "disaggregated": {"tensor_parallel": [1], "split": ["1:1", "2:1", "3:2"]}}
    return {"aggregated": {"tensor_parallel": [1, 2], "replicas": [1, 2, 3, 4, 6, 8],
                           "split": ["aggregated"]},
            "disaggregated": {"tensor_parallel": [1, 2],
                              "split": ["1:1", "1:2", "2:1", "2:2", "3:1", "3:2", "4:2",
                                        "4:3", "5:3"]}}


def base_config(gpu) -> sim.SimConfig:
    """The config every candidate of ``gpu`` starts from (see the module docstring)."""
    link = None if sim.specs.gpus.get_gpu(gpu).link_bandwidth_gbps else network_link_gbps(
        gpu, gpu)
    return sim.SimConfig(model="llama-3.1-8b", gpu=gpu,
                         disaggregation=sim.Disaggregation(link_bandwidth_gbps=link))


def compare(df, rate=10.0, ttft=1.0, quick=False, workers=None):
    """``(every candidate, the cheapest per option)``: see the module docstring."""
    slo = {"ttft": ttft}
    tables = []
    for gpu in GPUS:
        for layout, space in spaces(quick).items():
            t = sim.plan(df, slo, attainment=0.99, rate=rate, space=space,
                         base=base_config(gpu), headroom="none", workers=workers)
            tables.append(t.assign(option=f"{gpu} {layout}", gpu=gpu, layout=layout))
    table = pd.concat(tables, ignore_index=True)
    ranked = table["status"] == "ranked"
    table = pd.concat([table[ranked].sort_values([OBJECTIVE, "num_gpus"], kind="stable"),
                       table[~ranked]], ignore_index=True)
    table["pareto"] = _pareto(table, OBJECTIVE, LATENCY)
    best = (table[table["status"] == "ranked"].groupby("option", sort=False).head(1)
            .set_index("option", drop=False))[COLUMNS]
    options = [f"{g} {lay}" for g in GPUS for lay in spaces(quick)]
    best = best.reindex(best.index.tolist() + [o for o in options if o not in best.index])
    best["option"] = best.index
    best["note"] = ["" if o in set(table.loc[ranked_rows(table), "option"]) else
                    "none of its space meets the SLO" for o in best.index]
    return table, best


def ranked_rows(table):
    return table["status"] == "ranked"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", default="plan_8b-out", help="output folder")
    ap.add_argument("--quick", action="store_true", help="a small run (150 requests)")
    ap.add_argument("-n", type=int, default=None, help="requests (default 800; quick 150)")
    ap.add_argument("--rate", type=float, default=10.0, help="target req/s (default 10)")
    ap.add_argument("--ttft", type=float, default=1.0, help="TTFT P99 limit, s (default 1)")
    ap.add_argument("--workload", default="sharegpt", help="a bundled trace (default sharegpt)")
    ap.add_argument("--workers", type=int, default=None, help="processes (default: CPUs)")
    args = ap.parse_args(argv)
    n = args.n or (150 if args.quick else 800)
    df = workloads.load(args.workload, n=n, rate=args.rate, seed=0)
    table, best = compare(df, args.rate, args.ttft, args.quick, args.workers)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "plan_8b.csv", index=False)
    best.to_csv(out / "plan_8b_best.csv", index=False)
    plot_pareto(table, OBJECTIVE, LATENCY, out / "plan_8b_pareto.png", label="option")
    with pd.option_context("display.float_format", "{:.4g}".format, "display.width", 200):
        print(best.drop(columns="option").to_string())
    print(f"\n{len(table)} candidates, {int((table['status'] == 'ranked').sum())} meet the SLO; "
          f"wrote plan_8b.csv, plan_8b_best.csv, plan_8b_pareto.png to {out}/")
    return table, best


if __name__ == "__main__":
    main()
