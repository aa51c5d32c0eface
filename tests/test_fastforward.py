"""``sim.engine.core.fastforward``: stretches of pure-decode iterations run in one event give the
results of forming every iteration, bit for bit (a policy behind a wrapper that hides
``quiet_when_decoding`` is stepped: :func:`_fast_and_stepped`)."""

import copy
import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import sim
import workloads as wl
from sim.engine.core.policies import KNOBS, ChunkedPrefill

GPU = dict(model="llama-3.1-8b", gpu="h100")


class _Stepped:
    """A policy as given, minus ``quiet_when_decoding``: the engine forms every iteration.
    Each replica schedules with its own copy (as a named scheduler's replicas do: SGLang keeps
    state per replica)."""

    def __init__(self, policy):
        self._policy = policy
        self._copies = {}  # id(replica) -> (replica, its copy of the policy)

    def __getattr__(self, name):
        if name == "quiet_when_decoding":
            raise AttributeError(name)
        return getattr(self._policy, name)

    def schedule(self, replica, now):
        if id(replica) not in self._copies:
            self._copies[id(replica)] = (replica, copy.deepcopy(self._policy))
        self._copies[id(replica)][1].schedule(replica, now)


def _fast_and_stepped(df, **kw):
    """The same run with the fast-forward (a named scheduler resolved to its policy) and with
    every iteration stepped (the policy behind :class:`_Stepped`)."""
    import dataclasses

    from sim.engine.schedulers import resolve
    config, policy = resolve(sim.SimConfig(**kw))
    config = dataclasses.replace(config, **dict.fromkeys(KNOBS))  # (the policy carries them)
    fast = sim.run(df, dataclasses.replace(config, scheduler=copy.deepcopy(policy)))
    stepped = sim.run(df, dataclasses.replace(config, scheduler=_Stepped(copy.deepcopy(policy))))
    return fast, stepped


def _same_results(a, b):
    import pandas as pd
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.iterations, b.iterations, check_exact=True)
    assert a.itl().tobytes() == b.itl().tobytes()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(st.floats(0, 3), st.integers(1, 300), st.integers(1, 200),
                               st.integers(0, 3)), min_size=1, max_size=30),
       scheduler=st.sampled_from(["static", "continuous", "chunked", "vllm", "sarathi", "orca",
                                  "sglang", "tensorrt-llm"]),
       caching=st.sampled_from([False, "block", "radix"]),
       kv_blocks=st.sampled_from([40, 90, 400]),
       cost=st.sampled_from(["roofline", "linear", "constant"]),
       max_batch=st.sampled_from([2, 16]),
       cluster=st.sampled_from([None, ("round_robin", 2), ("least_kv", 2),
                                ("prefix_affinity", 3), ("least_outstanding", 2)]),
       spec=st.sampled_from([None, (2, 0.7), (4, 0.9)]),
       page=st.sampled_from([1, 4, 16]), unit=st.sampled_from([16, 32, 512]),
       closed=st.sampled_from([None, None, (1, 0.0), (3, 0.0), (2, 2.0 ** -6)]))
def test_fast_forward_is_bit_identical_to_stepping_every_iteration(rows, scheduler, caching,
                                                                     kv_blocks, cost, max_batch,
                                                                     cluster, spec, page, unit,
                                                                     closed):
    """Fast-forwarded stretches (nothing waiting or prefilling: decodes only, up to the next
    arrival or preemption) give the same results bit for bit as forming every
    iteration: tight pools (decodes preempting at a stretch's edge), prefix caching (decode
    blocks evicting cached ones), the roofline's, ``LinearCost``'s and ``ConstantCost``'s
    pure-decode prices (the constant one, 2^-7 s, with arrivals on its grid: iterations
    that start exactly at an arrival), full batches, clusters whose routers read the replicas'
    free blocks and cached prefixes at arrivals that fall inside a replica's stretch,
    speculative decoding (each step's totals from the rings, cleared as stepping clears
    them), SGLang (its ratio's decay replayed), pages of 1, 4 and 16 tokens under hash ids
    of 16, 32 and 512 (radix nodes used in part: a run that never ended was found so; the
    pool in the same tokens for every page size), closed loops (a finish issuing the next
    request at once, or a think time later)."""
    import pandas as pd
    if cost == "constant":  # arrivals on the iterations' grid (exact sums): ties
        rows = [(round(t * 128) / 128, p, o, g) for t, p, o, g in rows]
    df = pd.DataFrame([(t, p, o, [g * 100 + j for j in range(-(-p // unit))])
                       for t, p, o, g in sorted(rows)],
                      columns=["arrival_time", "num_prompt_tokens", "num_output_tokens",
                               "hash_ids"])
    df.attrs["block_size"] = unit
    cost = {"roofline": None, "constant": sim.ConstantCost(2.0 ** -7),
            "linear": sim.LinearCost(base=0.004, per_decode_token=1e-4,
                                     per_context_token=3e-7)}[cost]
    spread = dict(router=cluster[0], replicas=cluster[1]) if cluster else {}
    if closed:  # users issuing on finishes (a think time on the constant cost's grid: ties)
        spread["closed_loop"] = wl.ClosedLoop(*closed)
    speculative = sim.SpeculativeConfig(num_speculative_tokens=spec[0], acceptance_rate=spec[1],
                                        draft_cost_ratio=0.05) if spec else None
    fast, stepped = _fast_and_stepped(df, scheduler=scheduler, prefix_caching=caching,
                                      kv_blocks=kv_blocks * 16 // page,
                                      max_batch_size=max_batch, cost_model=cost,
                                      speculative=speculative, block_size=page,
                                      **spread, **GPU)
    _same_results(fast, stepped)


class _CountingCost:
    """A linear cost model with its own pure-decode price; counts the batches it prices."""

    def __init__(self):
        self.batches = 0

    def __call__(self, batch):
        self.batches += 1
        return 0.01 + 1e-6 * batch.context_tokens + 1e-4 * batch.num_prefill_tokens

    def pure_decode_cost(self, num_decodes):
        return lambda context_tokens: 0.01 + 1e-6 * context_tokens


def test_fast_forward_prices_decode_stretches_without_forming_batches():
    """On a lightly loaded replica most iterations are pure decodes between arrivals: they are
    priced through ``pure_decode_cost`` (no Batch, no policy call, one SimPy event per
    stretch), on each replica of a cluster too (up to its next arrival), and in a closed loop
    (up to the users' next issue or the first finish); a cluster in a closed loop, whose
    users' requests are routed when another replica finishes one, forms every iteration."""
    df = wl.synthetic(200, rate=2.0, prompt=wl.LogNormal(300, 1.0, max_tokens=2000),
                      output=wl.LogNormal(200, 1.0, max_tokens=800), seed=3)
    cost = _CountingCost()
    res = sim.run(df, scheduler="chunked", cost_model=cost, **GPU)
    assert (res.requests["status"] == "finished").all()
    decode_only = int((res.iterations["num_prefill_tokens"] == 0).sum())
    assert decode_only > 0.8 * len(res.iterations)
    # formed: the prefill iterations, and the pure-decode ones a request finishes in
    assert cost.batches <= len(res.iterations) - decode_only + len(df)
    assert cost.batches < 0.1 * len(res.iterations)
    cost = _CountingCost()
    res = sim.run(df, scheduler="chunked", cost_model=cost, replicas=2, **GPU)
    assert cost.batches < 0.1 * len(res.iterations)
    cost = _CountingCost()
    res = sim.run(df, scheduler="chunked", cost_model=cost, closed_loop=wl.ClosedLoop(4, 1.0),
                  **GPU)
    assert (res.requests["status"] == "finished").all()
    assert cost.batches < 0.1 * len(res.iterations)
    cost = _CountingCost()
    res = sim.run(df, scheduler="chunked", cost_model=cost, closed_loop=wl.ClosedLoop(4, 1.0),
                  replicas=2, **GPU)
    assert cost.batches == len(res.iterations)


@pytest.mark.parametrize("users, think, scheduler", [(3, 0.0, "chunked"), (8, 0.0, "vllm"),
                                                     (5, 0.4, "sglang"), (2, 1.5, "static")])
def test_a_closed_loop_is_fast_forwarded_as_stepping_does(users, think, scheduler):
    """A closed loop: a finish issues the user's next request at that iteration's end (think
    time 0: the next iteration admits it) or a think time later (a stretch stops before the
    iteration starting at or after that issue); fast-forwarded, the same requests, arrival
    times and iterations bit for bit as stepping every iteration, preemptions included."""
    df = wl.load("azure-conv", n=250, rate=1.0)
    fast, stepped = _fast_and_stepped(df, scheduler=scheduler, kv_blocks=900,
                                      closed_loop=wl.ClosedLoop(users, think), **GPU)
    _same_results(fast, stepped)
    assert (fast.iterations["num_prefill_tokens"] == 0).mean() > 0.5  # stretches to skip


def test_fast_forward_matches_stepping_on_a_real_trace_with_preemptions():
    """A real conversation trace on a pool small enough to preempt decodes: the same requests
    and iterations bit for bit, fast-forwarded or not."""
    df = wl.load("azure-conv", n=400, rate=3.0)
    fast, stepped = _fast_and_stepped(df, scheduler="chunked", kv_blocks=700, **GPU)
    assert fast.requests["num_preemptions"].sum() > 0
    _same_results(fast, stepped)


@pytest.mark.parametrize("caching", ["block", "radix"])
def test_fast_forward_evicts_cached_prefixes_as_stepping_does(caching):
    """With prefix caching, the blocks a stretch's decodes take come from the cache's free
    queue (evicting cached prefixes, least recently used first) exactly as iteration by
    iteration: later requests hit the same prefixes."""
    df = wl.shared_prefix(300, n_groups=6, system_prompt_tokens=800,
                          user_tokens=wl.LogNormal(200, 1.0, max_tokens=1500),
                          output=wl.LogNormal(150, 1.0, max_tokens=800), rate=3.0, seed=1)
    fast, stepped = _fast_and_stepped(df, scheduler="vllm", prefix_caching=caching,
                                      kv_blocks=300, **GPU)
    assert 0.3 < fast.summary()["prefix_hit_rate"] < 0.9
    _same_results(fast, stepped)


@pytest.mark.parametrize("router", ["least_kv", "least_outstanding"])
def test_a_cluster_router_sees_no_finish_a_stretch_has_not_reached(router):
    """A decode that finishes in an iteration still running at the next arrival is finished
    after that arrival is routed (the router counts it, and its blocks, as still there), as
    when stepping; finishing it with the rest of the stretch moved requests between replicas
    (this trace at 2 req/s over 4 replicas did)."""
    df = wl.load("azure-conv", n=300, rate=2.0)
    fast, stepped = _fast_and_stepped(df, scheduler="chunked", replicas=4, router=router,
                                      kv_blocks=800, **GPU)
    _same_results(fast, stepped)


def test_a_stretch_is_cut_back_to_an_end_the_clock_can_land_on(monkeypatch):
    """SimPy's clock is ``now + delay``: a stretch ending at a time no delay reaches exactly
    is cut back, iteration by iteration (and before a finish), to one it does. Simulated
    here by refusing every third end time: results stay bit-identical to stepping."""
    import sim.engine.core.fastforward as fastforward
    real = fastforward.delay_until
    refused = []

    def picky(now, t):
        delay = real(now, t)
        if int.from_bytes(np.float64(t).tobytes(), "little") % 3 == 0 and t > now:
            refused.append(t)
            while now + delay == t:  # lands just past t instead
                delay = math.nextafter(delay, math.inf)
        return delay
    monkeypatch.setattr(fastforward, "delay_until", picky)
    df = wl.load("azure-conv", n=200, rate=3.0)
    fast, stepped = _fast_and_stepped(df, scheduler="chunked", **GPU)
    assert len(refused) > 100
    _same_results(fast, stepped)


def test_fast_forward_with_speculation_on_a_trace_with_a_draft_model():
    """Speculative decoding: a stretch reads each step's context and new blocks from the
    rings and frees their entries; priced by the draft model's roofline plus the target's,
    batch by batch, on a pool that preempts. Same results as stepping, bit for bit."""
    df = wl.load("azure-conv", n=300, rate=3.0)
    spec = sim.SpeculativeConfig(num_speculative_tokens=3, acceptance_rate=0.75,
                                 draft_model="llama-3.2-1b")
    fast, stepped = _fast_and_stepped(df, scheduler="vllm", speculative=spec, kv_blocks=900,
                                      **GPU)
    assert fast.requests["num_preemptions"].sum() > 0
    _same_results(fast, stepped)


@pytest.mark.parametrize("scheduler", ["vllm", "sglang"])
def test_fast_forward_with_speculation_across_rings_that_grow(monkeypatch, scheduler):
    """Long outputs at a low acceptance rate (~1.05 tokens per verification) outgrow
    ``SpecDecodes``' 1,024-step rings mid-run, between stretches (a request starting at step
    ~1,500 needs ~4,700 steps), on pools that preempt: stretches read and clear the grown
    rings as stepping does, bit for bit."""
    import pandas as pd
    from sim.engine.core import replica
    from sim.engine.core.spec_decoding import SpecDecodes
    grown = []

    class Counted(SpecDecodes):  # (a compiled class's type is immutable: a subclass records)
        def _grow(self, now, span):
            grown.append(now)
            super()._grow(now, span)
    monkeypatch.setattr(replica, "SpecDecodes", Counted)
    df = pd.DataFrame({"arrival_time": [0.0, 0.0, 3.01, 3.2, 9.0, 9.05],
                       "num_prompt_tokens": [100, 50, 700, 20, 300, 40],
                       "num_output_tokens": [900, 3000, 2500, 1900, 5000, 300]})
    spec = sim.SpeculativeConfig(num_speculative_tokens=2, acceptance_rate=0.05,
                                 draft_cost_ratio=0.05)
    for kv_blocks in (340, 2000):
        grown.clear()
        fast, stepped = _fast_and_stepped(
            df, scheduler=scheduler, speculative=spec, kv_blocks=kv_blocks, block_size=16,
            cost_model=sim.LinearCost(base=0.004, per_decode_token=1e-4,
                                      per_context_token=3e-7), **GPU)
        assert max(grown) > 1024  # (each run grows its rings twice)
        assert (fast.requests["num_preemptions"].sum() > 0) == (kv_blocks == 340)
        _same_results(fast, stepped)


def test_fast_forward_replays_sglangs_ratio_decay():
    """SGLang's policy is quiet when only decodes run but its ``new_token_ratio`` decays every
    decode step (rule 4): ``decoded_quietly`` replays the decay of the steps a stretch skips,
    so its later admissions (rule 3) are those of stepping, bit for bit, on a trace whose
    reservations bind."""
    from sim.engine.presets.sglang import MIN_NEW_TOKEN_RATIO, SGLang
    p, q = SGLang(), SGLang()
    q.chunked = object()
    for n in (1, 7, 599, 600, 5000):
        for _ in range(n):
            p.new_token_ratio = max(p.new_token_ratio - p.decay, MIN_NEW_TOKEN_RATIO)
        q.decoded_quietly(None, n)
        assert q.new_token_ratio == p.new_token_ratio and q.chunked is None
    df = wl.load("azure-conv", n=400, rate=3.0)
    fast, stepped = _fast_and_stepped(df, scheduler="sglang", kv_blocks=30_000, **GPU)
    _same_results(fast, stepped)


class _Slower(sim.RooflineCost):
    """A subclass re-pricing every iteration (its ``pure_decode_cost`` is the parent's)."""

    def __call__(self, batch):
        return 1.25 * super().__call__(batch)


class _Noisy:
    """A cost model with state: each call draws a lognormal factor from its own generator."""

    def __init__(self):
        self.rng = np.random.default_rng(0)
        self.calls = []

    def __call__(self, batch):
        self.calls.append(batch.iteration)
        return (0.01 + 1e-6 * batch.context_tokens + 1e-4 * batch.num_prefill_tokens) \
            * self.rng.lognormal(0.0, 0.1)


def test_a_subclass_that_reprices_iterations_is_not_priced_by_its_parents_decode_price():
    """A cost model subclassing the roofline and overriding ``__call__`` inherits a
    ``pure_decode_cost`` that no longer prices what it does: the fast-forward must not use it
    (it did: the stretches ran 25 % faster than the iterations the subclass priced)."""
    df = wl.load("azure-conv", n=150, rate=3.0)
    fast, stepped = _fast_and_stepped(df, scheduler="chunked",
                                      cost_model=_Slower("llama-3.1-8b", "h100"), **GPU)
    _same_results(fast, stepped)
    plain = sim.run(df, scheduler="chunked", **GPU)
    first = fast.iterations["duration"].iloc[0]
    assert first == pytest.approx(1.25 * plain.iterations["duration"].iloc[0], rel=1e-12)
    from sim.engine.core.batch import decode_pricer
    assert decode_pricer(_Slower()) is None
    assert decode_pricer(sim.RooflineCost()) is not None  # the roofline itself: fast-forwarded


@pytest.mark.parametrize("cluster", [{}, dict(replicas=3, router="least_kv")])
def test_a_cost_model_without_a_pure_decode_price_is_called_once_per_iteration_in_order(
        cluster):
    """A cost model that is no declared pure function of the batch (no ``pure_decode_cost``:
    here one drawing noise) is called exactly once per iteration, in the order the iterations
    start, as when stepping: the fast-forward priced iterations it then gave back to the loop
    (priced twice) and a replica's whole stretch ahead of the other replicas' iterations."""
    df = wl.load("azure-conv", n=150, rate=3.0)
    from sim.engine.schedulers import resolve
    config, policy = resolve(sim.SimConfig(scheduler="chunked", **cluster, **GPU))
    runs = []
    for pol in (policy, _Stepped(policy)):
        cost = _Noisy()
        res = sim.run(df, dataclasses.replace(config, scheduler=pol, cost_model=cost,
                                              chunk_size=None))
        assert len(cost.calls) == len(res.iterations)
        runs.append(res)
    _same_results(*runs)


def test_the_progress_bar_is_redrawn_as_often_fast_forwarded_as_stepped(capsys):
    """The bar is redrawn every 1,024 iterations: a stretch redraws it only when it crossed
    such a multiple (it redrew after every stretch: 2 MB of redraws on the default trace,
    about 100 times as many as stepping)."""
    from sim.engine.schedulers import resolve
    df = wl.load("azure-conv", n=400, rate=3.0)
    config, policy = resolve(sim.SimConfig(scheduler="chunked", progress=True, **GPU))
    redraws = []
    for pol in (policy, _Stepped(policy)):
        res = sim.run(df, dataclasses.replace(config, scheduler=pol, chunk_size=None))
        redraws.append(capsys.readouterr().err.count("\r"))
    iterations = len(res.iterations)
    assert iterations > 8 * 1024
    assert redraws[0] <= redraws[1] <= iterations // 1024 + 5


class _Decaying(ChunkedPrefill):
    """A subclass with SGLang-like state: its admission budget decays at every call, so it is
    not quiet when only decodes run (``quiet_when_decoding`` is inherited, not declared)."""

    def __init__(self):
        super().__init__(chunk_size=2048)

    def schedule(self, replica, now):
        self.chunk_size = max(64, int(self.chunk_size * 0.99))
        super().schedule(replica, now)


def test_a_policy_subclass_overriding_schedule_is_stepped_unless_it_declares_quiet():
    """``quiet_when_decoding`` counts only where the class defining ``schedule`` (or a
    subclass of it) declares it: a subclass of a built-in that overrides ``schedule`` with
    state of its own is called every iteration (it was fast-forwarded on the flag it
    inherited: its budget decayed less, the requests started at other times)."""
    df = wl.load("azure-conv", n=150, rate=3.0)
    fast = sim.run(df, scheduler=_Decaying(), **GPU)
    stepped = sim.run(df, scheduler=_Stepped(_Decaying()), **GPU)
    _same_results(fast, stepped)
    from sim.engine.core.fastforward import can_fast_forward
    from sim.engine.core.replica import Replica
    replica = Replica(100, 16, 8)
    assert not can_fast_forward(_Decaying(), replica)
    assert all(can_fast_forward(cls(), replica) for cls in sim.POLICIES.values())


def test_a_decode_finishing_exactly_at_an_arrival_is_still_running_for_the_router():
    """Iterations of 2^-7 s (exact sums): C's last token comes in the iteration that ends at
    10/128 s, exactly when D arrives. The dispatcher routes D before that iteration is
    post-processed (URGENT), so ``least_outstanding`` still counts C on replica 0 (A and C
    there, B on replica 1) and sends D to replica 1; a stretch that finished C by then sent it
    to replica 0."""
    import pandas as pd
    d = 2.0 ** -7
    df = pd.DataFrame({"arrival_time": [0.0, 0.0, 0.0, 10 * d],
                       "num_prompt_tokens": [8, 8, 8, 8],
                       "num_output_tokens": [50, 50, 10, 5]})
    fast, stepped = _fast_and_stepped(df, scheduler="chunked", replicas=2,
                                      router="least_outstanding", cost_model=sim.ConstantCost(d),
                                      **GPU)
    assert fast.requests["finish_time"][2] == 10 * d
    assert fast.requests["replica"].tolist() == [0, 1, 0, 1]
    _same_results(fast, stepped)


@pytest.mark.parametrize("layout", [dict(tensor_parallel=1, attention_dp=8),
                                    dict(tensor_parallel=2, attention_dp=4)])
def test_fast_forward_with_data_parallel_attention(layout):
    """Data-parallel attention (sim.costs.dp_attention) prices pure decodes through its own
    ``pure_decode_cost``: fast-forwarded runs match stepping every iteration, bit for bit, and
    most of their iterations are not formed."""
    df = wl.synthetic(120, rate=4.0, prompt=wl.LogNormal(400, 1.0, max_tokens=3000),
                      output=wl.LogNormal(200, 1.0, max_tokens=800), seed=5)
    moe = dict(model="mixtral-8x7b", gpu="h100", expert_parallel=8, **layout)
    fast, stepped = _fast_and_stepped(df, scheduler="chunked", **moe)
    _same_results(fast, stepped)
    assert (fast.requests["status"] == "finished").all()
    from sim.costs.dp_attention import DPAttentionCost
    calls = []

    class Counting(DPAttentionCost):
        def __call__(self, batch):
            calls.append(batch.iteration)
            return super().__call__(batch)

        pure_decode_cost = DPAttentionCost.pure_decode_cost  # (declared with __call__)

    cost = Counting("mixtral-8x7b", "h100", **layout, expert_parallel=8)
    res = sim.run(df, scheduler="chunked", cost_model=cost, **moe)
    assert res.iterations["duration"].tolist() == fast.iterations["duration"].tolist()
    assert len(calls) < 0.5 * len(res.iterations)
