"""A cluster of replicas behind a router: nothing lost, one replica's exact results, and the
routers' effects the issue asks for (queueing theory's splitting rule, round robin vs random,
least outstanding on heavy tails, prefix affinity's hit rate)."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import workloads as wl
from sim.costs.simple import ConstantCost, LinearCost
from sim.engine import SimConfig, run
from sim.engine.fleet.cluster import delay_until
from sim.engine.fleet.disaggregation import Disaggregation

COST = LinearCost(0.02, 2e-5, 1e-4, 0.0)  # 20 ms per iteration + per-token terms
KEYS = ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99")


def _uniform(n, rate, seed):
    return wl.synthetic(n, rate=rate, prompt=wl.Uniform(100, 900), output=wl.Uniform(20, 200),
                        seed=seed)


@pytest.mark.parametrize("knobs", [{}, {"prefix_caching": "block"}, {"kv_blocks": 900}])
def test_everything_routed_to_one_replica_is_the_single_replica_run_exactly(knobs):
    df = wl.synthetic(1500, rate=30, prompt=wl.LogNormal(500, 1.0, max_tokens=4000),
                      output=wl.LogNormal(100, 1.0, max_tokens=1000), seed=1)
    one = run(df, max_batch_size=64, **knobs)
    three = run(df, max_batch_size=64, replicas=3, router=lambda r, views, now: 0, **knobs)
    assert (three.requests["replica"] == 0).all()
    pd.testing.assert_frame_equal(one.requests, three.requests)
    pd.testing.assert_frame_equal(one.iterations, three.iterations)
    a, b = one.summary(), three.summary()
    assert b["num_replicas"] == 3 and b["num_gpus"] == 3 and a["num_gpus"] == 1
    from sim.results.economics import KEYS  # the two idle replicas are paid for too
    for k in a:
        if k not in ("wall_seconds", "num_replicas", "num_gpus", "busy_fraction", *KEYS):
            assert a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]), k
    assert b["usd_per_hour"] == pytest.approx(3 * a["usd_per_hour"])
    assert b["usd_per_million_output_tokens"] == pytest.approx(
        3 * a["usd_per_million_output_tokens"])
    per = three.replica_summary()
    assert b["busy_fraction"] == pytest.approx(a["busy_fraction"] / 3)
    assert per["num_requests"].tolist() == [1500, 0, 0]
    assert per.loc[0, "busy_fraction"] == pytest.approx(a["busy_fraction"])
    assert per.loc[1, "num_iterations"] == 0 and per.loc[0, "load_share"] == 1.0


def test_a_request_is_never_scheduled_before_it_arrives_whatever_the_rounding():
    """0.134 + (1.389 - 0.134) is 1.3889999999999998: the dispatcher fired that early and the
    request was routed and scheduled one ulp before its arrival (check=True: InvariantError)."""
    df = pd.DataFrame({"arrival_time": [0.134, 1.389], "num_prompt_tokens": [10, 10],
                       "num_output_tokens": [3, 3]})
    one = run(df, cost_model=ConstantCost(0.01), check=True)
    for kw in ({"replicas": 2}, {"disaggregation": Disaggregation(1, 1)},
               {"replicas": 3, "router": lambda r, views, now: 0}):
        req = run(df, cost_model=ConstantCost(0.01), check=True, **kw).requests
        assert (req["first_scheduled_time"] >= req["arrival_time"]).all()
        if "router" in kw:
            pd.testing.assert_frame_equal(one.requests, req)


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 1e7), st.floats(0, 1e7), st.integers(0, 3))
def test_delay_until_lands_on_the_time_or_the_first_float_after_it(now, t, ulps):
    now, t = min(now, t), max(now, t)
    if ulps:  # a time a few floats after now (one ulp of 1.0: 2**52 steps of the delay's ulp)
        t = now
        for _ in range(ulps):
            t = math.nextafter(t, math.inf)
    d = delay_until(now, t)
    assert now + d >= t  # never before t; at t, or the first reachable float after it
    assert now + d == t or now + math.nextafter(d, 0) < t


def test_random_routing_over_four_replicas_at_four_times_the_rate_matches_one_replica():
    """Random splitting of a Poisson stream gives each replica a Poisson stream of a quarter
    of the rate (the splitting property): each replica is a one-replica run at 1x."""
    one = run(_uniform(4000, 8.0, 0), cost_model=COST, max_batch_size=256).summary()
    four = run(_uniform(16000, 32.0, 100), cost_model=COST, max_batch_size=256, replicas=4,
               router="random").summary()
    for k in KEYS:
        assert four[k] == pytest.approx(one[k], rel=0.05), k
    assert four["busy_fraction"] == pytest.approx(one["busy_fraction"], rel=0.02)


def test_round_robin_gives_a_lower_p99_ttft_than_random_at_high_load():
    df = _uniform(3000, 48.0, 1)
    rr = run(df, cost_model=COST, max_batch_size=256, replicas=4, router="round_robin")
    rnd = run(df, cost_model=COST, max_batch_size=256, replicas=4, router="random")
    assert rr.summary()["ttft_p99"] < 0.7 * rnd.summary()["ttft_p99"]
    assert rr.replica_summary()["num_requests"].tolist() == [750] * 4


def test_least_outstanding_beats_round_robin_on_heavy_tailed_requests():
    df = wl.synthetic(4000, rate=40, prompt=wl.LogNormal(500, 2.0, max_tokens=16000),
                      output=wl.LogNormal(100, 2.0, max_tokens=4000), seed=0)
    s = {router: run(df, cost_model=COST, max_batch_size=32, replicas=4,
                     router=router).summary() for router in ("round_robin", "least_outstanding")}
    assert s["least_outstanding"]["ttft_p99"] < 0.5 * s["round_robin"]["ttft_p99"]
    assert s["least_outstanding"]["e2e_p50"] < s["round_robin"]["e2e_p50"]


def test_prefix_affinity_raises_the_hit_rate_on_a_multi_tenant_workload():
    """16 tenants' 2,000-token system prompts (125 blocks each) do not all fit one replica's
    1,000-block pool; routing each tenant to one replica keeps its prefix cached there."""
    df = wl.shared_prefix(800, n_groups=16, system_prompt_tokens=2000,
                          user_tokens=wl.Uniform(50, 200), output=wl.Uniform(20, 100), rate=20)
    s = {router: run(df, cost_model=COST, max_batch_size=64, replicas=4, router=router,
                     prefix_caching="block", kv_blocks=1000)
         for router in ("round_robin", "prefix_affinity")}
    rr, pa = s["round_robin"].summary(), s["prefix_affinity"].summary()
    ideal = wl.ideal_prefix_hit_rate(df)
    assert rr["prefix_hit_rate"] < 0.6 < 0.85 * ideal < pa["prefix_hit_rate"] <= ideal
    assert pa["ttft_p50"] < rr["ttft_p50"]
    per = s["prefix_affinity"].replica_summary()
    assert (per["prefix_hit_rate"] > 0.8).all() and per["num_requests"].sum() == 800


def test_cache_aware_keeps_a_burst_where_prefix_affinity_spreads_it():
    """Eight copies of one 2,048-token prompt at once on 4 replicas: SGLang's router records
    the prefix when it routes it, so all 8 go to one replica and 7 find it cached (hit rate
    7 x 2,032 / (8 x 2,048) = 86.8 %: the last block is computed); prefix_affinity reads the
    replicas' caches, empty until a prefill ends, and spreads them (4 computed twice: 49.6 %)."""
    df = pd.DataFrame({"arrival_time": np.zeros(8), "num_prompt_tokens": 2048,
                       "num_output_tokens": 16, "hash_ids": [list(range(4))] * 8})
    df.attrs["block_size"] = 512
    res = {router: run(df, cost_model=COST, replicas=4, router=router, scheduler="vllm",
                       kv_blocks=1000) for router in ("prefix_affinity", "cache_aware")}
    per = {k: r.replica_summary()["num_requests"].tolist() for k, r in res.items()}
    assert per == {"prefix_affinity": [2, 2, 2, 2], "cache_aware": [8, 0, 0, 0]}
    hit = {k: r.summary()["prefix_hit_rate"] for k, r in res.items()}
    assert hit["cache_aware"] == pytest.approx(7 * 2032 / (8 * 2048))
    assert hit["prefix_affinity"] == pytest.approx(4 * 2032 / (8 * 2048))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 40), replicas=st.integers(1, 5),
       router=st.sampled_from(["round_robin", "random", "least_outstanding", "least_kv",
                               "prefix_affinity", "cache_aware"]),
       scheduler=st.sampled_from(["continuous", "chunked", "static", "sglang"]),
       kv_blocks=st.integers(4, 60), closed=st.booleans(), seed=st.integers(0, 3))
def test_nothing_is_lost_whatever_the_cluster(n, replicas, router, scheduler, kv_blocks,
                                              closed, seed):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"arrival_time": np.sort(rng.uniform(0, 2, n)).round(2),
                       "num_prompt_tokens": rng.integers(1, 300, n),
                       "num_output_tokens": rng.integers(1, 60, n)})
    closed_loop = wl.ClosedLoop(3, 0.05) if closed else None
    res = run(df, scheduler=scheduler, cost_model=ConstantCost(0.01), max_batch_size=8,
              kv_blocks=kv_blocks, replicas=replicas, router=router, seed=seed,
              closed_loop=closed_loop)
    req = res.requests
    assert len(req) == n and req["request_id"].is_unique
    assert req["status"].isin(["finished", "rejected"]).all()
    assert req["replica"].between(0, replicas - 1).all()
    assert set(res.iterations["replica"]) <= set(range(replicas))
    per = res.replica_summary()
    assert per["num_requests"].sum() == n and len(per) == replicas
    fin = req[req["status"] == "finished"]
    # ITL invariant per finished request: n - 1 gaps summing to E2E - TTFT
    assert len(res.itl()) == int((fin["num_output_tokens"] - 1).sum())
    assert res.itl().sum() == pytest.approx(float((fin["e2e"] - fin["ttft"]).sum()), abs=1e-9)
    assert (fin["ttft"] >= 0).all()


def test_same_seed_same_cluster_result_bit_for_bit():
    df = _uniform(500, 40.0, 3)
    a, b = (run(df, cost_model=COST, replicas=3, router="random", seed=5) for _ in range(2))
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.iterations, b.iterations)
    c = run(df, cost_model=COST, replicas=3, router="random", seed=6)
    assert not a.requests["replica"].equals(c.requests["replica"])


def test_a_router_returning_a_bad_index_is_an_error():
    df = _uniform(5, 1.0, 0)
    with pytest.raises(ValueError, match="expected a replica index in 0..1"):
        run(df, replicas=2, router=lambda r, views, now: 2)


def test_goodput_per_gpu_counts_replicas_times_tensor_parallel():
    df = _uniform(300, 20.0, 0)
    s = run(df, cost_model=COST, replicas=2, tensor_parallel=2).summary(slo={"ttft": 1.0})
    assert s["num_gpus"] == 4
    assert s["goodput_per_gpu"] == pytest.approx(s["goodput"] / 4)
    assert SimConfig(replicas=3).replicas == 3


def test_a_cluster_run_with_a_progress_bar_gives_the_same_result(capsys):
    df = _uniform(200, 20.0, 0)
    a = run(df, cost_model=COST, replicas=2)
    b = run(df, cost_model=COST, replicas=2, progress=True)
    pd.testing.assert_frame_equal(a.requests, b.requests)


def test_a_request_is_never_routed_before_it_arrives():
    """now + (t - now) can land an ulp short of t: the dispatcher waits until t itself (the
    invariant checks found a request scheduled 1 ulp before its arrival)."""
    from sim.engine.fleet.cluster import delay_until
    now, t = 0.05092723418683988, 0.1806779839308437
    assert now + (t - now) < t  # the float trap
    assert now + delay_until(now, t) >= t and delay_until(t, now) == 0.0
    df = pd.DataFrame({"arrival_time": [now, t], "num_prompt_tokens": [1, 1],
                       "num_output_tokens": [1, 1]})
    res = run(df, scheduler="chunked", replicas=2, router="least_kv", kv_blocks=6,
                  block_size=1, cost_model=LinearCost(0.01, 1e-4, 2e-4, 1e-6), check=True)
    req = res.requests
    assert (req["ttft"] > 0).all()
