"""LoRA throughput against the number of adapters: S-LoRA's Table 3 replayed.

    python experiments/lora_adapters.py [--settings S1,S2] [--counts 5,100,1000,2000]

S-LoRA (Sheng et al., MLSys 2024, arXiv 2311.03285) Table 3 serves Llama-7B on one
A100-80GB with 5 to 2,000 adapters (setting S1: every adapter rank 8; S2: ranks 64, 32, 16, 8
in turn). Its benchmark (github.com/S-LoRA/S-LoRA, ``benchmarks/trace.py``
``generate_requests``, ``benchmarks/exp_suite.py`` suite ``a100-80-table``) draws, with
``np.random.seed(42)``, 1,200 requests (10 req/s for 120 s): the adapter of each as
``int(np.random.power(alpha=1) * n)`` (uniform), prompts and answers ``randint(8, 512)``
tokens, gamma inter-arrivals of cv 1 (Poisson); the server holds 125,000 tokens of KV
(``--max_total_token_num 125000``). Throughput is requests over the time the last one
finishes. :func:`slora_workload` draws the same numbers in the same order.

The replay: ``llama-2-7b`` (LLaMA-7B's dimensions: 32 layers, hidden 4096, 32 heads, MLP
11008) on ``a100`` with the ``vllm`` policy, a pool of 125,000 tokens (7,812 blocks of 16),
``sim.LoRAConfig`` with a GPU slot for every adapter and all of them in the CPU cache (S-LoRA
keeps every adapter in host memory and pages the running batch's into the GPU, so admission
never waits for a slot), LoRA on q, k, v, o (S-LoRA's dummy adapters' targets). Assumed, not
replayed: S-LoRA's unified paging (its adapters share the 125,000-token pool; here they are
not charged to it) and its kernels (our roofline and SGMV term stand for MBGMM/MBGMV).

Prints, per setting and adapter count, the published and the simulated throughput and each
one's ratio to the smallest count's (the curve's shape), from ``sim/data/lora_anchors.csv``.
"""

from __future__ import annotations

import argparse
import csv
import warnings
from importlib import resources

import numpy as np
import pandas as pd

import sim

RANKS = {"S1": (8,), "S2": (64, 32, 16, 8)}  # exp_suite.py LORA_DIR, adapter i: ranks[i % k]
KV_TOKENS = 125_000  # launch_server.py --num-token for the a100-80 table
COLUMNS = ["setting", "adapters", "published_req_s", "simulated_req_s", "published_ratio",
           "simulated_ratio"]


def published() -> dict:
    """``{setting: {adapters: req/s}}`` from the ``slora_table3_*`` rows of the anchors."""
    text = resources.files("sim").joinpath("data/lora_anchors.csv").read_text()
    out = {}
    for row in csv.DictReader(text.splitlines()):
        if row["anchor"].startswith("slora_table3_"):
            setting = row["anchor"].rsplit("_", 1)[1]
            out[setting] = {int(n): float(x) for n, x in
                            (pair.split(":") for pair in row["value"].split())}
    return out


def slora_workload(adapters: int, rate=10.0, duration=120, seed=42) -> pd.DataFrame:
    """S-LoRA's ``generate_requests(num_adapters, alpha=1, req_rate, cv=1, duration,
    [8, 512], [8, 512])``: the same draws, in its order, from ``np.random.seed(seed)``."""
    rs = np.random.RandomState(seed)
    total = int(rate * duration)
    lora_id = (rs.power(1.0, total) * adapters).astype(int)
    prompt = rs.randint(8, 512, total)
    output = rs.randint(8, 512, total)
    arrival = np.cumsum(rs.gamma(1.0, 1.0 / rate, total))
    return pd.DataFrame({"arrival_time": arrival, "num_prompt_tokens": prompt,
                         "num_output_tokens": output, "lora_id": lora_id})


def slora_throughput(setting: str, adapters: int) -> float:
    """Requests per second of the replay of S-LoRA's ``setting`` at ``adapters`` adapters."""
    ranks = RANKS[setting]
    lora = sim.LoRAConfig(max_loras=adapters, max_cpu_loras=adapters, max_lora_rank=max(ranks),
                          ranks={i: ranks[i % len(ranks)] for i in range(adapters)},
                          target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))
    df = slora_workload(adapters)
    with warnings.catch_warnings():  # (the slots' preallocation leaves less than S-LoRA's
        # 125,000 tokens; its unified pool is the assumption the docstring states)
        warnings.filterwarnings("ignore", message="kv_blocks=")
        res = sim.run(df, scheduler="vllm", model="llama-2-7b", gpu="a100",
                      kv_blocks=KV_TOKENS // 16, lora=lora)
    req = res.requests
    assert len(req) == len(df) and (req["status"] == "finished").all()
    return len(df) / float(req["finish_time"].max())


def slora_curve(settings=("S1", "S2"), counts=None) -> pd.DataFrame:
    """One row per (setting, adapter count) (``COLUMNS``); ratios to the setting's first."""
    table = published()
    rows = []
    for setting in settings:
        points = sorted(table[setting]) if counts is None else list(counts)
        sims = [slora_throughput(setting, n) for n in points]
        pubs = [table[setting].get(n, float("nan")) for n in points]
        for n, p, s in zip(points, pubs, sims):
            rows.append({"setting": setting, "adapters": n, "published_req_s": p,
                         "simulated_req_s": s, "published_ratio": p / pubs[0],
                         "simulated_ratio": s / sims[0]})
    return pd.DataFrame(rows, columns=COLUMNS)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", default="S1,S2")
    p.add_argument("--counts", default=None, help="adapter counts (default: Table 3's)")
    a = p.parse_args(argv)
    counts = None if a.counts is None else [int(x) for x in a.counts.split(",")]
    table = slora_curve(tuple(a.settings.split(",")), counts)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))


if __name__ == "__main__":
    main()
