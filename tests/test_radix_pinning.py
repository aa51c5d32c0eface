"""Radix caching: a partly matched last node is left unreferenced where pinning it would keep
its request out of the pool for good (sim.engine.kv.prefix_hits: ``_pins_past_pool``,
``_referenced_nodes``), and the admission then counts only the nodes it references. A random
property over small pools, pages, hash spans, schedulers, replicas and closed loops: no
empty batch while a request waits with nothing running, every request out once."""

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import sim
import workloads

SCHEDULERS = ["continuous", "chunked", "sarathi", "sglang", "vllm"]


def _df(rows, unit):
    """``(arrival, prompt, output, group)`` rows; group ``g``'s hash ids ``1000 g + j`` (a
    shared prefix within a group), ``unit`` tokens per id."""
    df = pd.DataFrame([(t, p, o, [g * 1000 + j for j in range(-(-p // unit))])
                       for t, p, o, g in rows],
                      columns=["arrival_time", "num_prompt_tokens", "num_output_tokens",
                               "hash_ids"])
    df.attrs["block_size"] = unit
    return df


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_hit_ending_inside_a_node_is_not_counted_as_pinned_when_left_unreferenced(scheduler):
    """Three prompts of one group in a 48-token pool (pages of 1, 8 tokens per id). Request 0
    (29 + 19 tokens: exactly the pool) comes back after a preemption with 17 tokens generated
    and nothing running; its hit is 29 tokens, ending 5 tokens into a full 8-token node.
    Referencing that node would pin 3 tokens it never uses (48 + 3 > 48), so admission leaves
    it unreferenced and computes the 5 tokens again - but it still counted the node's 8 pages
    as pinned (22 to compute + 32 pinned = 54 > 48) and refused: every request waited with
    nothing running, "formed an empty batch" (continuous, chunked, sarathi, vllm; SGLang's
    own budget never preempts here). Now it is admitted; nothing lost, the pool exact
    (check=True)."""
    df = _df([(0.0, 29, 19, 1), (0.0, 16, 25, 1), (0.0, 33, 8, 1)], 8)
    res = sim.run(df, scheduler=scheduler, prefix_caching="radix", block_size=1, kv_blocks=48,
                  cost_model=sim.ConstantCost(0.01), check=True)
    req = res.requests
    assert (req["status"] == "finished").all() and req["request_id"].tolist() == [0, 1, 2]
    if scheduler != "sglang":
        assert req["num_preemptions"].tolist() == [1, 1, 2]
        assert req["num_cached_tokens"].iloc[2] == 29


def test_the_reported_cluster_case_sarathi_two_replicas_closed_loop_of_three():
    """The issue's case: sarathi, 2 replicas behind least_outstanding, a closed loop of 3,
    48 pages of 1 token (16 tokens per id): one request waited alone in an empty batch."""
    df = _df([(0.53, 22, 26, 2), (0.70, 30, 18, 0), (0.74, 40, 4, 2)], 16)
    policy = sim.SimConfig(scheduler="sarathi", max_batch_size=4, chunk_size=16).policy()
    res = sim.run(df, scheduler=policy, prefix_caching="radix", block_size=1, kv_blocks=48,
                  max_batch_size=4, replicas=2, router="least_outstanding",
                  closed_loop=workloads.ClosedLoop(3, 0.05), check=True,
                  cost_model=sim.LinearCost(0.01, 1e-4, 2e-4, 1e-6))
    assert (res.requests["status"] == "finished").all()


class _NeverIdle:
    """Wraps a policy (a copy per replica): after each batch formed, a replica with requests
    waiting, nothing running and nothing loading has admitted something."""

    def __init__(self, name, **knobs):
        self.config = sim.SimConfig(scheduler=name, max_batch_size=4, **knobs)
        self.policy = self.config.policy()
        self.name = self.policy.name
        self.per = {}
        self.idle = 0

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def schedule(self, replica, now):
        policy = self.per.setdefault(id(replica), self.config.policy())
        policy.schedule(replica, now)
        if replica.waiting and not replica.running and not replica.num_loading:
            self.idle += 1


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(st.sampled_from([0.0, 0.1, 0.5]), st.integers(1, 60),
                               st.integers(-3, 30), st.integers(0, 2)), min_size=1, max_size=8),
       kv_tokens=st.integers(12, 64), page=st.sampled_from([1, 2, 4]),
       unit=st.sampled_from([4, 8, 16]), scheduler=st.sampled_from(SCHEDULERS),
       replicas=st.integers(1, 2), closed=st.sampled_from([None, 1, 3]))
def test_no_empty_batch_while_requests_wait_and_every_request_comes_out_once(
        rows, kv_tokens, page, unit, scheduler, replicas, closed):
    """An output of -k <= 0: the request fills the pool less k tokens (where pinning a node's
    unused pages decides whether it fits)."""
    rows = [(t, p, o if o > 0 else max(1, kv_tokens // page * page - p + o), g)
            for t, p, o, g in sorted(rows)]
    df = _df(rows, unit)
    knobs = {"chunk_size": 16} if scheduler in ("chunked", "sarathi", "vllm") else {}
    check = _NeverIdle(scheduler, **knobs)
    kv = kv_tokens // page
    fleet = dict(replicas=2, router="least_outstanding") if replicas > 1 else {}
    res = sim.run(df, scheduler=check, prefix_caching="radix", block_size=page, kv_blocks=kv,
                  max_batch_size=4, **fleet,
                  closed_loop=workloads.ClosedLoop(closed, 0.05) if closed else None,
                  cost_model=sim.LinearCost(0.01, 1e-4, 2e-4, 1e-6), check=True)
    req = res.requests
    assert req["request_id"].tolist() == list(range(len(df)))  # each once
    fits = -(-(df.num_prompt_tokens + df.num_output_tokens) // page) <= kv
    assert (req["status"] == "finished").tolist() == fits.tolist()
    assert check.idle == 0
