"""The TensorRT-LLM preset (sim/engine/tensorrt_llm.py), rule by rule: GUARANTEED_NO_EVICT's
reservation by hand on a small pool, FCFS head-of-line blocking, the token budget without
chunking, no preemption ever (hypothesis), the running total equal to TensorRT-LLM's sum over
the running requests, the preset's defaults and memory accounting, and bad input."""

import dataclasses

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import sim
from sim.costs.simple import ConstantCost
from sim.engine import SimConfig, run
from sim.engine.tensorrt_llm import TensorRTLLM

DT = 2.0 ** -7  # a constant iteration time whose sums are exact
COST = ConstantCost(DT)


def _df(rows):
    return pd.DataFrame(rows, columns=["arrival_time", "num_prompt_tokens", "num_output_tokens"])


def _starts(res):
    """Iteration index at which each request was admitted."""
    return (res.requests["first_scheduled_time"] / DT).round().astype(int).tolist()


def test_a_request_is_admitted_only_when_its_blocks_to_completion_are_free():
    """Pool of 10 blocks of 16 tokens. Blocks to completion ceil((prompt + output) / 16):
    A 48 tokens -> 3, B 80 -> 5, C 32 -> 2, D 17 -> 2. A + B + C = 10 fit at iteration 0;
    D (10 + 2 > 10) waits for A, whose 16th and last token comes at iteration 15 (the prefill
    iteration emits the first): D starts at iteration 16. vLLM-style admission, counting
    prompt blocks only (2 + 3 + 1 + 1 = 7), starts all four at once."""
    df = _df([(0.0, 32, 16), (0.0, 40, 40), (0.0, 16, 16), (0.0, 16, 1)])
    kw = dict(cost_model=COST, kv_blocks=10, block_size=16, max_batch_size=8)
    res = run(df, scheduler="tensorrt-llm", **kw)
    assert _starts(res) == [0, 0, 0, 16]
    assert res.requests["finish_time"].iloc[0] == 16 * DT  # A: iterations 0..15
    assert res.summary()["num_preemptions"] == 0
    assert (res.iterations["kv_blocks_used"] <= 10).all()
    cont = run(df, scheduler="continuous", **kw)
    assert _starts(cont) == [0, 0, 0, 0]
    # with one block more, D fits beside the others at once
    assert _starts(run(df, scheduler="tensorrt-llm", **dict(kw, kv_blocks=12))) == [0] * 4


def test_fcfs_the_first_request_that_does_not_fit_blocks_the_ones_behind_it():
    """R0 (8 blocks to completion) runs; R1 (5) does not fit beside it, and R2 (1 block),
    which would, waits behind R1 (rule 2): both start once R0 has finished (its 20th token
    at iteration 19), R1 first."""
    df = _df([(0.0, 100, 28), (DT / 2, 50, 30), (DT / 2, 4, 4)])
    res = run(df, scheduler="tensorrt-llm", cost_model=COST, kv_blocks=10, block_size=16)
    assert res.requests["finish_time"].iloc[0] == 28 * DT
    assert _starts(res) == [0, 28, 28]
    # the same without R1: R2 joins R0 at the first iteration after its arrival
    alone = run(df.drop(index=1), scheduler="tensorrt-llm", cost_model=COST, kv_blocks=10,
                block_size=16)
    assert _starts(alone) == [0, 1]


def test_whole_prompts_fill_max_num_tokens_after_the_decodes():
    """token_budget (max_num_tokens) 100: two prompts of 60 cannot share iteration 0; the
    second comes at iteration 1 beside the first's decode (60 + 1 <= 100). A prompt of 150,
    over the budget, goes first in the next iteration, beside the decodes, and nothing
    follows it there (a deviation: TensorRT-LLM without chunked context serves no prompt over
    its max_num_tokens)."""
    df = _df([(0.0, 60, 5), (0.0, 60, 5)])
    res = run(df, scheduler="tensorrt-llm", token_budget=100, cost_model=COST, kv_blocks=100)
    assert _starts(res) == [0, 1]
    it = res.iterations
    assert (it["num_prefill_tokens"] + it["num_decode_tokens"] <= 100).all()
    df = _df([(0.0, 20, 6), (0.0, 150, 3), (0.0, 10, 2)])
    res = run(df, scheduler="tensorrt-llm", token_budget=100, cost_model=COST, kv_blocks=100)
    assert _starts(res) == [0, 1, 2]
    assert res.iterations["num_prefill_tokens"].tolist()[:3] == [20, 150, 10]
    assert (res.requests["status"] == "finished").all()


class _Summing(TensorRTLLM):
    """TensorRT-LLM's own reading: every iteration, free blocks less the sum over the running
    requests of their blocks to completion less those they hold (no running total)."""

    def _available(self, replica):
        super()._available(replica)  # (a new replica's state)
        self._exact = True
        return super()._available(replica)


class _Audit:
    """Wraps the policy: after each schedule, the reservation fits the pool."""

    quiet_when_decoding = True

    def __init__(self, policy):
        self.policy, self.calls = policy, 0

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def schedule(self, replica, now):
        self.policy.schedule(replica, now)
        self.calls += 1
        reserved = sum(TensorRTLLM.to_completion(replica, r) for r in replica.running.values())
        assert reserved <= replica.blocks.num_blocks


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(st.floats(0, 2), st.integers(1, 400), st.integers(1, 120)),
                     min_size=1, max_size=40),
       kv_blocks=st.integers(4, 80), block_size=st.sampled_from([1, 16, 32]),
       max_batch=st.sampled_from([1, 4, 64]), budget=st.sampled_from([None, 64, 512]),
       spec=st.sampled_from([None, 2]))
def test_nothing_is_ever_preempted_and_every_request_comes_out(rows, kv_blocks, block_size,
                                                               max_batch, budget, spec):
    df = _df(sorted(rows))
    speculative = (sim.SpeculativeConfig(num_speculative_tokens=spec, acceptance_rate=0.6,
                                         draft_cost_ratio=0.05)
                   if spec else None)
    kw = dict(cost_model=sim.LinearCost(0.01, 1e-4, 2e-4, 1e-6), kv_blocks=kv_blocks,
              block_size=block_size, max_batch_size=max_batch, speculative=speculative,
              check=True)
    audit = _Audit(TensorRTLLM(budget or 8192))
    res = run(df, scheduler=audit, **kw)
    req = res.requests
    k = spec or 0
    fits = -(-(df.num_prompt_tokens + df.num_output_tokens + k) // block_size) <= kv_blocks
    assert (req["status"] == "finished").tolist() == fits.tolist()
    assert (req.loc[~fits, "reason"].str.len() > 0).all()
    assert res.summary()["num_preemptions"] == 0
    assert (req["num_preemptions"] == 0).all()
    assert not audit.policy._exact  # the running total held all along (O(1) per request)
    # the running total is TensorRT-LLM's sum: the same run, bit for bit
    summed = run(df, scheduler=_Summing(budget or 8192), **kw)
    pd.testing.assert_frame_equal(req, summed.requests, check_exact=True)
    pd.testing.assert_frame_equal(res.iterations, summed.iterations, check_exact=True)


def test_prefix_caching_and_clusters_keep_the_reservation():
    """With the prefix cache (shared blocks) the policy reads the running set as TensorRT-LLM
    does; each replica of a cluster keeps its own reservation; nothing is preempted."""
    rows = [(0.01 * i, 200 + 16 * (i % 5), 40 + i % 7, [i % 3] * 4 + [100 + i] * 9)
            for i in range(60)]
    df = pd.DataFrame(rows, columns=["arrival_time", "num_prompt_tokens", "num_output_tokens",
                                     "hash_ids"])
    df.attrs["block_size"] = 16
    for extra in ({"prefix_caching": "block"}, {"replicas": 3, "router": "least_kv"}):
        res = run(df, scheduler="tensorrt-llm", cost_model=COST, kv_blocks=60, block_size=16,
                  check=True, **extra)
        s = res.summary()
        assert s["num_finished"] == 60 and s["num_preemptions"] == 0, extra
    cached = run(df, scheduler="tensorrt-llm", cost_model=COST, kv_blocks=60, block_size=16,
                 prefix_caching="block")
    assert cached.requests["num_cached_tokens"].sum() > 0


class _PerReplica:
    """Each replica schedules with its own copy of the policy (as a named scheduler's would);
    after each call, TensorRT-LLM's no-evict invariant on a prefill pool's replica: its free
    blocks cover what every running request still needs to finish."""

    quiet_when_decoding = True
    name = "tensorrt-llm"
    memory_accounting = "tensorrt-llm"

    def __init__(self):
        self.copies, self.prefill = {}, set()

    def schedule(self, replica, now):
        if id(replica) not in self.copies:
            self.copies[id(replica)] = (replica, TensorRTLLM())
        policy = self.copies[id(replica)][1]
        policy.schedule(replica, now)
        if replica.on_prefilled is not None:
            self.prefill.add(id(replica))
            assert policy._exact  # requests leave without finishing: the sum, not the total
            need = sum(TensorRTLLM.to_completion(replica, r) - replica.held_blocks(r)
                       for r in replica.running.values())
            assert replica.blocks.num_free >= need


def test_disaggregated_pools_read_the_running_set():
    """A prefill pool hands requests off without finishing them, while their KV is still in
    flight: its replicas read TensorRT-LLM's sum over the running set and keep the no-evict
    invariant; every request finishes."""
    df = _df([(0.002 * i, 100 + 37 * (i % 9), 20 + i % 13) for i in range(80)])
    policy = _PerReplica()
    res = run(df, scheduler=policy, cost_model=COST, kv_blocks=40, block_size=16, check=True,
              disaggregation=sim.Disaggregation(2, 1, link_bandwidth_gbps=50.0))
    assert res.summary()["num_finished"] == 80
    assert len(policy.prefill) == 2  # both prefill replicas were checked


def test_a_policy_object_reused_for_another_run_starts_afresh():
    df = _df([(0.0, 300, 50)] * 6 + [(0.2, 30, 10)] * 4)
    policy = TensorRTLLM()
    kw = dict(cost_model=COST, kv_blocks=40, block_size=16)
    first = run(df, scheduler=policy, **kw)
    again = run(df, scheduler=policy, **kw)
    pd.testing.assert_frame_equal(first.requests, again.requests, check_exact=True)
    assert first.summary()["num_preemptions"] == 0


def test_the_preset_brings_tensorrt_llms_defaults_and_memory_accounting():
    from sim.specs.gpus import get_gpu
    from sim.specs.memory import memory_budget
    c = SimConfig(scheduler="tensorrt-llm", model="llama-3.1-70b", gpu="h100",
                  weight_dtype="fp8", kv_dtype="fp8")
    r = c.resolved()
    assert (r.max_batch_size, r.block_size, r.token_budget, r.prefix_caching) == (
        2048, 32, 8192, False)
    assert r.gpu_memory_utilization is None and r.chunk_size is None
    assert isinstance(c.policy(), TensorRTLLM) and c.policy().max_num_tokens == 8192

    def blocks(tokens, fraction=0.9):
        return memory_budget("llama-3.1-70b", get_gpu("h100").memory_gb, weight_dtype="fp8",
                             kv_dtype="fp8", block_size=32, accounting="tensorrt-llm",
                             max_num_batched_tokens=tokens,
                             free_gpu_memory_fraction=fraction).kv_blocks
    assert c.resolved_kv_blocks() == blocks(8192) > 1_000
    # a smaller max_num_tokens leaves less to the activations, more to the KV cache
    small = dataclasses.replace(c, token_budget=1024)
    assert small.resolved_kv_blocks() == blocks(1024) > blocks(8192)
    # a policy object carries its own fraction and max_num_tokens
    obj = dataclasses.replace(c, scheduler=TensorRTLLM(4096, free_gpu_memory_fraction=0.95))
    assert obj.resolved_kv_blocks() == blocks(4096, 0.95)
    assert obj.resolved().block_size == 32
    # explicit knobs win
    mine = SimConfig(scheduler="tensorrt-llm", max_batch_size=64, block_size=64).resolved()
    assert (mine.max_batch_size, mine.block_size) == (64, 64)
    assert sim.POLICIES["tensorrt-llm"] is TensorRTLLM
    from sim.engine import tensorrt_llm
    assert "Rules (sources" in tensorrt_llm.__doc__ and "Deviations:" in tensorrt_llm.__doc__


@pytest.mark.parametrize("make, match", [
    (lambda: TensorRTLLM(0), "max_num_tokens must be > 0, got 0"),
    (lambda: TensorRTLLM(free_gpu_memory_fraction=1.0), "must be below 1"),
    (lambda: TensorRTLLM(free_gpu_memory_fraction=1.5), "free_gpu_memory_fraction must be at "
                                                        "most 1, got 1.5"),
    (lambda: SimConfig(scheduler="tensorrt-llm", chunk_size=512),
     "chunk_size=512 is not used by the 'tensorrt-llm' scheduler"),
    (lambda: SimConfig(scheduler="tensorrt-llm", token_budget=0), "token_budget must be > 0"),
    (lambda: SimConfig(scheduler="tensorrt-llm", gpu_memory_utilization=0.8,
                       model="llama-3.1-8b").resolved_kv_blocks(),
     "gpu_memory_utilization=0.8 is vLLM's setting"),
])
def test_bad_input_names_the_field_and_value(make, match):
    with pytest.raises(ValueError, match=match):
        make()
    with pytest.raises(TypeError, match="max_num_tokens must be an integer, got 'x'"):
        TensorRTLLM("x")
