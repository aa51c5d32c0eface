"""KV offload on and off, on the Mooncake conversation trace or an agentic workload: TTFT,
hits and throughput against the offload tier's size and read bandwidth.

    python experiments/offload_tiers.py [-n 300] [--rate 0.5] [--kv-blocks 20000]
                                        [--sizes 0,50,200,800,2000] [--bandwidths 50,5,1]
    python experiments/offload_tiers.py --agentic [--sessions 128] [--users 16]
                                        [--kv-blocks 12000] [--sizes 0,5,20,80]

Mooncake: one vLLM replica (Llama-3.1-8B on an H100, roofline costs, block prefix cache, a
pool of ``--kv-blocks`` blocks) under a one-tier write-back chain (``sim.KVTierChain``: a tier
of each size, per GPU, at each read bandwidth; size 0 is no tier, bit-identical). Prints one
row per (size, bandwidth): prefix and tier hit rates, mean and P99 TTFT, its split into
queue / load / prefill, and request throughput.

What it shows: the tier's hits grow with its size until it holds every block the trace ever
evicts (then the hit rate is an unbounded GPU pool's); their gain is the prefill they skip,
so TTFT falls with size at PCIe-class bandwidth, while at a low enough bandwidth loading a
block costs more than prefilling it and the same hits make TTFT worse than no tier.

``--agentic``: coding-agent sessions shaped as the LMSYS HiCache post's community report
(Novita AI: dialogues past 25K tokens over about 8 turns; :func:`agentic_sessions`): 8 turns
of 2,900 new tokens and 200-token answers, tool gaps exponential of mean 5 s, ``--users``
closed-loop agents, on Qwen3-235B-A22B with TP 8 on H200s (a stand-in: the post names
Qwen3-Coder-480B and no GPU). The GPU pool (``--kv-blocks``) is sized so that, without a
tier, 40 % of the prompt tokens hit (the post's figure without HiCache); the chain is one
write-through tier (HiCache's documented policy). The gaps evict the next turn's prefix; a
tier that keeps it turns a recompute into a load.
"""

from __future__ import annotations

import argparse

import pandas as pd

import sim
import workloads

COLUMNS = ["size_gb", "read_gbps", "prefix_hit_rate", "offload_hit_rate", "ttft_mean",
           "ttft_p99", "ttft_queue_mean", "ttft_load_mean", "ttft_prefill_mean",
           "request_throughput"]
AGENTIC = dict(model="qwen3-235b-a22b", gpu="h200", tensor_parallel=8)  # the stand-in


def _sweep(df, sizes, bandwidths, policy="write_back", **run) -> pd.DataFrame:
    """One row per (size, bandwidth) (``COLUMNS``) of a one-tier chain of write ``policy``;
    size 0 once (no tier)."""
    rows = []
    for size in sizes:
        for bw in bandwidths[:1] if not size else bandwidths:
            tier = sim.KVTierChain((sim.KVTier(size, read_gbps=bw),), write_policy=policy)
            s = sim.run(df, kv_offload=tier, **run).summary()
            rows.append({"size_gb": size, "read_gbps": bw if size else float("nan"),
                         **{k: s[k] for k in COLUMNS[2:]}})
    return pd.DataFrame(rows, columns=COLUMNS)


def offload_sweep(n=300, rate=0.5, kv_blocks=20_000, sizes=(0, 50, 200, 800, 2000),
                  bandwidths=(50.0, 5.0, 1.0)) -> pd.DataFrame:
    """The Mooncake conversation trace's rows (``COLUMNS``); size 0 once (no tier)."""
    df = workloads.load("mooncake-conversation", n=n, rate=rate)
    return _sweep(df, sizes, bandwidths, scheduler="vllm", model="llama-3.1-8b", gpu="h100",
                  kv_blocks=kv_blocks)


def agentic_sessions(sessions=128, gap=5.0, seed=0):
    """The agentic workload (module docstring): 8-turn sessions growing to ~25K tokens."""
    return workloads.agentic(sessions, turns=8, tool_gap=workloads.Exponential(gap),
                             new_tokens=2900, output=200, seed=seed)


def agentic_sweep(sessions=128, users=16, kv_blocks=12_000, sizes=(0, 5, 20, 80),
                  bandwidths=(50.0, 5.0, 0.5), gap=5.0) -> pd.DataFrame:
    """The agentic workload's rows (``COLUMNS``), closed loop of ``users`` agents."""
    return _sweep(agentic_sessions(sessions, gap), sizes, bandwidths, scheduler="vllm",
                  kv_blocks=kv_blocks, closed_loop=workloads.ClosedLoop(users),
                  policy="write_through", **AGENTIC)


# 3FS's read stress test: ~6.6 TiB/s aggregate over "approximately 500+" client nodes of one
# 200 Gb/s NIC (github.com/deepseek-ai/3FS README, Performance 1): per node of 8 GPUs
THREEFS_GBPS_PER_GPU = 6.6 * 2**40 / 1e9 / 500 / 8  # 1.81 GB/s
HICACHE_RATIO = 2  # --hicache-ratio: the host (L2) pool twice the device pool (SGLang docs)


def hicache_pair(sessions=128, users=16, kv_tokens=192_000, l3_gbps=THREEFS_GBPS_PER_GPU,
                 lower_gb=1000.0, ratio=HICACHE_RATIO, scheduler="sglang",
                 layer_overlap=False, engine_overheads="none") -> dict:
    """The agentic workload without and with SGLang HiCache as Novita ran it: SGLang's
    scheduler and radix cache (page size 1; ``scheduler="vllm"``: vLLM's block cache of
    16-token blocks instead) over a GPU pool of ``kv_tokens``, the preset's L2 at ``ratio``
    times that pool (per GPU), over a 3FS L3 of ``lower_gb`` per GPU read at ``l3_gbps``
    (None: the preset's 25 GB/s); ``layer_overlap``: loads overlap the prefill layer by
    layer (radix only, :mod:`sim.engine.kv.radix_tiers`); ``engine_overheads``: the run's
    setting (``"fitted"``: SGLang's request path and CPU step, fitted on the independent
    validation set's fit rows, so the TTFTs are the client's). Returns both prefix hit rates and
    the TTFT and throughput ratios (with over without): the ``hicache_novita_*`` anchor rows
    of ``sim/data/offload_anchors.csv``; ``l2_hit_rate`` / ``l3_hit_rate``: the prompt tokens
    loaded from each tier (every load) over the prompt tokens. At ``ratio=1.25`` the L2 is
    mostly copies of the GPU's own nodes (HiCache evicts host copies only of nodes the GPU
    no longer holds), so almost half the hits come from L3; at ``ratio=1`` it has no room
    to prefetch L3 into, and neither tier serves; at the default 2 the L2 serves."""
    import dataclasses

    from sim.specs.memory import kv_cache_bytes
    from sim.specs.models import get_model
    df = agentic_sessions(sessions)
    page = 1 if scheduler == "sglang" else 16
    run = dict(scheduler=scheduler, kv_blocks=kv_tokens // page,
               closed_loop=workloads.ClosedLoop(users), engine_overheads=engine_overheads,
               **AGENTIC)
    pool_gb = kv_cache_bytes(kv_tokens, model=get_model(AGENTIC["model"]), dtype=2,
                             tensor_parallel=AGENTIC["tensor_parallel"]) / 1e9
    chain = sim.offload_preset("hicache", ratio * pool_gb, lower_gb, layer_overlap=layer_overlap)
    if l3_gbps is not None:
        l3 = dataclasses.replace(chain.tiers[1], read_gbps=l3_gbps)
        chain = dataclasses.replace(chain, tiers=(chain.tiers[0], l3))
    off, on = (sim.run(df, kv_offload=tier, **run).summary() for tier in (None, chain))
    return {"hit_rate_off": off["prefix_hit_rate"], "hit_rate_on": on["prefix_hit_rate"],
            "ttft_ratio": on["ttft_mean"] / off["ttft_mean"],
            "throughput_ratio": on["request_throughput"] / off["request_throughput"],
            "l2_gb": ratio * pool_gb, "ttft_off": off["ttft_mean"], "ttft_on": on["ttft_mean"],
            "offload_hit_rate": on["offload_hit_rate"],
            "l2_hit_rate": on["offload_tier0_hit_rate"],
            "l3_hit_rate": on.get("offload_tier1_hit_rate", 0.0),
            "ttft_load_mean": on["ttft_load_mean"]}


def _floats(text):
    return tuple(float(x) for x in text.split(","))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agentic", action="store_true", help="the agentic workload")
    p.add_argument("-n", type=int, default=300)
    p.add_argument("--rate", type=float, default=0.5)
    p.add_argument("--sessions", type=int, default=128)
    p.add_argument("--users", type=int, default=16)
    p.add_argument("--kv-blocks", type=int, default=None)
    p.add_argument("--sizes", type=_floats, default=None)
    p.add_argument("--bandwidths", type=_floats, default=None)
    a = p.parse_args(argv)
    if a.agentic:
        table = agentic_sweep(a.sessions, a.users, a.kv_blocks or 12_000,
                              a.sizes or (0, 5, 20, 80), a.bandwidths or (50.0, 5.0, 0.5))
    else:
        table = offload_sweep(a.n, a.rate, a.kv_blocks or 20_000,
                              a.sizes or (0, 50, 200, 800, 2000),
                              a.bandwidths or (50.0, 5.0, 1.0))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    return table


if __name__ == "__main__":
    main()
