"""sim.costs.roofline_price: the roofline's price from a batch's fields equals cost(batch) bit
for bit, and the engine uses it only where it is that price."""

import dataclasses
import math

import pytest
from hypothesis import given, settings, strategies as st

import workloads as wl
from sim.costs.dp_attention import DPAttentionCost
from sim.costs.overheads import EngineOverheads, OverheadCost
from sim.costs.roofline import RooflineCost, fitted_params
from sim.costs.roofline_price import DraftPrice, RooflinePrice, batch_pricer
from sim.costs.simple import LinearCost
from sim.engine import run
from sim.engine.core.batch import make_batch
from sim.engine.speculation.draft_cost import DraftCost
from sim import SpeculativeConfig

# dense and MoE presets over GPUs with fitted, partly fitted and assumed terms, precisions
COSTS = [RooflineCost("llama-3.1-8b", "h100"),
         RooflineCost("llama-3.1-70b", "h200", tensor_parallel=4, weight_dtype="fp8",
                      kv_dtype="fp8"),
         RooflineCost("mixtral-8x7b", "mi300x", tensor_parallel=2),
         RooflineCost("qwen2.5-7b", "l40s", weight_dtype="int4"),
         RooflineCost("qwen3-30b-a3b", "b200", expert_parallel=2, tensor_parallel=2),
         RooflineCost("llama-3.1-8b", "a100",  # decode batches over 8: eager
                      params=dataclasses.replace(fitted_params("a100"), cuda_graph_max_batch=8))]
OVERHEADS = [EngineOverheads(per_iter_s=2e-3, per_seq_s=1e-5),
             EngineOverheads(per_iter_s=4e-3, per_seq_s=2e-5, overlap=True),
             EngineOverheads(per_request_s=0.05),  # (no step time: the base's price alone)
             EngineOverheads(per_prefill_iter_s=0.08),  # a prefill iteration's fixed time
             EngineOverheads(per_prefill_iter_s=0.06, per_iter_s=1e-3, per_seq_s=3e-5,
                             overlap=True)]

batches = st.fixed_dictionaries({
    "prefills": st.lists(st.tuples(st.integers(1, 2048), st.integers(0, 30000)), max_size=4),
    "decodes": st.integers(0, 640),
    "context": st.integers(0, 4_000_000),
    "spec": st.sampled_from([0, 0, 1, 4]),
})


def _batch(b):
    n_dec = b["decodes"]
    ctx = b["context"] if n_dec else 0
    prefills = tuple(b["prefills"])
    return make_batch(7, prefills, sum(n for n, _ in prefills), n_dec, ctx, None, None, None,
                      b["spec"])


def _bits(x) -> str:
    return float(x).hex()


@settings(max_examples=150, deadline=None)
@given(b=batches, which=st.integers(0, len(COSTS) - 1))
def test_price_is_cost_of_the_batch_bit_for_bit(b, which):
    cost = COSTS[which]
    batch = _batch(b)
    price = batch_pricer(cost)
    assert isinstance(price, RooflinePrice)
    got = price.price(list(batch.prefills), batch.num_prefill_tokens, batch.num_decode_tokens,
                      batch.decode_context_tokens, batch.num_spec_tokens)
    assert _bits(got) == _bits(cost(batch))


@settings(max_examples=100, deadline=None)
@given(b=batches, which=st.integers(0, len(COSTS) - 1), ov=st.sampled_from(OVERHEADS))
def test_price_with_overheads_is_overhead_cost_bit_for_bit(b, which, ov):
    cost = OverheadCost(COSTS[which], ov)
    batch = _batch(b)
    price = batch_pricer(cost)
    got = price.price(batch.prefills, batch.num_prefill_tokens, batch.num_decode_tokens,
                      batch.decode_context_tokens, batch.num_spec_tokens)
    assert _bits(got) == _bits(cost(batch))


DRAFTS = [None, RooflineCost("llama-3.2-1b", "h100"), RooflineCost("qwen2.5-0.5b", "l40s")]


@settings(max_examples=150, deadline=None)
@given(b=batches, which=st.integers(0, len(COSTS) - 1), draft=st.sampled_from(DRAFTS),
       k=st.integers(1, 6), ratio=st.sampled_from([0.05, 0.3, 1.0]),
       ov=st.sampled_from([None] + OVERHEADS))
def test_draft_price_is_draft_cost_of_the_batch_bit_for_bit(b, which, draft, k, ratio, ov):
    target = COSTS[which] if ov is None else OverheadCost(COSTS[which], ov)
    cost = DraftCost(target, k, ratio=None if draft else ratio, draft=draft)
    batch = _batch(b)
    price = batch_pricer(cost)
    assert isinstance(price, DraftPrice)
    got = price.price(batch.prefills, batch.num_prefill_tokens, batch.num_decode_tokens,
                      batch.decode_context_tokens, batch.num_spec_tokens)
    assert _bits(got) == _bits(cost(batch))


def test_overlapped_overheads_take_the_longer_of_gpu_and_cpu():
    cost = RooflineCost("llama-3.1-8b", "h100")
    batch = make_batch(0, (), 0, 4, 4000, None, None, None, 0)
    gpu = cost(batch)
    slow_cpu = EngineOverheads(per_iter_s=gpu * 3, overlap=True)
    fast_cpu = EngineOverheads(per_iter_s=gpu / 3, overlap=True)
    assert batch_pricer(OverheadCost(cost, slow_cpu)).price((), 0, 4, 4000, 0) == gpu * 3
    assert batch_pricer(OverheadCost(cost, fast_cpu)).price((), 0, 4, 4000, 0) == gpu
    serial = EngineOverheads(per_iter_s=1e-3, per_seq_s=1e-4)
    assert math.isclose(batch_pricer(OverheadCost(cost, serial)).price((), 0, 4, 4000, 0),
                        gpu + 1e-3 + 4e-4, rel_tol=1e-12)


class _Repriced(RooflineCost):
    """A subclass re-pricing iterations: the engine must call it (no roofline price)."""

    def __call__(self, batch):
        return 2.0 * super().__call__(batch)


@pytest.mark.parametrize("cost, why", [
    (_Repriced("llama-3.1-8b", "h100"), "a subclass overriding __call__"),
    (RooflineCost("deepseek-v3", "h200", tensor_parallel=8), "MLA up-projections"),
    (RooflineCost("gpt-oss-20b", "h100"), "sliding-window layers"),
    (DPAttentionCost("qwen3-30b-a3b", "h100", tensor_parallel=1, expert_parallel=2,
                     attention_dp=2), "data-parallel attention"),
    (LinearCost(base=1e-3), "another cost model"),
    (OverheadCost(LinearCost(base=1e-3), OVERHEADS[0]), "overheads over another cost model"),
])
def test_no_price_where_it_is_not_the_cost(cost, why):
    assert batch_pricer(cost) is None, why


class _RepricedDraft(DraftCost):
    def __call__(self, batch):
        return 2.0 * super().__call__(batch)


@pytest.mark.parametrize("cost, why", [
    (_RepricedDraft(RooflineCost("llama-3.1-8b", "h100"), 4, ratio=0.1), "a re-pricing subclass"),
    (DraftCost(LinearCost(base=1e-3), 4, ratio=0.1), "another target cost model"),
    (DraftCost(RooflineCost("llama-3.1-8b", "h100"), 4, draft=LinearCost(base=1e-4)),
     "another draft cost model"),
    (DraftCost(_Repriced("llama-3.1-8b", "h100"), 4, ratio=0.1), "a re-pricing target"),
])
def test_no_draft_price_where_it_is_not_the_cost(cost, why):
    assert batch_pricer(cost) is None, why


def _tables(res):
    return res.requests.to_csv() + res.iterations.to_csv()


class _SameCost(RooflineCost):
    """The roofline priced through its Batch (a subclass overriding __call__, same price)."""

    def __call__(self, batch):
        return super().__call__(batch)


@pytest.mark.parametrize("kw", [
    {"scheduler": "chunked"},
    {"scheduler": "sglang", "max_batch_size": 512},
    {"scheduler": "vllm", "engine_overheads": "fitted"},
    {"scheduler": "continuous", "kv_blocks": 900},  # preemptions
], ids=["chunked", "sglang", "vllm-overheads", "continuous-preempting"])
def test_the_engine_priced_without_batches_gives_the_same_run(kw):
    df = wl.synthetic(600, rate=60.0, prompt=wl.LogNormal(800, 1.0, max_tokens=6000),
                      output=wl.LogNormal(150, 1.0, max_tokens=1500), seed=3)
    base = {"model": "llama-3.1-8b", "gpu": "h100", "max_batch_size": 128, **kw}
    fast = run(df, cost_model=RooflineCost("llama-3.1-8b", "h100"), **base)
    stepped = run(df, cost_model=_SameCost("llama-3.1-8b", "h100"), **base)
    assert len(fast.iterations) > 600
    assert _tables(fast) == _tables(stepped)


@pytest.mark.parametrize("spec", [
    SpeculativeConfig(num_speculative_tokens=4, acceptance_rate=0.8, draft_cost_ratio=0.05),
    SpeculativeConfig(num_speculative_tokens=3, acceptance_rate=0.6,
                      draft_model="llama-3.2-1b"),
], ids=["ratio", "draft-model"])
def test_speculative_runs_priced_without_batches_give_the_same_run(spec):
    df = wl.synthetic(400, rate=40.0, prompt=wl.LogNormal(600, 1.0, max_tokens=4000),
                      output=wl.LogNormal(120, 1.0, max_tokens=1000), seed=5)
    base = {"model": "llama-3.1-8b", "gpu": "h100", "max_batch_size": 64,
            "scheduler": "chunked", "speculative": spec}
    fast = run(df, cost_model=RooflineCost("llama-3.1-8b", "h100"), **base)
    stepped = run(df, cost_model=_SameCost("llama-3.1-8b", "h100"), **base)
    assert len(fast.iterations) > 400
    assert _tables(fast) == _tables(stepped)
