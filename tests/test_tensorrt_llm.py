"""The TensorRT-LLM preset (sim/engine/presets/tensorrt_llm.py), rule by rule: GUARANTEED_NO_EVICT's
reservation by hand on a small pool, FCFS head-of-line blocking, the token budget without
chunking, no preemption ever (hypothesis), the running total equal to TensorRT-LLM's sum over
the running requests, the preset's defaults and memory accounting, and bad input."""

import dataclasses
import re

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import sim
from sim.costs.simple import ConstantCost
from sim.engine import SimConfig, run
from sim.engine.presets.tensorrt_llm import TensorRTLLM

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
    second comes at iteration 1 beside the first's decode (60 + 1 <= 100). Without chunked
    context a prompt of 150, over max_num_tokens, can never run: rejected at arrival with the
    reason (TensorRT-LLM's LLM API refuses it), and the two behind it share iteration 0."""
    df = _df([(0.0, 60, 5), (0.0, 60, 5)])
    res = run(df, scheduler="tensorrt-llm", token_budget=100, cost_model=COST, kv_blocks=100)
    assert _starts(res) == [0, 1]
    it = res.iterations
    assert (it["num_prefill_tokens"] + it["num_decode_tokens"] <= 100).all()
    df = _df([(0.0, 20, 6), (0.0, 150, 3), (0.0, 10, 2)])
    res = run(df, scheduler="tensorrt-llm", token_budget=100, cost_model=COST, kv_blocks=100)
    req = res.requests
    assert req["status"].tolist() == ["finished", "rejected", "finished"]
    assert req["reason"].iloc[1] == (
        "max_num_tokens: a prompt of 150 tokens exceeds max_num_tokens 100 without chunked "
        "context (TensorRT-LLM refuses it; enable_chunked_context=True would run it in chunks)")
    assert res.iterations["num_prefill_tokens"].iloc[0] == 30
    assert res.summary()["num_rejected_context_length"] == 0  # not a max_model_len rejection
    # max_model_len is checked first, as the server does
    over = run(df, scheduler="tensorrt-llm", token_budget=100, cost_model=COST, kv_blocks=100,
               max_model_len=100)
    assert over.requests["reason"].iloc[1].startswith("context_length")


def _prefill_tokens(res):
    return res.iterations["num_prefill_tokens"].tolist()


def test_chunked_context_cuts_prompts_fcfs_in_multiples_of_tokens_per_block():
    """max_num_tokens 100, blocks (the chunk unit) of 16: A (250 tokens) gets 100 rounded down
    to 96 and leaves 4, too few for B (40) or C (10), which wait (a request given no chunk is
    not admitted); iteration 1 the same; iteration 2 A's last 58 whole, then B's 40 whole in
    the 42 left, C's 10 not in 2; iteration 3 C beside the two decodes. A alone needs 3 prefill
    iterations: its first token at 3 DT, done at (3 + 3 - 1) DT."""
    df = _df([(0.0, 250, 3), (0.0, 40, 2), (0.0, 10, 2)])
    kw = dict(scheduler="tensorrt-llm", token_budget=100, cost_model=COST, kv_blocks=100,
              block_size=16, enable_chunked_context=True, check=True)
    res = run(df, **kw)
    assert _prefill_tokens(res)[:4] == [96, 96, 98, 10]
    assert _starts(res) == [0, 2, 3]
    assert (res.requests["status"] == "finished").all()
    assert res.requests["finish_time"].iloc[0] == 5 * DT
    assert res.requests["ttft"].iloc[0] == 3 * DT
    # a later prompt that fits whole in what a cut leaves still goes (FCFS chunking, no
    # head-of-line blocking on tokens): 96 of D's 120, then E's 3 in the 4 left
    res = run(_df([(0.0, 120, 2), (0.0, 3, 2)]), **kw)
    assert _prefill_tokens(res)[:2] == [99, 24] and _starts(res) == [0, 0]
    # what is left after the decodes: 3 decodes take 3 of 100, a 200-token prompt gets 96
    res = run(_df([(0.0, 20, 9)] * 3 + [(DT / 2, 200, 2)]), **kw)
    assert _prefill_tokens(res)[:4] == [60, 96, 96, 8]


def test_chunked_context_removes_the_step_at_max_num_tokens():
    """A request alone: its time to first token grows with its prompt by whole chunks, with no
    jump where the prompt crosses max_num_tokens (whole prompts over it are rejected)."""
    ttft = []
    for prompt in (96, 100, 101, 196, 197, 4000):
        res = run(_df([(0.0, prompt, 2)]), scheduler="tensorrt-llm", token_budget=100,
                  cost_model=COST, kv_blocks=400, block_size=16, enable_chunked_context=True)
        ttft.append(res.requests["ttft"].iloc[0] / DT)
    # closed form: chunks of 96 (100 rounded down to blocks of 16) until the rest fits 100,
    # 1 + ceil((prompt - 100) / 96) iterations: 101 -> 96 + 5, 196 -> 96 + 100, 197 -> 3
    assert ttft[:5] == [1, 1, 2, 2, 3]
    assert ttft[5] == 1 + -(-(4000 - 100) // 96) == 42
    whole = run(_df([(0.0, 101, 2)]), scheduler="tensorrt-llm", token_budget=100,
                cost_model=COST, kv_blocks=400, block_size=16)
    assert whole.requests["status"].iloc[0] == "rejected"


class _Summing(TensorRTLLM):
    """TensorRT-LLM's own reading: every iteration, free blocks less the sum over the running
    requests of their blocks to completion less those they hold (no running total)."""

    def _available(self, replica):
        super()._available(replica)  # (a new replica's state)
        self._exact = True
        return super()._available(replica)


class _Audit:
    """Wraps the policy: after each schedule, the reservation fits the pool; the iteration's
    prompt and decode tokens fit max_num_tokens (unless the decodes alone do not: then no
    prompt runs); a prompt cut short is cut at a multiple of the block size (rule 4)."""

    quiet_when_decoding = True

    check_reservation = True  # GUARANTEED_NO_EVICT's
    check_order = False  # every running request arrived before every waiting one

    def __init__(self, policy):
        self.policy, self.calls, self.cuts = policy, 0, 0

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def schedule(self, replica, now):
        self.policy.schedule(replica, now)
        self.calls += 1
        if self.check_reservation:
            reserved = sum(TensorRTLLM.to_completion(replica, r)
                           for r in replica.running.values())
            assert reserved <= replica.blocks.num_blocks
        if self.check_order and replica.running and replica.waiting:
            assert max(replica.running) < min(r.index for r in replica.waiting)
        decode_tokens = replica.decodes.count * (1 + replica.num_spec_tokens)
        prompt_tokens = sum(new for new, _ in replica._prefills)
        limit = self.policy.max_num_tokens
        assert prompt_tokens + decode_tokens <= max(limit, decode_tokens)
        for r, (new, done) in zip(replica._prefill_reqs, replica._prefills):
            if done + new < r.prefill_target:
                unit = min(replica.block_size, limit)  # (TensorRT-LLM's chunkUnitSize)
                assert self.policy.enable_chunked_context and new % unit == 0
                self.cuts += 1


_CASES = dict(rows=st.lists(st.tuples(st.floats(0, 2), st.integers(1, 400), st.integers(1, 120)),
                            min_size=1, max_size=40),
              kv_blocks=st.integers(4, 80), block_size=st.sampled_from([1, 16, 32]),
              max_batch=st.sampled_from([1, 4, 64]), budget=st.sampled_from([None, 20, 64, 512]),
              spec=st.sampled_from([None, 2]), chunked=st.booleans())


def _audited_run(rows, kv_blocks, block_size, max_batch, budget, spec, chunked,
                 policy="guaranteed_no_evict", chunking=None):
    """A random run behind the audit: every request finishes, or is rejected at arrival with
    its reason when it could never fit the pool or (without chunked context) max_num_tokens.
    Returns (workload, run keywords, the audit, the result)."""
    df = _df(sorted(rows))
    speculative = (sim.SpeculativeConfig(num_speculative_tokens=spec, acceptance_rate=0.6,
                                         draft_cost_ratio=0.05)
                   if spec else None)
    kw = dict(cost_model=sim.LinearCost(0.01, 1e-4, 2e-4, 1e-6), kv_blocks=kv_blocks,
              block_size=block_size, max_batch_size=max_batch, speculative=speculative,
              check=True)
    audit = _Audit(TensorRTLLM(budget or 8192, enable_chunked_context=chunked,
                               capacity_scheduler_policy=policy,
                               context_chunking_policy=chunking))
    audit.check_reservation = policy == "guaranteed_no_evict"
    audit.check_order = not audit.check_reservation
    res = run(df, scheduler=audit, **kw)
    req = res.requests
    k = spec or 0
    fits = -(-(df.num_prompt_tokens + df.num_output_tokens + k) // block_size) <= kv_blocks
    runs = fits & (chunked | (df.num_prompt_tokens <= (budget or 8192)))
    assert (req["status"] == "finished").tolist() == runs.tolist()
    assert (req.loc[~runs, "reason"].str.len() > 0).all()
    assert req.loc[fits & ~runs, "reason"].str.startswith("max_num_tokens: ").all()
    return df, kw, audit, res


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_CASES)
def test_nothing_is_ever_preempted_and_every_request_comes_out(rows, kv_blocks, block_size,
                                                               max_batch, budget, spec, chunked):
    df, kw, audit, res = _audited_run(rows, kv_blocks, block_size, max_batch, budget, spec,
                                      chunked)
    req = res.requests
    assert res.summary()["num_preemptions"] == 0
    assert (req["num_preemptions"] == 0).all()
    assert not audit.policy._exact  # the running total held all along (O(1) per request)
    # the running total is TensorRT-LLM's sum: the same run, bit for bit
    summed = run(df, scheduler=_Summing(budget or 8192, enable_chunked_context=chunked), **kw)
    pd.testing.assert_frame_equal(req, summed.requests, check_exact=True)
    pd.testing.assert_frame_equal(res.iterations, summed.iterations, check_exact=True)


def test_the_audit_sees_chunks_cut():
    """The audit's chunk check is not vacuous: a long prompt beside decodes is cut."""
    audit = _Audit(TensorRTLLM(100, enable_chunked_context=True))
    run(_df([(0.0, 30, 20), (DT / 2, 500, 2)]), scheduler=audit, cost_model=COST, kv_blocks=100,
        block_size=16, check=True)
    assert audit.cuts >= 4


@pytest.mark.parametrize("chunked", [False, True])
def test_prefix_caching_and_clusters_keep_the_reservation(chunked):
    """With the prefix cache (shared blocks) the policy reads the running set as TensorRT-LLM
    does; each replica of a cluster keeps its own reservation; nothing is preempted."""
    rows = [(0.01 * i, 200 + 16 * (i % 5), 40 + i % 7, [i % 3] * 4 + [100 + i] * 9)
            for i in range(60)]
    df = pd.DataFrame(rows, columns=["arrival_time", "num_prompt_tokens", "num_output_tokens",
                                     "hash_ids"])
    df.attrs["block_size"] = 16
    for extra in ({"prefix_caching": "block"}, {"replicas": 3, "router": "least_kv"}):
        res = run(df, scheduler="tensorrt-llm", cost_model=COST, kv_blocks=60, block_size=16,
                  check=True, enable_chunked_context=chunked,
                  token_budget=128 if chunked else None, **extra)
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

    def __init__(self, chunked=False):
        self.copies, self.prefill, self.chunked = {}, set(), chunked

    def schedule(self, replica, now):
        if id(replica) not in self.copies:
            self.copies[id(replica)] = (replica, TensorRTLLM(
                200, enable_chunked_context=True) if self.chunked else TensorRTLLM())
        policy = self.copies[id(replica)][1]
        policy.schedule(replica, now)
        if replica.on_prefilled is not None:
            self.prefill.add(id(replica))
            assert policy._exact  # requests leave without finishing: the sum, not the total
            need = sum(TensorRTLLM.to_completion(replica, r) - replica.held_blocks(r)
                       for r in replica.running.values())
            assert replica.blocks.num_free >= need


@pytest.mark.parametrize("chunked", [False, True])
def test_disaggregated_pools_read_the_running_set(chunked):
    """A prefill pool hands requests off without finishing them, while their KV is still in
    flight: its replicas read TensorRT-LLM's sum over the running set and keep the no-evict
    invariant; every request finishes (with chunked context, max_num_tokens 200: prompts of up
    to 540 tokens in chunks)."""
    df = _df([(0.002 * i, 100 + (37 + 18 * chunked) * (i % 9), 20 + i % 13) for i in range(80)])
    policy = _PerReplica(chunked)
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
    # ... and a named preset takes them from the config (sim run --free-gpu-memory-fraction)
    knob = dataclasses.replace(c, free_gpu_memory_fraction=0.95, token_budget=4096)
    assert knob.resolved_kv_blocks() == blocks(4096, 0.95) > blocks(4096)
    assert knob.policy().free_gpu_memory_fraction == 0.95
    assert knob.resolved().free_gpu_memory_fraction == 0.95
    assert (r.free_gpu_memory_fraction, r.enable_chunked_context) == (None, False)  # (0.9)
    chunked = dataclasses.replace(c, enable_chunked_context=True)
    assert chunked.policy().enable_chunked_context and chunked.resolved().enable_chunked_context
    # explicit knobs win
    mine = SimConfig(scheduler="tensorrt-llm", max_batch_size=64, block_size=64).resolved()
    assert (mine.max_batch_size, mine.block_size) == (64, 64)
    assert sim.POLICIES["tensorrt-llm"] is TensorRTLLM
    from sim.engine.presets import tensorrt_llm
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
    (lambda: SimConfig(scheduler="tensorrt-llm", free_gpu_memory_fraction=1),
     r"free_gpu_memory_fraction must be below 1 \(TensorRT-LLM refuses 1.0\), got 1.0"),
    (lambda: SimConfig(scheduler="tensorrt-llm", free_gpu_memory_fraction=-0.5),
     "free_gpu_memory_fraction must be a finite number > 0, got -0.5"),
    # read by TensorRT-LLM's accounting only (sim.specs.memory.READ_BY): never ignored
    (lambda: SimConfig(scheduler="vllm", free_gpu_memory_fraction=0.8),
     "free_gpu_memory_fraction=0.8 is read only by the tensorrt-llm memory accounting, but the "
     "'vllm' scheduler sizes its KV pool with vllm's"),
    (lambda: SimConfig(scheduler="sglang", free_gpu_memory_fraction=0.8),
     "but the 'sglang' scheduler sizes its KV pool with sglang's"),
    (lambda: SimConfig(scheduler="tensorrt-llm", free_gpu_memory_fraction=0.8, kv_blocks=100),
     "free_gpu_memory_fraction=0.8 sizes the KV pool, which kv_blocks=100 gives"),
    (lambda: SimConfig(scheduler=TensorRTLLM(), free_gpu_memory_fraction=0.8),
     "free_gpu_memory_fraction=0.8 is set but scheduler is a policy object"),
    (lambda: SimConfig(scheduler="chunked", enable_chunked_context=True),
     "enable_chunked_context=True is not used by the 'chunked' scheduler"),
    (lambda: SimConfig(scheduler="tensorrt-llm", context_chunking_policy="equal_progress"),
     "context_chunking_policy='equal_progress' chooses how prompts are cut: it needs "
     "enable_chunked_context=True"),
    (lambda: SimConfig(scheduler="tensorrt-llm", enable_chunked_context=True,
                       context_chunking_policy="round_robin"),
     r"context_chunking_policy must be one of \('first_come_first_served', 'equal_progress'\), "
     r"got 'round_robin'"),
    (lambda: SimConfig(scheduler="sglang", context_chunking_policy="equal_progress"),
     "context_chunking_policy='equal_progress' is not used by the 'sglang' scheduler"),
])
def test_bad_input_names_the_field_and_value(make, match):
    with pytest.raises(ValueError, match=match):
        make()
    with pytest.raises(TypeError, match="max_num_tokens must be an integer, got 'x'"):
        TensorRTLLM("x")


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_enable_chunked_context_is_true_or_false(value):
    with pytest.raises(TypeError, match=f"enable_chunked_context must be True or False, got "
                                        f"{value!r}"):
        TensorRTLLM(enable_chunked_context=value)
    if value is not None:  # (None in a config: the preset's default, off)
        with pytest.raises(TypeError, match="enable_chunked_context must be True or False"):
            SimConfig(scheduler="tensorrt-llm", enable_chunked_context=value)


class _Stepped:
    """The policy without ``quiet_when_decoding``: the engine forms every iteration."""

    def __init__(self, policy):
        self.policy = policy

    def __getattr__(self, name):
        if name == "quiet_when_decoding":
            raise AttributeError(name)
        return getattr(self.policy, name)

    def schedule(self, replica, now):
        self.policy.schedule(replica, now)


@pytest.mark.parametrize("policy", ["guaranteed_no_evict", "max_utilization"])
def test_chunked_context_fast_forwards_bit_identically(policy):
    """Pure-decode stretches between chunked prompts are fast-forwarded: the same run, bit for
    bit, as forming every iteration (and a prompt over max_num_tokens still goes in chunks)."""
    df = _df([(0.003 * i, 50 + 97 * (i % 7), 5 + 11 * (i % 5)) for i in range(40)])
    kw = dict(cost_model=sim.LinearCost(0.002, 1e-5, 2e-5, 1e-8), kv_blocks=120, block_size=16)

    def make():
        return TensorRTLLM(256, enable_chunked_context=True, capacity_scheduler_policy=policy)
    fast = run(df, scheduler=make(), **kw)
    stepped = run(df, scheduler=_Stepped(make()), **kw)
    pd.testing.assert_frame_equal(fast.requests, stepped.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.iterations, stepped.iterations, check_exact=True)
    assert (fast.requests["status"] == "finished").all()
    assert fast.iterations["num_prefill_tokens"].max() <= 256


def test_max_utilization_admits_what_fits_now_and_pauses_the_newest():
    """Pool of 10 blocks of 16. A (32 + 48 tokens: 5 blocks to completion) and B (48 + 48: 6)
    cannot both be reserved, so GUARANTEED_NO_EVICT starts B when A has finished (iteration
    48; B done at 96). MAX_UTILIZATION needs only this step's blocks: both prompts (2 + 3
    blocks) start at iteration 0; at iteration 33 both decodes cross into a new block with one
    free, so B, the most recently started, is paused (its 48 + 33 tokens recomputed when A has
    finished, at 48) and ends at 63: the same work a third sooner, at the price of 81 tokens
    prefilled again."""
    df = _df([(0.0, 32, 48), (0.0, 48, 48)])
    kw = dict(scheduler="tensorrt-llm", cost_model=COST, kv_blocks=10, block_size=16,
              check=True)
    gne = run(df, **kw)
    assert _starts(gne) == [0, 48] and (gne.requests["finish_time"] / DT).tolist() == [48, 96]
    assert gne.summary()["num_preemptions"] == 0
    mu = run(df, capacity_scheduler_policy="max_utilization", **kw)
    req = mu.requests
    assert _starts(mu) == [0, 0] and (req["finish_time"] / DT).tolist() == [48, 63]
    assert req["num_preemptions"].tolist() == [0, 1]
    it = mu.iterations
    assert it.index[it["num_preemptions"] > 0].tolist() == [33]
    assert it.loc[it["num_prefill_tokens"] > 0, "num_prefill_tokens"].tolist() == [80, 81]
    assert it["kv_blocks_used"].max() <= 10
    assert mu.config.capacity_scheduler_policy == "max_utilization"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**_CASES)
def test_max_utilization_loses_nothing(rows, kv_blocks, block_size, max_batch, budget, spec,
                                       chunked):
    """Every request finishes or is rejected at arrival with its reason; the budget and the
    chunk rule hold, and every running request arrived before every waiting one (the audit:
    why a waiting request never has a younger started one to pause); the engine's invariants
    hold every iteration (check=True)."""
    _, _, _, res = _audited_run(rows, kv_blocks, block_size, max_batch, budget, spec, chunked,
                                "max_utilization")
    assert res.iterations["num_preemptions"].sum() == res.requests["num_preemptions"].sum()


@pytest.mark.parametrize("value", ["fcfs", None, 3])
def test_capacity_scheduler_policy_is_one_of_tensorrt_llms(value):
    with pytest.raises(ValueError, match=r"capacity_scheduler_policy must be one of \("
                                   r"'guaranteed_no_evict', 'max_utilization'\), got "
                                   + re.escape(repr(value))):
        TensorRTLLM(capacity_scheduler_policy=value)
    assert TensorRTLLM(capacity_scheduler_policy=" MAX_Utilization ").max_utilization
    with pytest.raises(ValueError, match="capacity_scheduler_policy='max_utilization' is not "
                                         "used by the 'vllm' scheduler"):
        SimConfig(scheduler="vllm", capacity_scheduler_policy="max_utilization")


@pytest.mark.parametrize("extra", [{"closed_loop": "users"}, {"replicas": 2},
                                   {"disaggregation": "pools"}])
def test_rejections_over_max_num_tokens_in_closed_loops_clusters_and_pools(extra):
    """A prompt over max_num_tokens is rejected wherever it arrives: a closed loop's user sends
    the next request at once, a cluster's replica and a prefill pool refuse it; every request
    comes out once."""
    import workloads
    extra = dict(extra)
    if extra.get("closed_loop"):
        extra["closed_loop"] = workloads.ClosedLoop(3)
    if extra.get("disaggregation"):
        extra["disaggregation"] = sim.Disaggregation(1, 1, link_bandwidth_gbps=50.0)
    df = _df([(0.001 * i, 90 + 40 * (i % 4), 4 + i % 3) for i in range(24)])  # 90..210
    res = run(df, scheduler="tensorrt-llm", token_budget=150, cost_model=COST, kv_blocks=60,
              block_size=16, check=True, **extra)
    req = res.requests
    over = df["num_prompt_tokens"] > 150
    assert (req["status"] == "rejected").tolist() == over.tolist()
    assert req.loc[over, "reason"].str.startswith("max_num_tokens: ").all()
    assert res.summary()["num_finished"] == int((~over).sum())


def test_equal_progress_deals_the_budget_a_block_at_a_time():
    """EQUAL_PROGRESS, max_num_tokens 100, blocks of 16 (by hand, TensorRT-LLM's loop): A (250)
    and B (10) do not both fit; round 1 gives A 16 and B its 10, rounds 2-5 A 16 more each
    (74 + 16 = 90), round 6 would overflow: A 80, B 10, where FIRST_COME_FIRST_SERVED gives A
    96 and B nothing (4 left); then A alone, 96 of its 170 beside B's decode, its last 74."""
    df = _df([(0.0, 250, 3), (0.0, 10, 2)])
    kw = dict(scheduler="tensorrt-llm", token_budget=100, cost_model=COST, kv_blocks=100,
              block_size=16, enable_chunked_context=True, check=True)
    ep = run(df, context_chunking_policy="equal_progress", **kw)
    assert _prefill_tokens(ep)[:3] == [90, 96, 74]  # then A's 250 - 80 - 96 = 74 whole
    assert _starts(ep) == [0, 0]
    fcfs = run(df, **kw)
    assert _prefill_tokens(fcfs)[:3] == [96, 96, 68] and _starts(fcfs) == [0, 2]
    assert ep.config.context_chunking_policy == "equal_progress"
    assert fcfs.config.context_chunking_policy == "first_come_first_served"
    assert run(df.head(1), scheduler="tensorrt-llm").config.context_chunking_policy is None


@pytest.mark.parametrize("chunking", ["first_come_first_served", "equal_progress"])
def test_max_utilization_admits_a_prompt_only_beside_the_running_prompts_whole_blocks(chunking):
    """MAX_UTILIZATION with chunked context, 16 blocks of 16 tokens, max_num_tokens 100: A (200
    tokens: 13 blocks) and B (64: 4 blocks), one output token each. TensorRT-LLM takes A's 13
    blocks at its first chunk, so B (4 > 3 left) waits for A to finish, under either chunking
    policy: chunks 96, 96, 8 (A), then B's 64, no pause. (review6: EQUAL_PROGRESS admitted B at
    iteration 1 beside A's unheld rest, 48 + 48, then paused it for A's last blocks and
    recomputed it: 96, 96, 56, 64 and one preemption; on a 300-request workload 315 pauses
    where FIRST_COME_FIRST_SERVED had 20.)"""
    df = _df([(0.0, 200, 1), (0.0, 64, 1)])
    res = run(df, scheduler="tensorrt-llm", capacity_scheduler_policy="max_utilization",
              enable_chunked_context=True, context_chunking_policy=chunking, token_budget=100,
              kv_blocks=16, block_size=16, cost_model=COST, check=True)
    assert _prefill_tokens(res) == [96, 96, 8, 64]
    assert res.requests["num_preemptions"].tolist() == [0, 0]
    assert _starts(res) == [0, 3]


@pytest.mark.parametrize("policy", ["guaranteed_no_evict", "max_utilization"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**{k: v for k, v in _CASES.items() if k != "chunked"})
def test_equal_progress_loses_nothing(policy, rows, kv_blocks, block_size, max_batch, budget,
                                      spec):
    """Under either capacity scheduler: every request finishes or is rejected for the pool,
    the budget holds, a prompt is cut only at whole blocks (the audit), and under
    MAX_UTILIZATION every running request arrived before every waiting one."""
    _audited_run(rows, kv_blocks, block_size, max_batch, budget, spec, True, policy,
                 chunking="equal_progress")
