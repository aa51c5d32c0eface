"""Routers: each named rule on hand-built replica states, and the checks on router settings."""

import numpy as np
import pytest

from sim.engine import SimConfig
from sim.engine.replica import Replica
from sim.engine.request import Request
from sim.engine.routers import (ROUTERS, PrefixAffinity, Random, ReplicaView, RoundRobin,
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


def _request(i=0, keys=None):
    r = Request(i, f"r{i}", 0.0, 64, 4)
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
                            "prefix_affinity"}
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
