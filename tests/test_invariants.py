"""Every feature at once under random inputs (the reliability property): any scheduler or
preset, prefix caching on or off, speculative decoding on or off, open or closed loop, tight or
roomy KV pools, one replica, a cluster behind any router, or prefill/decode pools. Nothing is
lost, every request comes out once (finished, or rejected with a reason exactly when it can
never fit), the KV pool is exact every iteration on every replica (shared cached blocks counted
once), every token is emitted once, ITL sums to E2E - TTFT, and the same inputs give the same
output bit for bit.

The default run draws 150 examples; ``SIM_THOROUGH=1 pytest -m slow tests/test_invariants.py``
runs the same property on 1,000 (README, "Errors and limits")."""

import copy
import os

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import sim
import workloads
from sim.checks import declared_with
from sim.engine.fleet.disaggregation import Disaggregation
from sim.engine.core.invariants import InvariantError
from sim.engine.core.request import FINISHED
from sim.engine.fleet.routers import ROUTERS
from sim.engine.schedulers import POLICIES


def prefill_tokens(r) -> int:
    """Tokens ``r``'s prefill completions emitted: one per token run, unless the run follows a
    point - a first token emitted in a prefill-only iteration (SGLang), which is that token."""
    segs = r.segments
    return sum(1 for k, (a, _b) in enumerate(segs) if a < 0 or k == 0 or segs[k - 1][0] >= 0)


class _Check:
    """Wraps a policy and counts the batches it forms (the engine itself checks the pool and
    the running set after each: ``SimConfig(check=True)``, sim.engine.core.invariants). Each replica
    gets its own copy of the policy (SGLang's state is per replica), as a named scheduler
    would."""

    def __init__(self, policy):
        self.policy, self.name, self.checks = policy, policy.name, 0
        self.replicas = {}  # id(replica) -> (replica, its policy)

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def schedule(self, replica, now):
        if id(replica) not in self.replicas:
            self.replicas[id(replica)] = (replica, copy.deepcopy(self.policy))
        self.replicas[id(replica)][1].schedule(replica, now)
        self.checks += 1

    @property
    def quiet_when_decoding(self) -> bool:
        """Fast-forwarded where the policy it wraps would be (the engine then checks the
        invariants after each stretch's segments, not only after each batch formed)."""
        return declared_with(self.policy, "quiet_when_decoding", "schedule")

    def decoded_quietly(self, replica, n):
        hook = getattr(self.replicas[id(replica)][1], "decoded_quietly", None)
        if hook is not None:
            hook(replica, n)


def _workload(rows, bs):
    df = pd.DataFrame([(t, p, o, [hash((g, j)) & 0xFFFFFF for j in range(-(-p // bs))])
                       for t, p, o, g in sorted(rows)],
                      columns=["arrival_time", "num_prompt_tokens", "num_output_tokens",
                               "hash_ids"])
    df.attrs["block_size"] = bs
    return df


specs = st.one_of(
    st.none(),
    st.builds(lambda k, a: sim.SpeculativeConfig(num_speculative_tokens=k, acceptance_rate=a,
                                                  draft_cost_ratio=0.1),
              st.integers(1, 4), st.floats(0, 1)),
    st.builds(lambda w: sim.SpeculativeConfig(num_speculative_tokens=2, method="ngram",
                                              acceptance_lengths=[w, (1 - w) / 2, (1 - w) / 2]),
              st.floats(0, 1)))


features = dict(
    rows=st.lists(st.tuples(st.floats(0, 2), st.integers(1, 80), st.integers(1, 40),
                            st.integers(0, 2)), min_size=1, max_size=20),
    sched=st.sampled_from(sorted(POLICIES)), caching=st.sampled_from([False, "block", "radix"]),
    spec=specs,
    kv_blocks=st.integers(6, 60), block_size=st.sampled_from([1, 4, 16]),
    closed=st.sampled_from([None, 1, 3]), seed=st.integers(0, 2),
    fleet=st.one_of(st.just(1), st.integers(2, 3), st.tuples(st.integers(1, 2),
                                                             st.integers(1, 2))),
    router=st.sampled_from(sorted(ROUTERS)),
    tiers=st.sampled_from([None, "one", "lru", "arc", "write_through", "selective"]))

# offload tiers (sim.engine.kv.tiers; radix mode kv.radix_tiers): tiny ones (a 16-token block of the default
# model is 2 MB), slow enough that loads overlap iterations
_TIER = dict(read_gbps=0.5, latency=0.003)
TIERS = {"one": lambda: sim.KVTier(0.02, **_TIER),
         "lru": lambda: sim.KVTierChain((sim.KVTier(0.01, **_TIER), sim.KVTier(0.03))),
         "arc": lambda: sim.KVTierChain((sim.KVTier(0.01, eviction="arc", **_TIER),),
                                        link_gbps=0.2),
         "write_through": lambda: sim.KVTierChain((sim.KVTier(0.004), sim.KVTier(0.02)),
                                                  write_policy="write_through"),
         "selective": lambda: sim.KVTierChain((sim.KVTier(0.02, **_TIER),),
                                              write_policy="write_through_selective")}


def every_feature_at_once(rows, sched, caching, spec, kv_blocks, block_size, closed, seed,
                          fleet, router, tiers=None):
    df = _workload(rows, 4)
    if caching == "radix" and 4 % block_size:  # the tree's pages must divide a hash id's 4
        block_size = 4
    knobs = {"chunk_size": 32} if sched in ("chunked", "vllm", "sarathi") else {}
    base = sim.SimConfig(scheduler=sched, max_batch_size=4, **knobs)
    check = _Check(base.policy())
    pools = isinstance(fleet, tuple)
    kw = dict(scheduler=check, cost_model=sim.LinearCost(0.01, 1e-4, 2e-4, 1e-6),
              kv_blocks=kv_blocks, block_size=block_size, max_batch_size=4,
              prefix_caching=caching, speculative=spec, seed=seed, check=True,
              closed_loop=workloads.ClosedLoop(closed, 0.05) if closed else None,
              replicas=1 if pools else fleet, router=router,
              disaggregation=Disaggregation(*fleet, link_bandwidth_gbps=50.0) if pools
              else None,
              kv_offload=TIERS[tiers]() if tiers and caching in ("block", "radix") and
              sched not in ("static", "continuous", "orca", "tensorrt-llm") else None)
    res = sim.run(df, **kw)
    req = res.requests
    k = spec.num_speculative_tokens if spec else 0
    fits = -(-(df.num_prompt_tokens + df.num_output_tokens + k) // block_size) <= kv_blocks
    assert req["request_id"].tolist() == list(range(len(df)))  # each once, in order
    assert (req["status"] == "finished").tolist() == fits.tolist()
    assert (req.loc[~fits, "reason"].str.len() > 0).all()
    if kw["kv_offload"] is None:  # (with tiers, batches formed empty while loads are in
        # flight are checked too and fast-forwards check none: no count to match)
        if pools or closed and fleet > 1:  # stepped every iteration (no fast-forward there)
            assert check.checks == len(res.iterations) or \
                pools and check.checks > len(res.iterations)
        else:  # fast-forwarded pure-decode iterations form no batch (a closed loop on one
            assert check.checks <= len(res.iterations)  # replica)
    fin = req[req.status == "finished"]
    if spec is None:  # (speculation: one gap per emission of 1..k+1 tokens)
        assert len(res.itl()) == int((fin.num_output_tokens - 1).sum())
    assert res.itl().sum() == pytest.approx(float((fin.e2e - fin.ttft).sum()), abs=1e-9)
    assert (fin.ttft > 0).all() and (fin.e2e >= fin.ttft).all()
    assert (req["num_cached_tokens"] <= (req["num_prompt_tokens"] - 1).clip(lower=0)).all()
    if spec is not None and not pools:
        for replica, _ in check.replicas.values():
            for r in replica.finished:
                if r.status == FINISHED:
                    assert (prefill_tokens(r) + r.spec_steps + r.spec_accepted
                            == r.num_output_tokens)
    again = sim.run(df, **dict(kw, scheduler=_Check(base.policy())))
    pd.testing.assert_frame_equal(req, again.requests)
    pd.testing.assert_frame_equal(res.iterations, again.iterations)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**features)
def test_every_feature_at_once(**example):
    every_feature_at_once(**example)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("SIM_THOROUGH"),
                    reason="1,000 examples: set SIM_THOROUGH=1 (README, 'Errors and limits')")
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**features)
def test_every_feature_at_once_thoroughly(**example):
    every_feature_at_once(**example)


class _Leaky:
    """A policy with a bug: admits like ``continuous`` and loses a free KV block each time."""

    name = "leaky"

    def __init__(self):
        self.policy = sim.SimConfig(scheduler="continuous").policy()

    def schedule(self, replica, now):
        self.policy.schedule(replica, now)
        if replica.blocks.num_free:
            replica.blocks.num_free -= 1


def test_check_catches_a_policy_that_leaks_kv_blocks():
    df = _workload([(0.0, 20, 5, 0), (0.0, 30, 5, 1)], 4)
    kw = dict(cost_model=sim.ConstantCost(0.01), kv_blocks=40, block_size=4)
    sim.run(df, scheduler=_Leaky(), **kw)  # unchecked: the leak goes unnoticed
    with pytest.raises(InvariantError, match=r"iteration 0: 26 free \+ 13 held KV blocks != 40"):
        sim.run(df, scheduler=_Leaky(), check=True, **kw)
    with pytest.raises(TypeError, match="check must be True or False, got 'yes'"):
        sim.SimConfig(check="yes")


def test_check_at_the_end_of_a_run_finds_a_lost_token():
    from sim.engine.core.invariants import check_finished
    from sim.engine.core.request import Request
    r = Request(0, 0, 0.0, 10, 3)
    r.status, r.num_generated = FINISHED, 2
    r.first_scheduled_time, r.first_token_time, r.finish_time = 0.0, 0.1, 0.2
    with pytest.raises(InvariantError, match="emitted 2 of 3 tokens"):
        check_finished([r], [])
    r.num_generated, r.first_token_time = 3, 0.3
    with pytest.raises(InvariantError, match="out of order"):
        check_finished([r], [])


class _LeakyRadix:
    """A policy with a bug: admits like ``continuous``; once, it references a cached radix node
    (request 1's, unreferenced) that no running request holds."""

    name = "leaky_radix"

    def __init__(self, keys):
        self.policy, self.keys, self.leaked = sim.SimConfig(scheduler="continuous").policy(), keys, 0

    def schedule(self, replica, now):
        if not self.leaked and any(r.index == 2 for r in replica.waiting):
            replica.blocks.acquire(self.keys[:1])
            self.leaked = replica.iteration
        self.policy.schedule(replica, now)


def test_check_catches_a_leaked_radix_reference_in_the_iteration_it_happens():
    """The pool's identity counts the tree pages the running requests reference: a reference
    nobody running holds is a block missing at once (not only at the end of the run)."""
    df = _workload([(0.0, 32, 2, 0), (5.0, 32, 2, 1), (10.0, 32, 2, 0)], 16)
    policy = _LeakyRadix(workloads.unit_keys_all(df["hash_ids"].tolist())[1])
    with pytest.raises(InvariantError, match=r"^iteration (\d+): \d+ free \+ \d+ held KV blocks "
                                             r"!= 1000") as err:
        sim.run(df, scheduler=policy, prefix_caching="radix", block_size=1, kv_blocks=1000,
                cost_model=sim.ConstantCost(0.01), check=True)
    assert err.match(f"^iteration {policy.leaked}:")
