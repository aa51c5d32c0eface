"""Routers: each named rule on hand-built replica states, and the checks on router settings."""

import numpy as np
import pytest

from sim.engine import SimConfig
from sim.engine.core.replica import Replica
from sim.engine.core.request import Request
from sim.engine.fleet.routers import (ROUTERS, PrefixAffinity, Random, ReplicaView, RoundRobin,
                                least_kv, least_outstanding, make_router)


def _views(loads=(0, 0, 0), kv_blocks=100, caching=False):
    """Replicas with ``loads[k]`` queued requests each (one KV block per request)."""
    views = []
    for k, load in enumerate(loads):
        rep = Replica(kv_blocks, 16, 8, prefix_caching=caching)
        for j in range(load):
            rep.enqueue(Request(100 * k + j, f"q{k}.{j}", 0.0, 10, 2))
        views.append(ReplicaView(rep, k))
    return tuple(views)


def _request(i=0, keys=None, prompt=64):
    r = Request(i, f"r{i}", 0.0, prompt, 4)
    r.block_keys = keys
    return r


def test_round_robin_cycles_through_the_replicas():
    route, views = RoundRobin(), _views((5, 0, 9))
    assert [route(_request(i), views, 0.0) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_random_is_uniform_and_seeded():
    views = _views((0, 0, 0, 0))
    a, b = Random(7), Random(7)
    seq_a = [a(_request(i), views, 0.0) for i in range(4000)]
    assert seq_a == [b(_request(i), views, 0.0) for i in range(4000)]
    counts = [seq_a.count(k) for k in range(4)]
    assert all(abs(c - 1000) < 4 * (4000 * 0.25 * 0.75) ** 0.5 for c in counts), counts


def test_least_outstanding_and_least_kv_pick_the_emptiest_lowest_index_on_ties():
    views = _views((3, 1, 1, 4))
    assert least_outstanding(_request(), views, 0.0) == 1
    assert [v.num_outstanding for v in views] == [3, 1, 1, 4]
    # least_kv reads free blocks: take blocks on replicas 0 and 2
    views[0]._replica.blocks.allocate(30)
    views[2]._replica.blocks.allocate(10)
    assert least_kv(_request(), views, 0.0) == 1
    views[1]._replica.blocks.allocate(20)
    assert least_kv(_request(), views, 0.0) == 3


def test_prefix_affinity_follows_the_longest_cached_prefix_unless_overloaded():
    views = _views((2, 0, 0), caching=True)
    keys = np.array([11, 12, 13, 14])  # key ids
    for view in views:
        view._replica.blocks.lookup(keys)  # (room for them)
    views[0]._replica.blocks.register(keys[:3])  # replica 0 caches 3 leading blocks
    views[0]._replica.blocks.release(keys[:3], 0)
    views[2]._replica.blocks.register(keys[:1])
    views[2]._replica.blocks.release(keys[:1], 0)
    assert views[0].prefix_hit(_request(keys=keys)) == 48
    assert PrefixAffinity()(_request(keys=keys), views, 0.0) == 0
    # replica 0 has 2 more outstanding than the least loaded: over a threshold of 1
    assert PrefixAffinity(max_imbalance=1)(_request(keys=keys), views, 0.0) == 2
    assert PrefixAffinity(max_imbalance=1)(_request(keys=np.array([99])), views, 0.0) == 1  # no hit
    with pytest.raises(ValueError, match="max_imbalance"):
        PrefixAffinity(max_imbalance=-1)


def test_a_view_is_read_only():
    view = _views((1,))[0]
    with pytest.raises(AttributeError):
        view.num_outstanding = 0
    with pytest.raises(AttributeError):
        view.replica = None
    assert "outstanding=1" in repr(view)


def test_router_settings_are_checked_with_a_hint():
    with pytest.raises(ValueError, match="did you mean 'round_robin'"):
        SimConfig(router="round-robin")
    with pytest.raises(TypeError, match="router must be"):
        SimConfig(router=3)
    with pytest.raises(ValueError, match="replicas must be > 0"):
        SimConfig(replicas=0)
    assert set(ROUTERS) == {"round_robin", "random", "least_outstanding", "least_kv",
                            "prefix_affinity", "cache_aware"}
    assert make_router("least_kv") is least_kv
    rr = make_router("round_robin")
    assert rr is not make_router("round_robin")  # fresh state every run


def test_an_object_with_a_route_method_is_a_router():
    """``SimConfig(router=obj)`` with ``obj.route(request, replicas, now)``: every request goes
    where the method says, in a run (here: all to the last replica)."""
    import workloads
    from sim import ConstantCost, run

    class Last:
        def __init__(self):
            self.calls = 0

        def route(self, request, replicas, now):
            self.calls += 1
            return len(replicas) - 1

    last = Last()
    assert make_router(last) == last.route
    df = workloads.load("azure-code", n=30)
    res = run(df, cost_model=ConstantCost(0.01), replicas=3, router=last)
    assert last.calls == 30
    assert res.replica_summary()["num_requests"].tolist() == [0, 0, 30]
    with pytest.raises(TypeError, match="or an object with that route method"):
        SimConfig(router=type("NoRoute", (), {"route": 3})())


def _route_all(route, views, requests, now=0.0):
    """Route each request and queue it where it went (as the engine does): the choices."""
    out = []
    for r in requests:
        k = route(r, views, now)
        views[k]._replica.enqueue(r)
        out.append(k)
    return out


def test_cache_aware_keeps_a_burst_of_one_prompt_on_one_replica_until_imbalanced():
    # SGLang's router records a prefix when it routes it: 40 copies of one prompt arriving
    # together go to the first replica (its tree matches all of it, rate 1 > 0.5) until it has
    # 33 more outstanding than the least loaded (> balance_abs_threshold 32, > min * 1.0001);
    # then the least loaded, lowest index first; once balanced again (33 - 1 = 32), the best
    # match, the less loaded of the tied trees
    from sim.engine.fleet.routers import CacheAware
    views = _views((0, 0, 0, 0))
    same = [_request(i, np.array([7, 8, 9, 10])) for i in range(40)]
    got = _route_all(CacheAware(), views, same)
    assert got[:33] == [0] * 33
    assert got[33:36] == [1, 2, 3]
    assert got[36:] == [1, 2, 3, 1]
    # prefix_affinity reads the replicas' caches, empty until a prefill: it spreads the burst
    views = _views((0, 0, 0, 0), caching=True)
    for v in views:
        v._replica.blocks.lookup(np.array([7, 8, 9, 10]))
    pa = _route_all(PrefixAffinity(), views, [_request(i, np.array([7, 8, 9, 10]))
                                              for i in range(8)])
    assert pa == [0, 1, 2, 3, 0, 1, 2, 3]


def test_cache_aware_sends_an_unmatched_prompt_to_the_smallest_tree():
    from sim.engine.fleet.routers import CacheAware
    route, views = CacheAware(), _views((0, 0, 0))
    # distinct prompts: no match, so the smallest tree (ties: less loaded, lower index)
    got = _route_all(route, views, [_request(i, np.arange(10 * i, 10 * i + n))
                                    for i, n in enumerate((5, 2, 3, 1))])
    assert got == [0, 1, 2, 1]  # trees of 5, 2, 3 blocks: the 2-block one is smallest
    assert [len(t) for t in route.trees] == [5, 3, 3]
    # half of a prompt matched is not more than cache_threshold 0.5: the smallest tree
    half = _request(9, np.array([0, 1, 99, 98]))
    assert route(half, views, 0.0) == 2  # (trees 5, 3, 3: the less loaded of the two 3s)
    three = _request(10, np.array([0, 1, 2, 97]))  # 3 of 4 matched on replica 0: 0.75 > 0.5
    assert route(three, views, 0.0) == 0


def test_cache_aware_evicts_least_recently_used_leaves_every_interval():
    from sim.engine.fleet.routers import CacheAware
    views = _views((0, 0))
    route = CacheAware(eviction_interval=10.0, max_tree_tokens=16 * 3)  # 3 blocks of 16
    route(_request(0, np.array([1, 2, 3, 4])), views, 0.0)
    assert list(route.trees[0]) == [4, 3, 2, 1]  # leaves first: least recently used
    route(_request(1, np.array([1, 2, 5]), 48), views, 1.0)  # 32 of 48 tokens: > 0.5
    assert list(route.trees[0]) == [4, 3, 5, 2, 1]
    route(_request(2, np.array([50])), views, 10.0)  # the interval is up: evict first
    assert list(route.trees[0]) == [5, 2, 1] and list(route.trees[1]) == [50]
    # blocks 3 and 4 were evicted: 2 of 4 matched is not > 0.5, so the smallest tree serves
    # it (replica 1's, 1 block); without the eviction replica 0 matched all 4
    assert route(_request(3, np.array([1, 2, 3, 4])), views, 11.0) == 1


def test_cache_aware_match_rate_is_of_the_whole_prompt_not_of_its_keys():
    # SGLang divides the matched text by the whole request text: a 64-token prompt whose
    # hash_ids name only its first 32 tokens (2 keys of 16) matches 32 / 64 = 0.5 at best, not
    # 2 / 2 keys: not above cache_threshold, so the smallest tree serves it
    from sim.engine.fleet.routers import CacheAware
    route, views = CacheAware(), _views((0, 0))
    assert route(_request(0, np.array([1, 2])), views, 0.0) == 0
    assert route(_request(1, np.array([1, 2])), views, 0.0) == 1
    # 3 keys of 16 in a 64-token prompt: 48 / 64 = 0.75 matched on replica 0
    assert route(_request(2, np.array([1, 2, 3])), views, 0.0) == 0
    assert route(_request(3, np.array([1, 2, 3])), views, 0.0) == 0


def test_cache_aware_match_rate_counts_a_radix_hash_ids_tokens():
    # radix mode keys one node per hash id (512 tokens here): 600-token prompts sharing their
    # first id match 512 / 600 tokens (SGLang: > 0.5, the same replica), not 1 of 2 ids (0.5,
    # which spread them over the smallest trees)
    import pandas as pd
    from sim.engine import run
    n = 12
    df = pd.DataFrame({"request_id": [f"r{i}" for i in range(n)],
                       "arrival_time": np.arange(n) * 0.001, "num_prompt_tokens": [600] * n,
                       "num_output_tokens": [20] * n, "hash_ids": [[0, 100 + i] for i in range(n)]})
    df.attrs["block_size"] = 512
    for mode in ("radix", "block"):
        res = run(df, SimConfig(replicas=4, router="cache_aware", prefix_caching=mode))
        assert res.requests["replica"].tolist() == [0] * n, mode


def test_cache_aware_evicts_at_the_interval_ticks_not_an_interval_after_a_late_request():
    # SGLang's eviction thread wakes every eviction_interval from the start (10, 20, 30, ...):
    # a request at 19 sees the tick of 10, one at 21 the tick of 20 (not 19 + 10)
    from sim.engine.fleet.routers import CacheAware
    route, views = CacheAware(eviction_interval=10.0, max_tree_tokens=16), _views((0, 0))
    route(_request(0, np.array([1, 2])), views, 9.0)
    assert [len(t) for t in route.trees] == [2, 0]
    assert route(_request(1, np.array([5, 6])), views, 19.0) == 1  # tick 10: tree 0 -> 1 key
    assert [len(t) for t in route.trees] == [1, 2]
    route(_request(2, None), views, 21.0)  # tick 20: tree 1 -> 1 key (no keys to record)
    assert [len(t) for t in route.trees] == [1, 1]


def test_cache_aware_a_match_below_the_threshold_still_refreshes_the_matched_path():
    # SGLang's prefix_match stamps the matched tenant's path as used before the rate is
    # compared: its prefix then outlives older leaves at eviction
    from sim.engine.fleet.routers import CacheAware
    route = CacheAware(eviction_interval=10.0, max_tree_tokens=16 * 2)
    views = _views((0, 0))
    assert route(_request(0, np.array([5, 6]), 32), views, 0.0) == 0
    assert route(_request(1, np.array([7, 8, 9]), 48), views, 1.0) == 1
    assert route(_request(2, np.array([1, 2]), 32), views, 2.0) == 0  # tree 0: 2 < 3 keys
    # block 5 matched on replica 0: 16 of 64 tokens, not > 0.5: the smaller tree 1 serves it
    assert route(_request(3, np.array([5, 40, 41, 42])), views, 3.0) == 1
    assert list(route.trees[0]) == [6, 2, 1, 5]
    route(_request(4, None), views, 10.0)  # evict to 2 keys: leaves 6 then 2 (5 was used)
    assert list(route.trees[0]) == [1, 5]


def test_cache_aware_instance_keeps_separate_trees_per_pool_of_replicas():
    # a disaggregated run calls one router instance for its 2 prefill and 3 decode replicas:
    # each pool has trees of its own (before, the decode pool shared the prefill pool's 2
    # trees, so its third replica was never chosen and prefill records steered decodes)
    from sim.engine.fleet.routers import CacheAware
    route, prefill, decode = CacheAware(), _views((0, 0)), _views((0, 0, 0))
    assert [route(_request(i, np.array([i]), 16), prefill, 0.0) for i in (1, 2)] == [0, 1]
    assert [route(_request(i, np.array([i]), 16), decode, 0.0) for i in (1, 2, 3)] == [0, 1, 2]
    assert [len(t) for t in route.trees] == [1, 1, 1]
    assert route(_request(9, np.array([2]), 16), prefill, 0.0) == 1  # its record of prompt 2


def test_cache_aware_instance_pickles_with_its_settings_and_no_trees():
    # a sweep sends its configs to worker processes: the router pickles (its weakly keyed
    # per-pool trees stay behind) and routes as a fresh one with the same settings
    import pickle
    from sim.engine.fleet.routers import CacheAware
    route, views = CacheAware(cache_threshold=0.2, eviction_interval=7.0), _views((0, 0))
    route(_request(0, np.array([1, 2, 3])), views, 8.0)
    copy = pickle.loads(pickle.dumps(route))
    assert (copy.cache_threshold, copy.eviction_interval, copy.trees) == (0.2, 7.0, None)
    views = _views((0, 0))
    assert copy(_request(1, np.array([9])), views, 0.0) == 0  # empty trees: the lowest index
    assert copy(_request(2, np.array([1, 2, 3])), views, 0.0) == 1  # no record of run one


def test_router_objects_with_settings_are_told_apart_by_their_repr():
    # a sweep keys each grid value by its repr (addresses dropped): two CacheAware settings
    # had one key, "<sim.engine.fleet.routers.CacheAware object>", and shared one point's result
    import workloads
    from sim.engine.fleet.routers import CacheAware
    from sim.tools.sweep import sweep
    assert repr(PrefixAffinity(4)) == "PrefixAffinity(max_imbalance=4)"
    assert repr(CacheAware(cache_threshold=0.3)) == (
        "CacheAware(cache_threshold=0.3, balance_abs_threshold=32, balance_rel_threshold=1.0001, "
        "eviction_interval=60.0, max_tree_tokens=4194304)")
    df = workloads.shared_prefix(60, n_groups=4, system_prompt_tokens=64, rate=60, seed=0,
                                 user_tokens=workloads.LogNormal(64, 1.0, max_tokens=256),
                                 output=workloads.LogNormal(8, 1.0, max_tokens=32))
    # prompts of 64 shared + ~64 own tokens: a match near 0.5, which the thresholds split
    low, high = CacheAware(cache_threshold=0.1), CacheAware(cache_threshold=0.9)
    table = sweep(df, {"router": [low, high]}, base=SimConfig(replicas=3, prefix_caching="block"),
                  workers=1, progress=False)
    assert list(map(repr, table["router"])) == [repr(low), repr(high)]
    assert table["prefix_hit_rate"].nunique() == 2


class _Counting(RoundRobin):
    """A user's round robin (a subclass): copied fresh as RoundRobin itself is."""


class _Drawing(Random):
    pass


@pytest.mark.parametrize("make", [RoundRobin, lambda: Random(7), _Counting,
                                  lambda: _Drawing(7)])
def test_round_robin_and_random_instances_start_each_run_afresh(make):
    # SimConfig(router=Random(7)) ran the second time from where the first run's generator
    # stopped (and a RoundRobin from its counter): same config, same seed, other routing;
    # (review9) so did an instance of a subclass ([2, 0, 1, 2, 0] the second time)
    import pandas as pd
    from sim.engine import run
    df = pd.DataFrame({"arrival_time": np.arange(5) * 0.01, "num_prompt_tokens": 32,
                       "num_output_tokens": 4})
    config = SimConfig(replicas=3, router=make())
    first = run(df, config).requests["replica"].tolist()
    assert run(df, config).requests["replica"].tolist() == first
    if isinstance(config.router, RoundRobin):
        assert first == [0, 1, 2, 0, 1]
    else:  # the instance's own seed, as the name's "random" with seed=7
        assert first == run(df, SimConfig(replicas=3, router="random", seed=7)
                            ).requests["replica"].tolist()


@pytest.mark.parametrize("make", [_Counting, lambda: _Drawing(7)])
def test_a_subclass_instance_routes_each_pool_of_a_disaggregated_run_afresh(make):
    # (review9) a subclass of RoundRobin was used as is: the prefill and decode pools shared
    # one counter (prefill replicas 0, 1, 1, 1, 1)
    import math
    import pandas as pd
    from sim.engine import Disaggregation, run
    df = pd.DataFrame({"arrival_time": np.arange(5) * 0.01, "num_prompt_tokens": 32,
                       "num_output_tokens": 4})
    d = Disaggregation(2, 3, link_bandwidth_gbps=math.inf)
    router = make()
    plain = RoundRobin() if isinstance(router, RoundRobin) else Random(7)
    got = run(df, SimConfig(router=router, disaggregation=d)).requests
    pd.testing.assert_frame_equal(got, run(df, SimConfig(router=plain, disaggregation=d)
                                           ).requests)
    if isinstance(router, RoundRobin):
        assert got["prefill_replica"].tolist() == [0, 1, 0, 1, 0]


def test_a_sweep_tells_random_seeds_apart():
    # (review9) a grid of Random(1), Random(2), Random(3) read as one value (each repr was
    # '<...Random object>' once the address is dropped): three rows of one point's result
    import pandas as pd
    from sim.engine import run
    from sim.tools.sweep import sweep
    df = pd.DataFrame({"arrival_time": np.arange(9) * 0.01, "num_prompt_tokens": 32,
                       "num_output_tokens": 4})
    routers = [Random(1), Random(2), Random(3)]
    table = sweep(df, {"router": routers}, base=SimConfig(replicas=3), workers=1,
                  progress=False)
    assert list(map(repr, table["router"])) == ["Random(seed=1)", "Random(seed=2)",
                                                "Random(seed=3)"]
    want = [run(df, SimConfig(replicas=3, router=r)).summary()["ttft_mean"] for r in routers]
    assert table["ttft_mean"].tolist() == want and len(set(want)) == 3
    assert repr(RoundRobin()) == "RoundRobin()" and repr(Random([1, 2])) == "Random(seed=[1, 2])"


@pytest.mark.parametrize("seed", [None, -1, 1.5, "7", np.random.SeedSequence(4),
                                  np.random.default_rng(5), [1, None]])
def test_random_takes_an_int_seed_or_a_sequence_of_them(seed):
    # (review9) Random(None) drew from fresh entropy (a run not repeatable) and, like a
    # SeedSequence or a Generator, broke a disaggregated run with "object of type 'NoneType'
    # has no len()"; a Generator was shared by every copy (runs went on from each other)
    with pytest.raises((TypeError, ValueError), match=r"^Random seed must be an int >= 0 or a "
                                                      r"sequence of them"):
        Random(seed)
    assert Random(np.int64(3)).seed == 3 and Random((1, 2)).seed == [1, 2]


def test_cache_aware_instance_starts_each_run_empty():
    # SimConfig(router=CacheAware(...)) is how a user sets its thresholds: a second run with the
    # instance must route as a fresh one does, not from the trees the first run left
    import workloads
    from sim.engine import run
    from sim.engine.fleet.routers import CacheAware
    def wl(seed):
        return workloads.shared_prefix(200, n_groups=8, system_prompt_tokens=500, rate=60,
                                       user_tokens=workloads.LogNormal(100, 1.5, max_tokens=2000),
                                       output=workloads.LogNormal(50, 1.0, max_tokens=500),
                                       seed=seed)
    config = SimConfig(replicas=4, router=CacheAware(), prefix_caching="block")
    run(wl(0), config)
    again = run(wl(1), config).requests
    fresh = run(wl(1), SimConfig(replicas=4, router="cache_aware", prefix_caching="block"))
    assert again["replica"].tolist() == fresh.requests["replica"].tolist()
    assert again.equals(fresh.requests)


@pytest.mark.parametrize("kw,match", [
    (dict(cache_threshold=1.5), "cache_threshold"), (dict(cache_threshold=-0.1), "cache_threshold"),
    (dict(balance_rel_threshold=0.5), "balance_rel_threshold"),
    (dict(balance_abs_threshold=-1), "balance_abs_threshold"),
    (dict(balance_abs_threshold=2.5), "balance_abs_threshold"),
    (dict(eviction_interval=float("inf")), "eviction_interval"),
    (dict(max_tree_tokens=True), "max_tree_tokens")])
def test_cache_aware_refuses_bad_settings_naming_them(kw, match):
    from sim.engine.fleet.routers import CacheAware
    with pytest.raises(ValueError, match=match):
        CacheAware(**kw)
