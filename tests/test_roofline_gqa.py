"""Decode attention on a kernel that is not group-aware (``attn_decode_reread_fraction``): a
grouped-query model's KV bytes cross HBM ``1 + f (G - 1)`` times per decode step; ``f`` is fitted
to TensorRT-LLM's XQA blog pair (Llama-2-70B, one H200: 1,227 tok/s/GPU without XQA, 2,941 with
it) and nothing else. The per-row errors it gives are asserted in test_roofline_attention.py."""

import dataclasses
import json
from importlib import resources

import pytest
from hypothesis import given, settings, strategies as st

from sim import get_gpu, get_model
from sim.costs.roofline import RooflineCost, RooflineParams, fitted_params
from sim.engine.core.batch import Batch


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


def test_fit_reproduces_the_xqa_blog_ratio(load_script):
    fr = load_script("experiments/fit_roofline.py")
    params = {g: fitted_params(g) for g in ("a100", "h100")}
    f, rep = fr.fit_per_head_decode(params)
    shipped = json.loads(resources.files("sim").joinpath("data/roofline_fit.json").read_text())
    assert shipped["per_head_decode"]["params"] == {"attn_decode_reread_fraction": f}
    assert fitted_params("h200", group_aware_decode=False).attn_decode_reread_fraction == f
    # 2,941 / 1,227 tok/s/GPU: the same static batch (192 x 128/2,048, FP8) takes 2.397x as
    # long without XQA; the fitted fraction reproduces it within its 3-decimal rounding
    assert rep["measured_ratio"] == pytest.approx(2941 / 1227, abs=1e-4)
    assert rep["predicted_ratio"] == pytest.approx(2941 / 1227, rel=2e-3)
    # physical: most of Llama-2-70B's 7 re-reads per KV head come from HBM (the per-head
    # kernel's working set at batch 192 is far beyond the H200's 50 MB L2), but not more
    assert 0.5 < f < 1 and rep["query_group_size"] == 8
    assert rep["decode_kv_reads"] == pytest.approx(1 + 7 * f, abs=1e-4)
    # the same ratio from the cost model directly: the pair's two static batches
    lat = fr.load_latency()
    pair = lat[lat["engine"].isin(fr.XQA_PAIR) & (lat["batch_size"] == 192)]
    assert len(pair) == 2 and pair["value"].max() == 2941 and pair["value"].min() == 1227
    h200 = fitted_params("h200")
    without = fr.predict_published(pair[pair["engine"] == fr.XQA_PAIR[0]], h200, reread=f)[0]
    with_ = fr.predict_published(pair[pair["engine"] == fr.XQA_PAIR[1]], h200, reread=f)[0]
    assert with_ / without == pytest.approx(rep["predicted_ratio"], abs=1e-4)
    # the engine marks: the run with XQA is group-aware whatever the fraction
    assert fr.XQA_PAIR[0] in fr.PER_HEAD_DECODE_ENGINES
    assert fr.XQA_PAIR[1] not in fr.PER_HEAD_DECODE_ENGINES
    assert with_ == fr.predict_published(pair[pair["engine"] == fr.XQA_PAIR[1]], h200)[0]


def test_fit_refuses_a_ratio_no_fraction_reaches(load_script, monkeypatch):
    fr = load_script("experiments/fit_roofline.py")
    lat = fr.load_latency()
    doctored = lat.copy()
    doctored.loc[doctored["engine"] == fr.XQA_PAIR[0], "value"] = 100.0  # a 29x slowdown
    monkeypatch.setattr(fr, "load_latency", lambda: doctored)
    params = {g: fitted_params(g) for g in ("a100", "h100")}
    with pytest.raises(ValueError, match="even attn_decode_reread_fraction 1 predicts"):
        fr.fit_per_head_decode(params)
    # ... and a pair that is not the same run is refused
    other = lat.copy()
    other.loc[other["engine"] == fr.XQA_PAIR[0], "batch_size"] = 96
    monkeypatch.setattr(fr, "load_latency", lambda: other)
    with pytest.raises(ValueError, match="of the same setting"):
        fr.fit_per_head_decode(params)


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


def test_reports_of_the_rows_the_kernel_moved(load_script):
    fr = load_script("experiments/fit_roofline.py")
    params = {g: fitted_params(g) for g in ("a100", "h100")}
    after, before = fr.decode_report(params), fr.decode_report(params, 0.0)
    moved = fr.moved_rows(before, after)
    # every grouped-query row of TensorRT-LLM 0.5, 0.6a and 0.6.1, and nothing else
    assert len(moved) == 18 and set(moved["engine"]) == set(fr.PER_HEAD_DECODE_ENGINES)
    assert set(moved["model"]) == {"llama-2-70b", "falcon-180b"}
    assert (moved["error_pct"] > moved["error_before_pct"]).all()  # each step got slower
    assert fr.moved_rows(before, before).empty
    split = fr.head_split_report(before, after).set_index(["attention", "split"])
    gqa, mha = split.loc[("grouped-query", "held-out")], split.loc[("multi-head", "held-out")]
    # (Falcon-180B's rows with TensorRT-LLM's two all-reduces per layer, SEPARATE_REDUCE_ENGINES:
    # 47.9 -> 8.5 % with one)
    assert gqa["points"] == 9 and gqa["median_abs_before_pct"] >= 44
    assert gqa["median_abs_error_pct"] <= 10.5 and gqa["max_error_pct"] <= 29
    assert mha["median_abs_before_pct"] == mha["median_abs_error_pct"]  # multi-head: unmoved
