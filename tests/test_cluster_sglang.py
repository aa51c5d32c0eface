"""The sglang preset (prefill batches run alone while the decodes wait: a decode clock per
replica) in a cluster and in prefill/decode pools: one replica's exact results, the splitting
rule of queueing theory, a policy object copied per replica, SGLang's PD servers (prefill
batches on the prefill pool, decode batches on the decode pool), the transfer-free limit, and
the CLI."""

import json
import math

import numpy as np
import pandas as pd
import pytest

import workloads as wl
from sim.cli import main
from sim.costs.simple import ConstantCost, LinearCost
from sim.engine import SimConfig, SpeculativeConfig, run
from sim.engine.fleet.disaggregation import Disaggregation
from sim.engine.presets.sglang import SGLang

COST = LinearCost(0.02, 2e-5, 1e-4, 0.0)
POOL = 30000  # tokens (SGLang's page size is 1 token)


def _df(n=600, rate=30.0, seed=1):
    return wl.synthetic(n, rate=rate, prompt=wl.LogNormal(500, 1.0, max_tokens=4000),
                        output=wl.LogNormal(100, 1.0, max_tokens=1000), seed=seed)


@pytest.mark.parametrize("knobs", [
    {"kv_blocks": POOL},
    {"kv_blocks": 6000},  # tight: retractions
    {"kv_blocks": POOL, "closed_loop": wl.ClosedLoop(8, 0.1)},
    {"kv_blocks": POOL, "speculative": SpeculativeConfig(
        num_speculative_tokens=2, acceptance_rate=0.7, draft_cost_ratio=0.1)},
])
def test_everything_routed_to_one_replica_is_the_single_replica_run_exactly(knobs):
    df = _df()
    one = run(df, scheduler="sglang", cost_model=COST, **knobs)
    three = run(df, scheduler="sglang", cost_model=COST, replicas=3,
                router=lambda r, views, now: 0, **knobs)
    pd.testing.assert_frame_equal(one.requests, three.requests)
    pd.testing.assert_frame_equal(one.iterations, three.iterations)
    np.testing.assert_array_equal(one.itl(), three.itl())
    it = one.iterations
    paused = (it["num_prefill_tokens"] > 0) & (it["num_decode_tokens"] == 0)
    assert paused.sum() > 50  # prefill-only iterations: the decode clock is exercised
    if knobs["kv_blocks"] < POOL:
        assert one.requests["num_preemptions"].sum() > 0  # retraction exercised


def test_the_preset_behind_every_router_loses_nothing_and_times_every_token():
    df = _df(400, rate=40.0, seed=2)
    for router in ("round_robin", "random", "least_outstanding", "least_kv", "prefix_affinity"):
        res = run(df, scheduler="sglang", cost_model=COST, kv_blocks=4000, replicas=3,
                  router=router)
        req = res.requests
        fits = req["num_prompt_tokens"] + req["num_output_tokens"] <= 4000
        assert ((req["status"] == "finished") == fits).all() and (~fits).any(), router
        assert req["replica"].nunique() == 3 and res.summary()["num_preemptions"] > 0
        fin = req[fits]
        assert len(res.itl()) == int((fin["num_output_tokens"] - 1).sum())
        assert res.itl().sum() == pytest.approx(float((fin["e2e"] - fin["ttft"]).sum()),
                                                abs=1e-9)
        assert (res.itl() > 0).all() and (fin["ttft"] > 0).all()
        again = run(df, scheduler="sglang", cost_model=COST, kv_blocks=4000, replicas=3,
                    router=router)
        pd.testing.assert_frame_equal(req, again.requests)


def test_random_routing_over_four_replicas_at_four_times_the_rate_matches_one_replica():
    """Random splitting of a Poisson stream gives each replica a Poisson stream of a quarter
    of the rate: each SGLang replica behaves as one replica at 1x."""
    def uniform(n, rate, seed):
        return wl.synthetic(n, rate=rate, prompt=wl.Uniform(100, 900),
                            output=wl.Uniform(20, 200), seed=seed)
    one = run(uniform(2000, 8.0, 0), scheduler="sglang", cost_model=COST,
              kv_blocks=POOL).summary()
    four = run(uniform(8000, 32.0, 100), scheduler="sglang", cost_model=COST, kv_blocks=POOL,
               replicas=4, router="random").summary()
    for k in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99"):
        assert four[k] == pytest.approx(one[k], rel=0.05), k


def test_a_policy_object_is_copied_for_each_replica():
    """SGLang keeps per-replica state (the chunked request, new_token_ratio): an SGLang object
    passed in runs as the named preset does, one copy per replica."""
    df = _df(300, rate=20.0, seed=3)
    given = run(df, scheduler=SGLang(512), cost_model=COST, kv_blocks=POOL, replicas=2)
    named = run(df, scheduler="sglang", chunk_size=512, cost_model=COST, kv_blocks=POOL,
                replicas=2)
    pd.testing.assert_frame_equal(given.requests, named.requests)
    assert (given.requests["num_prompt_tokens"] > 512).sum() > 50  # chunked on both replicas


@pytest.mark.parametrize("prefill, decode", [("sglang", "sglang"), ("sglang", "vllm"),
                                             ("vllm", "sglang")])
def test_infinite_bandwidth_gives_the_colocated_timings(prefill, decode):
    """Requests far apart: with a free link a request's timings are the colocated ones,
    whichever pool runs SGLang's scheduler."""
    rng = np.random.default_rng(1)
    df = pd.DataFrame({"arrival_time": np.arange(20) * 10.0,
                       "num_prompt_tokens": rng.integers(1, 3000, 20),
                       "num_output_tokens": rng.integers(1, 200, 20)})
    colocated = run(df, scheduler="sglang", cost_model=COST)
    d = Disaggregation(2, 2, link_bandwidth_gbps=math.inf, prefill={"scheduler": prefill},
                       decode={"scheduler": decode})
    split = run(df, scheduler="sglang", cost_model=COST, disaggregation=d,
                router="round_robin")
    for col in ("ttft", "e2e", "tpot", "max_itl", "first_token_time", "finish_time"):
        np.testing.assert_allclose(split.requests[col], colocated.requests[col], rtol=1e-12)
    assert sorted(colocated.itl()) == pytest.approx(sorted(split.itl()), rel=1e-12)


def test_sglang_pools_run_prefill_batches_and_decode_batches_only():
    """SGLang's PD servers: the prefill server runs prefill batches only (a request leaves at
    its first token), the decode server decode batches only - until a decode pool short of KV
    retracts requests, which (a deviation: SGLang offloads their KV to host memory) are
    re-prefilled there in prefill-only iterations."""
    df = _df(400, rate=20.0, seed=4)
    d = Disaggregation(2, 2, link_bandwidth_gbps=100.0, link_latency_s=0.001)
    res = run(df, scheduler="sglang", cost_model=COST, kv_blocks=POOL, disaggregation=d)
    it = res.iterations
    pre, dec = it[it["replica"] < 2], it[it["replica"] >= 2]
    assert (pre["num_decode_tokens"] == 0).all() and (pre["num_prefill_tokens"] > 0).all()
    assert (dec["num_prefill_tokens"] == 0).all() and (dec["num_decode_tokens"] > 0).all()
    assert (res.requests["status"] == "finished").all()
    d = Disaggregation(2, 2, link_bandwidth_gbps=100.0, decode={"kv_blocks": 3000})
    tight = run(df, scheduler="sglang", cost_model=COST, kv_blocks=POOL, disaggregation=d)
    req, it = tight.requests, tight.iterations
    fits = req["num_prompt_tokens"] + req["num_output_tokens"] <= 3000
    assert ((req["status"] == "finished") == fits).all() and (~fits).any()
    assert req["num_preemptions"].sum() > 0
    req = req[fits]
    dec = it[it["replica"] >= 2]
    assert ((dec["num_prefill_tokens"] > 0) & (dec["num_decode_tokens"] == 0)).any()
    assert ((dec["num_prefill_tokens"] > 0) & (dec["num_decode_tokens"] > 0)).sum() == 0
    assert len(tight.itl()) == int((req["num_output_tokens"] - 1).sum())
    assert tight.itl().sum() == pytest.approx(float((req["e2e"] - req["ttft"]).sum()), abs=1e-9)


def test_each_pool_takes_its_own_schedulers_defaults():
    """An SGLang pool in a run whose scheduler is another one keeps SGLang's chunk size and
    batch size (the run's block size and prefix caching are shared by both pools)."""
    d = Disaggregation(1, 1, prefill={"scheduler": "sglang"}, decode={"scheduler": "continuous"})
    res = run(_df(50), scheduler="chunked", cost_model=ConstantCost(0.01), disaggregation=d)
    assert (res.requests["status"] == "finished").all()
    p, dec = d.pool_configs(SimConfig(disaggregation=d), shared=res.config)
    from sim.engine.schedulers import resolve
    p, dec = resolve(p)[0], resolve(dec)[0]
    assert (p.chunk_size, p.max_batch_size, p.block_size) == (8192, 1024, 16)
    assert (dec.chunk_size, dec.max_batch_size, dec.block_size) == (None, 256, 16)


def test_cli_runs_sglang_replicas_and_pools(tmp_path, capsys):
    base = ["run", "-w", "azure-code", "-n", "200", "--rate", "8", "--cost", "constant:0.01",
            "--no-plots", "-q", "--scheduler", "sglang"]
    assert main(base + ["--replicas", "4", "-o", str(tmp_path / "c")]) == 0
    doc = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert doc["settings"]["scheduler"] == "sglang" and doc["summary"]["num_replicas"] == 4
    req = pd.read_parquet(tmp_path / "c" / "requests.parquet")
    assert sorted(req["replica"].unique()) == [0, 1, 2, 3] and len(req) == 200
    assert (req["status"] == "finished").all()
    assert main(base + ["--prefill-replicas", "1", "--decode-replicas", "2",
                        "-o", str(tmp_path / "d")]) == 0
    req = pd.read_parquet(tmp_path / "d" / "requests.parquet")
    assert set(req["prefill_replica"]) == {0} and (req["status"] == "finished").all()
