"""Prefill/decode disaggregation: exact hand-built timings, the transfer-free limit, the link's
queue, decode-pool back-pressure, and nothing lost."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import workloads as wl
from sim.costs.simple import ConstantCost, LinearCost
from sim.engine import SimConfig, run
from sim.engine.fleet.disaggregation import Disaggregation, Link
from sim.specs.memory import kv_cache_bytes

COST = LinearCost(0.01, 1e-4, 1e-3, 0.0)


def _df(arrivals, prompts, outputs):
    return pd.DataFrame({"arrival_time": arrivals, "num_prompt_tokens": prompts,
                         "num_output_tokens": outputs})


def test_a_request_alone_has_ttft_prefill_plus_transfer_exactly():
    df = _df([0.0], [1000], [10])
    alone = run(df, cost_model=COST).requests.iloc[0]
    d = Disaggregation(1, 1, link_bandwidth_gbps=10.0, link_latency_s=0.002)
    res = run(df, cost_model=COST, disaggregation=d)
    r = res.requests.iloc[0]
    transfer = kv_cache_bytes(1000, model="llama-3.1-8b") / 10e9 + 0.002  # 131 MB at 10 GB/s
    assert r["kv_transfer_time"] == pytest.approx(transfer, rel=1e-12)
    assert r["ttft"] == pytest.approx(alone["ttft"] + transfer, rel=1e-12)
    assert r["e2e"] == pytest.approx(alone["e2e"] + transfer, rel=1e-12)
    assert r["tpot"] == pytest.approx(alone["tpot"], rel=1e-12)
    assert (r["prefill_replica"], r["replica"]) == (0, 1)
    s = res.summary()
    assert s["kv_transfer_time_mean"] == pytest.approx(transfer)
    assert (s["num_replicas"], s["num_gpus"]) == (2, 2)
    assert res.itl().sum() == pytest.approx(r["e2e"] - r["ttft"], abs=1e-12)
    assert len(res.itl()) == 9


def test_infinite_bandwidth_and_no_latency_give_the_transfer_free_timings():
    """Requests far apart (no interference in either run): the disaggregated run's latencies
    are the colocated ones, token for token."""
    rng = np.random.default_rng(1)
    df = _df(np.arange(20) * 10.0, rng.integers(1, 3000, 20), rng.integers(1, 200, 20))
    colocated = run(df, cost_model=COST)
    d = Disaggregation(2, 3, link_bandwidth_gbps=math.inf, link_latency_s=0.0)
    split = run(df, cost_model=COST, disaggregation=d, router="round_robin")
    for col in ("ttft", "e2e", "tpot", "max_itl", "first_token_time", "finish_time"):
        np.testing.assert_allclose(split.requests[col], colocated.requests[col], rtol=1e-12)
    moved = split.requests["num_output_tokens"] > 1
    assert (split.requests.loc[moved, "kv_transfer_time"] == 0).all()
    assert split.requests.loc[~moved, "kv_transfer_time"].isna().all()  # finish at prefill
    assert sorted(colocated.itl()) == pytest.approx(sorted(split.itl()), rel=1e-12)


def test_transfers_on_one_link_queue_behind_each_other():
    link = Link(bandwidth=100.0, latency=0.5)
    assert link.send(0.0, 100.0) == 1.5  # 1 s on the link, lands 0.5 s later
    assert link.send(0.2, 50.0) == 2.0  # waits until 1.0, 0.5 s on the link
    assert link.send(5.0, 0.0) == 5.5
    # two prompts prefilled in one iteration: the second transfer waits for the first
    df = _df([0.0, 0.0], [200, 200], [5, 5])
    d = Disaggregation(1, 1, link_bandwidth_gbps=1.0, link_latency_s=0.001)
    req = run(df, cost_model=COST, disaggregation=d).requests
    one = kv_cache_bytes(200, model="llama-3.1-8b") / 1e9
    assert req["kv_transfer_time"].tolist() == pytest.approx([one + 0.001, 2 * one + 0.001])


def test_a_slow_link_shows_in_ttft_and_a_full_decode_pool_holds_transfers_back():
    df = wl.synthetic(300, rate=5, prompt=wl.Uniform(200, 1500), output=wl.Uniform(20, 300),
                      seed=2)
    fast = run(df, cost_model=COST, kv_blocks=20000, disaggregation=Disaggregation(
        1, 1, link_bandwidth_gbps=math.inf)).summary()
    slow = run(df, cost_model=COST, kv_blocks=20000, disaggregation=Disaggregation(
        1, 1, link_bandwidth_gbps=2.0, link_latency_s=0.01)).summary()
    assert slow["ttft_p50"] > fast["ttft_p50"] + 0.05  # ~100 MB per request at 2 GB/s
    assert slow["kv_transfer_time_p50"] > 0.05 and fast["kv_transfer_time_p99"] == 0
    # a decode pool of 400 blocks: transfers wait for room (back-pressure), nothing lost
    small = Disaggregation(1, 1, link_bandwidth_gbps=math.inf, decode={"kv_blocks": 400})
    res = run(df, cost_model=COST, disaggregation=small)
    req = res.requests
    assert (req["status"] == "finished").all() and len(req) == 300
    assert req["kv_transfer_time"].max() > 0.1  # waited for decode blocks
    assert res.iterations.query("replica == 1")["kv_blocks_used"].max() <= 400


def test_requests_that_cannot_fit_the_decode_pool_are_rejected_at_arrival():
    df = _df([0.0, 0.1], [100, 5000], [10, 10])
    d = Disaggregation(1, 1, decode={"kv_blocks": 100})  # 1,600 tokens
    req = run(df, cost_model=COST, disaggregation=d).requests
    assert req["status"].tolist() == ["finished", "rejected"]
    assert "decode replica's pool holds 1600" in req["reason"].iloc[1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 30), prefill=st.integers(1, 3), decode=st.integers(1, 3),
       bandwidth=st.sampled_from([0.5, 5.0, math.inf]), latency=st.sampled_from([0.0, 0.02]),
       kv=st.integers(4, 60), decode_kv=st.integers(4, 60),
       scheduler=st.sampled_from(["continuous", "chunked", "sglang"]), closed=st.booleans(),
       seed=st.integers(0, 3))
def test_nothing_is_lost_and_token_gaps_add_up(n, prefill, decode, bandwidth, latency, kv,
                                               decode_kv, scheduler, closed, seed):
    rng = np.random.default_rng(seed)
    df = _df(np.sort(rng.uniform(0, 1, n)).round(2), rng.integers(1, 300, n),
             rng.integers(1, 60, n))
    d = Disaggregation(prefill, decode, link_bandwidth_gbps=bandwidth, link_latency_s=latency,
                       decode={"kv_blocks": decode_kv})
    res = run(df, scheduler=scheduler, cost_model=ConstantCost(0.01), max_batch_size=4,
              kv_blocks=kv, disaggregation=d, router="least_outstanding",
              closed_loop=wl.ClosedLoop(2, 0.0) if closed else None)
    req = res.requests
    assert len(req) == n and req["status"].isin(["finished", "rejected"]).all()
    fin = req[req["status"] == "finished"]
    moved = fin["num_output_tokens"] > 1
    assert fin.loc[moved, "replica"].between(prefill, prefill + decode - 1).all()
    assert fin.loc[~moved, "replica"].between(0, prefill - 1).all()
    assert (fin.loc[moved, "kv_transfer_time"] >= latency - 1e-12).all()
    assert len(res.itl()) == int((fin["num_output_tokens"] - 1).sum())
    assert res.itl().sum() == pytest.approx(float((fin["e2e"] - fin["ttft"]).sum()), abs=1e-9)
    assert (res.itl() >= -1e-12).all()
    assert res.replica_summary()["num_requests"].sum() >= n


def test_bad_disaggregation_settings_name_the_field():
    with pytest.raises(ValueError, match="decode_replicas must be > 0"):
        Disaggregation(1, 0)
    with pytest.raises(ValueError, match="link_bandwidth_gbps must be a finite number > 0"):
        Disaggregation(1, 1, link_bandwidth_gbps=0)
    with pytest.raises(ValueError, match="'model' cannot differ between pools"):
        Disaggregation(prefill={"model": "llama-3.1-70b"})
    with pytest.raises(ValueError, match=r"prefill: unknown key 'gpuu' \(did you mean 'gpu'\?\); "
                                         r"known: \['scheduler', "):
        Disaggregation(1, 1, prefill={"gpuu": "a100"})
    with pytest.raises(ValueError, match=r"decode: unknown key 'colour'; known: \["):
        Disaggregation(1, 1, decode={"colour": "red"})
    from dataclasses import fields

    from sim.engine.fleet.disaggregation import POOL_KNOBS, SHARED_KNOBS
    assert sorted(POOL_KNOBS + SHARED_KNOBS) == sorted(f.name for f in fields(SimConfig))
    with pytest.raises(TypeError, match="decode must be a dict"):
        Disaggregation(decode=3)
    with pytest.raises(ValueError, match="replicas=2 with disaggregation"):
        SimConfig(replicas=2, disaggregation=Disaggregation())
    with pytest.raises(TypeError, match="disaggregation must be a sim.Disaggregation"):
        SimConfig(disaggregation=(1, 1))
    with pytest.raises(ValueError, match="has no scale-up link"):
        run(_df([0.0], [10], [2]), cost_model=COST, gpu="l40s",
            disaggregation=Disaggregation())
    assert hash(SimConfig(disaggregation=Disaggregation(prefill={"tensor_parallel": 2})))


def test_pools_take_their_own_overrides():
    d = Disaggregation(2, 1, prefill={"tensor_parallel": 2}, decode={"max_batch_size": 8})
    cfg = SimConfig(disaggregation=d)
    p, dec = d.pool_configs(cfg)
    assert (p.replicas, p.tensor_parallel, dec.replicas, dec.max_batch_size) == (2, 2, 1, 8)
    assert cfg.fleet() == (3, 5)
    # the default link: the H100's NVLink, 450 GB/s per direction
    assert d.bandwidth_bytes(cfg) == 450e9


def test_a_pools_own_sizing_replaces_the_runs():
    """A pool that sizes its KV pool (kv_blocks, or a utilization) drops the run's other way
    of sizing it: the run's kv_blocks no longer hides the pool's utilization, and the run's
    utilization no longer makes the pool's kv_blocks an error."""
    gpu = dict(model="llama-3.1-8b", gpu="h100")
    d = Disaggregation(1, 1, decode={"gpu_memory_utilization": 0.5})
    p, dec = d.pool_configs(SimConfig(kv_blocks=100, disaggregation=d, **gpu))
    half = SimConfig(gpu_memory_utilization=0.5, **gpu).resolved_kv_blocks()
    assert p.resolved_kv_blocks() == 100 and dec.resolved_kv_blocks() == half > 100
    d = Disaggregation(1, 1, prefill={"kv_blocks": 64})
    p, dec = d.pool_configs(SimConfig(gpu_memory_utilization=0.5, disaggregation=d, **gpu))
    assert (p.kv_blocks, p.gpu_memory_utilization) == (64, None)
    assert dec.resolved_kv_blocks() == half


def test_an_error_in_a_pools_config_names_the_pool():
    # (review9) the run's tensorrt-llm fraction reaches a decode pool that runs vLLM's
    # accounting: refused, but the message named no pool (the user set it for the run)
    d = Disaggregation(1, 1, decode={"scheduler": "vllm"})
    cfg = SimConfig(scheduler="tensorrt-llm", free_gpu_memory_fraction=0.8, disaggregation=d)
    with pytest.raises(ValueError, match=r"^decode: free_gpu_memory_fraction=0.8 is read only "
                                         r"by the tensorrt-llm memory accounting"):
        d.pool_configs(cfg)
    d = Disaggregation(1, 1, prefill={"kv_blocks": 30, "gpu_memory_utilization": 0.5})
    with pytest.raises(ValueError, match=r"^prefill: gpu_memory_utilization=0.5 sizes the KV "
                                         r"pool, which kv_blocks=30 gives"):
        run(pd.DataFrame({"arrival_time": [0.0], "num_prompt_tokens": 8,
                          "num_output_tokens": 2}), SimConfig(disaggregation=d))
    # one found when the pool's KV pool is sized: vLLM's utilization in an SGLang pool
    d = Disaggregation(1, 1, decode={"scheduler": "sglang"})
    with pytest.raises(ValueError, match=r"^decode: gpu_memory_utilization=0.5 is vLLM's "
                                         r"setting: the 'sglang' scheduler"):
        run(pd.DataFrame({"arrival_time": [0.0], "num_prompt_tokens": 8,
                          "num_output_tokens": 2}),
            SimConfig(scheduler="vllm", gpu_memory_utilization=0.5, disaggregation=d))


@pytest.mark.parametrize("prefill, decode", [("static", "orca"), ("orca", "tensorrt-llm"),
                                             ("sglang", "continuous")])
def test_a_result_of_pools_with_their_own_schedulers_summarises(prefill, decode):
    """The Result keeps the run's resolved config (the default chunked scheduler's 512-token
    chunk filled in): its fleet() built each pool's config from it, and a pool whose scheduler
    takes no chunk size refused it, so summary() raised after a run that went well."""
    df = _df([0.0, 0.1, 0.2], [300, 200, 100], [5, 4, 3])
    d = Disaggregation(1, 2, prefill={"scheduler": prefill, "tensor_parallel": 2},
                       decode={"scheduler": decode})
    res = run(df, cost_model=COST, disaggregation=d)
    s = res.summary(slo={"ttft": 1.0})
    assert (s["num_finished"], s["num_replicas"], s["num_gpus"]) == (3, 3, 4)
    assert s["goodput_per_gpu"] == s["goodput"] / 4
    assert len(res.replica_summary()) == 3 and res.config.fleet() == (3, 4)


def test_a_replica_standing_by_decodes_a_landed_request_in_its_next_iteration():
    """A replica whose batch came out empty (its blocks wait on transfers) runs no iteration:
    a request landing then decodes in the next one, over its context plus the new token."""
    from sim.engine.core.policies import ContinuousBatching
    from sim.engine.core.replica import Replica
    from sim.engine.core.request import Request
    rep, schedule = Replica(10, 16, 4), ContinuousBatching().schedule
    landed = Request(0, "landed", 0.0, 64, 5)
    landed.num_computed, landed.num_generated = 64, 1
    assert rep.reserve(4) and not rep.reserve(7)
    rep.enqueue(Request(1, "waits", 0.0, 150, 5))  # 10 blocks: more than the 6 left
    empty = rep.form_batch(schedule, 0.0)
    assert not empty.prefills and not empty.num_decode_tokens
    rep.stand_by()
    rep.receive(landed)
    assert rep.num_in_transit == 0 and landed.decode_start == rep.iteration - 1
    batch = rep.form_batch(schedule, 0.5)
    assert (batch.num_decode_tokens, batch.decode_context_tokens) == (1, 65)
    rep.postprocess(0.6)
    assert rep.num_generated(landed) == 2


def test_random_routing_draws_the_decode_pool_from_its_own_stream():
    df = wl.synthetic(200, rate=5, prompt=wl.Uniform(10, 100), output=wl.Uniform(2, 20), seed=4)
    res = run(df, cost_model=COST, router="random", seed=7,
              disaggregation=Disaggregation(3, 3, link_bandwidth_gbps=math.inf))
    req = res.requests[res.requests["num_output_tokens"] > 1]
    assert not (req["replica"] - 3).equals(req["prefill_replica"])  # not the same draws
    again = run(df, cost_model=COST, router="random", seed=7,
                disaggregation=Disaggregation(3, 3, link_bandwidth_gbps=math.inf))
    pd.testing.assert_frame_equal(res.requests, again.requests)
    # a Random(7) instance routes as the name with seed 7, in both pools, run after run
    from sim.engine.fleet.routers import Random
    config = SimConfig(cost_model=COST, router=Random(7),
                       disaggregation=Disaggregation(3, 3, link_bandwidth_gbps=math.inf))
    for _ in range(2):
        pd.testing.assert_frame_equal(res.requests, run(df, config).requests)


def test_a_decode_replicas_load_counts_the_requests_routed_to_it_not_yet_landed():
    # a burst of prefills ending together: least_outstanding saw the decode replicas empty
    # until the first KV landed, so all 6 requests went to decode replica 0 (index 3)
    df = _df([0.0] * 6, [4000] * 6, [50] * 6)
    res = run(df, cost_model=COST, router="least_outstanding", check=True,
              disaggregation=Disaggregation(3, 3, link_bandwidth_gbps=1.0))
    assert sorted(res.requests["replica"].tolist()) == [3, 3, 4, 4, 5, 5]
    assert res.requests["kv_transfer_time"].min() > 0


def test_usage_is_measured_against_each_pools_own_size():
    df = wl.synthetic(200, rate=5, prompt=wl.Uniform(100, 800), output=wl.Uniform(20, 200),
                      seed=5)
    d = Disaggregation(1, 1, link_bandwidth_gbps=math.inf,
                       prefill={"kv_blocks": 4000, "max_batch_size": 16},
                       decode={"kv_blocks": 1000, "max_batch_size": 64})
    res = run(df, cost_model=COST, disaggregation=d)
    per = res.replica_summary()
    it = res.iterations
    for k, (blocks, slots) in enumerate([(4000, 16), (1000, 64)]):
        mine = it[it["replica"] == k]
        w = mine["duration"].to_numpy()
        assert per.loc[k, "kv_usage_mean"] == pytest.approx(
            w @ mine["kv_blocks_used"].to_numpy() / w.sum() / blocks)
        assert per.loc[k, "slot_utilization"] == pytest.approx(
            w @ mine["num_running"].to_numpy() / w.sum() / slots)
    s = res.summary()
    assert s["kv_usage_max"] == pytest.approx(max(
        it.loc[it["replica"] == 0, "kv_blocks_used"].max() / 4000,
        it.loc[it["replica"] == 1, "kv_blocks_used"].max() / 1000))
    busy = per["busy_fraction"].to_numpy()  # the summary's usage weighs replicas by busy time
    assert s["kv_usage_mean"] == pytest.approx(
        (per["kv_usage_mean"].to_numpy() @ busy) / busy.sum())


@pytest.mark.parametrize("model, kv, tp", [("llama-3.1-8b", "fp16", 1), ("llama-2-70b", "fp8", 4),
                                           ("deepseek-v3", "fp16", 8), ("mixtral-8x7b", 1.5, 2)])
def test_a_transfers_bytes_are_kv_cache_bytes_exactly(model, kv, tp):
    """The KV a transfer carries is ``kv_cache_bytes`` of its tokens (its factors read once,
    not per transfer: the same product, bit for bit)."""
    from sim.engine.fleet.disaggregation import Transfers

    class _Pool:
        replicas, requests = (), ()

        class config:
            tensor_parallel = tp
    t = Transfers(None, _Pool, _Pool, Disaggregation(1, 1), model, math.inf, kv_dtype=kv)
    for n in (0, 1, 15, 16, 4097, 123_457):
        expected = kv_cache_bytes(n, model=model, dtype=kv, tensor_parallel=tp)
        assert t.kv_bytes(n) == expected and type(t.kv_bytes(n)) is type(expected)
