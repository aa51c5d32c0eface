"""Routers compared: the same multi-tenant traffic on the same cluster, routed six ways.

    python experiments/routing.py [-n 4000] [--rate 40] [--replicas 4] [--kv-blocks 2000] [-o DIR]

Workload: ``n_groups`` tenants, each with its own 2,000-token system prompt, plus a per-request
user turn and an output, both lognormal (heavy-tailed: CV 1.5), Poisson arrivals. Cluster:
``--replicas`` replicas of Llama-3.1-8B on one H100 each (roofline costs), vLLM's block prefix
cache, ``--kv-blocks`` blocks per replica: fewer than all tenants' prompts need (16 x 125
blocks), so a replica that sees every tenant keeps evicting their prefixes. Prints and writes
a table (``routing.csv``: latencies, prefix hit rate, the busiest replica's share) and two
plots (``routing_latency_cdfs.png``, ``routing_replica_load.png``).

What it shows: ``prefix_affinity`` (and SGLang's ``cache_aware``, from what it has routed)
keeps each tenant's prefix on one replica, so its hit rate approaches the workload's ideal and
its TTFT drops; the load-aware routers
(``least_outstanding``, ``least_kv``) cut the tail that blind ``round_robin`` and ``random``
leave when long requests pile up on one replica.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import workloads
from sim.engine import run
from sim.engine.fleet.routers import ROUTERS

COLUMNS = ["prefix_hit_rate", "ttft_p50", "ttft_p99", "tpot_p50", "e2e_p50", "e2e_p99",
           "request_throughput", "busiest_share"]


def workload(n=4000, rate=40.0, n_groups=16, seed=0):
    return workloads.shared_prefix(n, n_groups=n_groups, system_prompt_tokens=2000,
                                   user_tokens=workloads.LogNormal(200, 1.5, max_tokens=8000),
                                   output=workloads.LogNormal(150, 1.5, max_tokens=4000),
                                   rate=rate, seed=seed)


def compare(n=4000, rate=40.0, replicas=4, kv_blocks=2000, seed=0, routers=tuple(ROUTERS)):
    df = workload(n, rate, seed=seed)
    results = {r: run(df, scheduler="vllm", model="llama-3.1-8b", gpu="h100",
                      replicas=replicas, router=r, kv_blocks=kv_blocks, seed=seed)
               for r in routers}
    rows = {}
    for name, res in results.items():
        s = res.summary()
        row = {k: s[k] for k in COLUMNS if k in s}
        row["busiest_share"] = float(res.replica_summary()["load_share"].max())
        rows[name] = row
    table = pd.DataFrame(rows).T[COLUMNS]
    table.attrs["ideal_prefix_hit_rate"] = workloads.ideal_prefix_hit_rate(df)
    return table, results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=4000)
    p.add_argument("--rate", type=float, default=40.0)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--kv-blocks", type=int, default=2000, dest="kv_blocks")
    p.add_argument("-o", "--output", default=None, help="folder for the table and plots")
    a = p.parse_args(argv)
    table, results = compare(a.n, a.rate, a.replicas, a.kv_blocks)
    with pd.option_context("display.float_format", "{:.4g}".format, "display.width", 160):
        print(table.to_string())
    print(f"ideal prefix hit rate (unbounded cache): {table.attrs['ideal_prefix_hit_rate']:.3f}")
    if a.output:
        from sim.results.plots import plot_latencies, plot_replica_load
        out = Path(a.output)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "routing.csv")
        plot_latencies(results, out / "routing_latency_cdfs.png")
        plot_replica_load(results, out / "routing_replica_load.png")
    return table


if __name__ == "__main__":
    main()
