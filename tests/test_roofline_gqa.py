"""Decode attention on a kernel that is not group-aware (``attn_decode_reread_fraction``): a
grouped-query model's KV bytes cross HBM ``1 + f (G - 1)`` times per decode step; ``f`` is fitted
to TensorRT-LLM's XQA blog pair (Llama-2-70B, one H200: 1,227 tok/s/GPU without XQA, 2,941 with
it) and nothing else. The per-row errors it gives are asserted in test_roofline_attention.py."""

import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from sim import get_gpu, get_model
from sim.costs.roofline import RooflineCost, RooflineParams, fitted_params
from sim.engine.batch import Batch


def _decode(cost, batch_size, context):
    return cost(Batch(0, (), 0, batch_size, context))


def _with(gpu, f, **kw):
    return dataclasses.replace(fitted_params(gpu), attn_decode_reread_fraction=f, **kw)


@pytest.mark.parametrize("model,gpu,tp,kv_dtype", [
    ("llama-2-70b", "h100", 1, "fp16"), ("llama-2-70b", "h200", 8, "fp8"),
    ("falcon-180b", "a100", 8, "fp16"), ("qwen3-30b-a3b", "h100", 2, "fp16"),
    ("llama-3.1-8b", "a100", 1, "fp8")])
def test_decode_kv_bytes_scale_as_the_closed_form(model, gpu, tp, kv_dtype):
    m, g = get_model(model), get_gpu(gpu)
    kv_heads = max(1, m.num_key_value_heads // tp)
    group = m.num_attention_heads / tp / kv_heads  # query heads per KV head on one GPU
    kvb = 1 if kv_dtype == "fp8" else 2
    for f in (0.0, 0.25, 0.912, 1.0):
        p = _with(gpu, f)
        cost = RooflineCost(model, gpu, tensor_parallel=tp, kv_dtype=kv_dtype, params=p)
        assert cost.query_group_size == group and cost.decode_kv_reads == 1 + f * (group - 1)
        # a decode step's attention grows with its context at the bytes it reads: K and V of
        # every KV head of the GPU, every layer, decode_kv_reads times, at the decode bandwidth
        per_token = (_decode(cost, 64, 64 * 3000) - _decode(cost, 64, 64 * 1000)) / (64 * 2000)
        nbytes = m.num_hidden_layers * 2 * kv_heads * m.head_dim * kvb * (1 + f * (group - 1))
        assert per_token == pytest.approx(
            nbytes / (g.memory_bandwidth_gbps * 1e9 * p.attn_decode_memory_eff), rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(f=st.floats(0.0, 1.0), batch=st.integers(1, 512), context=st.integers(1, 4096),
       model=st.sampled_from(["llama-2-7b", "gpt-j-6b", "deepseek-v3"]))
def test_one_kv_head_per_query_head_or_a_latent_reads_once_bit_for_bit(f, batch, context,
                                                                          model):
    # multi-head models (G = 1) and MLA (one latent for every head) have nothing to re-read:
    # any fraction prices their decode exactly as the default (group-aware) kernel does
    tp = 8 if model == "deepseek-v3" else 1
    base = RooflineCost(model, "h100", tensor_parallel=tp)
    other = RooflineCost(model, "h100", tensor_parallel=tp, params=_with("h100", f))
    assert other.decode_kv_reads == 1.0
    b = Batch(0, [(17, 5)], 17, batch, batch * context)
    assert other(b) == base(b) and _decode(other, batch, batch * context) == _decode(
        base, batch, batch * context)


def test_default_is_the_group_aware_kernel_and_shipped_prices_do_not_move():
    for gpu in ("a100", "h100", "h200", "b200"):
        assert fitted_params(gpu).attn_decode_reread_fraction == 0.0
        assert RooflineParams().attn_decode_reread_fraction == 0.0
    cost = RooflineCost("llama-2-70b", "h100", tensor_parallel=2)
    assert cost.decode_kv_reads == 1.0
    zero = RooflineCost("llama-2-70b", "h100", tensor_parallel=2, params=_with("h100", 0.0))
    for batch, context in ((1, 100), (64, 64 * 2100), (480, 480 * 1000)):
        assert _decode(cost, batch, batch * context) == _decode(zero, batch, batch * context)


@settings(max_examples=30, deadline=None)
@given(f=st.floats(0.0, 0.999), df=st.floats(0.001, 1.0), batch=st.integers(1, 256),
       context=st.integers(16, 4096))
def test_more_rereads_never_make_a_decode_step_faster(f, df, batch, context):
    lo = RooflineCost("llama-2-70b", "h200", params=_with("h200", f))
    hi = RooflineCost("llama-2-70b", "h200", params=_with("h200", min(1.0, f + df)))
    assert _decode(hi, batch, batch * context) >= _decode(lo, batch, batch * context)
    # the engine's fast-forward of pure-decode iterations prices it identically
    assert hi.pure_decode_cost(batch)(batch * context) == _decode(hi, batch, batch * context)


@pytest.mark.parametrize("value,exc,message", [
    (-0.1, ValueError, "attn_decode_reread_fraction must be a finite number >= 0, got -0.1"),
    (1.5, ValueError, "attn_decode_reread_fraction must be at most 1, got 1.5"),
    (float("nan"), ValueError, "attn_decode_reread_fraction must be a finite number >= 0"),
    ("0.5", TypeError, "attn_decode_reread_fraction must be a number, got '0.5'"),
    (True, TypeError, "attn_decode_reread_fraction must be a number, got True"),
    (None, TypeError, "attn_decode_reread_fraction must be a number, got None")])
def test_bad_fraction_is_refused_naming_field_and_value(value, exc, message):
    with pytest.raises(exc) as e:
        RooflineParams(attn_decode_reread_fraction=value)
    assert str(e.value).startswith(message)


def test_bad_group_aware_flag_is_refused():
    with pytest.raises(TypeError, match="group_aware_decode must be True or False, got 'no'"):
        fitted_params("h100", group_aware_decode="no")
    assert fitted_params("h100", group_aware_decode=True) == fitted_params("h100")
