"""The roofline's prefill attention efficiency, fitted to published FlashAttention-2/-3 forward
benchmarks (``sim/data/attention_kernels.csv``), and its decode steps against published per-step
and batch latencies (``sim/data/published_latency.csv``). The numbers asserted are the errors the
README's Fidelity table reports."""

import dataclasses
import json
from importlib import resources

import numpy as np
import pytest

from sim import get_gpu, get_model
from sim.costs.roofline import RooflineCost, fitted_params
from sim.engine.core.batch import Batch


@pytest.fixture(scope="module")
def fit_roofline():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "experiments" / "fit_roofline.py"
    spec = importlib.util.spec_from_file_location("fit_roofline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _shipped():
    return json.loads(resources.files("sim").joinpath("data/roofline_fit.json").read_text())


def test_prefill_attention_curve_is_fitted_to_published_kernels(fit_roofline):
    fitted = fit_roofline.fit_attention()
    for gpu, terms in fitted.items():  # the shipped terms are this fit's
        p = fitted_params(gpu)
        assert (p.attn_prefill_compute_eff, p.attn_prefill_half_tokens) == (
            terms["attn_prefill_compute_eff"], terms["attn_prefill_half_tokens"])
    # physical: below the fp16 peak, FlashAttention-3 on an H100 nearer it than FA-2 on an A100
    a, h = fitted["a100"], fitted["h100"]
    assert 0.4 < a["attn_prefill_compute_eff"] < h["attn_prefill_compute_eff"] < 0.75
    assert 0 < a["attn_prefill_half_tokens"] < h["attn_prefill_half_tokens"] < 1024
    params = {g: fitted_params(g) for g in fitted}
    rep = fit_roofline.attention_report(params)
    assert len(rep) == 50 and set(rep["split"]) == {"fit", "held-out", "other-kernel"}
    err = rep["error_pct"].abs()

    def sel(gpu, split, **kw):
        m = (rep["gpu"] == gpu) & (rep["split"] == split)
        for k, v in kw.items():
            m &= rep[k] == v
        return m

    # fit rows: A100 (FA-2, 1,024 and 4,096 tokens) within 1.3 %, H100 (FA-3, head dim 128,
    # 512-16k tokens) within 3.1 %
    assert err[sel("a100", "fit")].max() <= 1.5 and err[sel("h100", "fit")].max() <= 3.1
    # held out: a 1,024-token chunk over a 3,072-token cached prefix on the A100 (the chunked
    # prefill formula 4 c (p + c/2)), 8.7-10.6 % slow
    chunk = sel("a100", "held-out")
    assert chunk.sum() == 2 and err[chunk].max() <= 11
    # held out on the H100: head dim 256 within 7.2 %; head dim 64 runs 25-36 % below the
    # head-dim-128 curve (one curve for every head dim: the model's limit, reported)
    assert err[sel("h100", "held-out", head_dim=256)].max() <= 7.5
    d64 = rep[sel("h100", "held-out", head_dim=64, dtype="fp16")]["error_pct"]
    assert (d64 < -24).all() and (d64 > -37).all()
    # FlashAttention-2 on the H100 (not what the curve prices) is 30-53 % slower than FA-3
    fa2 = rep[sel("h100", "other-kernel")]["error_pct"]
    assert (fa2 < -30).all()
    # the shipped report is this one
    assert _shipped()["attention_report"] == rep.round(2).to_dict(orient="records")


def test_fp8_prefill_attention_curve_from_flashattention3_fp8(fit_roofline):
    """FlashAttention-3's FP8 forward (H100, causal): its own curve at the FP8 peak, fitted on
    head dim 256 (512-16k tokens), head dim 64 held out."""
    h = fit_roofline.fit_attention()["h100"]
    p = fitted_params("h100")
    assert (p.attn_prefill_fp8_compute_eff, p.attn_prefill_fp8_half_tokens) == (
        h["attn_prefill_fp8_compute_eff"], h["attn_prefill_fp8_half_tokens"])
    # 0.558 of the 1,979 TFLOP/s FP8 peak at saturation (1.10 PFLOP/s; the paper's best causal
    # bar 1,024), half of it at 1,184 tokens: a slower rise than FP16's 608
    assert 0.5 < p.attn_prefill_fp8_compute_eff < 0.6
    assert p.attn_prefill_half_tokens < p.attn_prefill_fp8_half_tokens < 2048
    assert fitted_params("a100").attn_prefill_fp8_compute_eff is None  # no FP8 tensor cores
    rep = fit_roofline.attention_report({"h100": p})
    fp8 = rep[rep["dtype"] == "fp8"].set_index("split")["error_pct"]
    assert len(fp8["fit"]) == 6 and fp8["fit"].abs().max() <= 1.8
    # held out, head dim 64: 51-52 % slower than the head-dim-256 curve (the fp16 curve's own
    # head-dim-64 gap, 25-36 %, is larger in FP8; the curve has no head-dim term)
    assert len(fp8["held-out"]) == 2 and ((fp8["held-out"] < -50) & (fp8["held-out"] > -53)).all()


def test_fp8_kv_cache_prefill_attention_runs_at_the_fp8_peak():
    """An fp8 KV cache on a GPU with FP8 tensor cores prices prefill attention at the FP8 peak
    on the FP8 curve (closed form), leaves decode attention's compute bound at the fp16 peak,
    and keeps ``pure_decode_cost`` equal to ``__call__``; without FP8 cores, with int8 KV, or
    with no fitted FP8 curve it is the fp16 pricing."""
    g, m = get_gpu("h100"), get_model("llama-3.1-8b")
    p = fitted_params("h100")
    fp8 = RooflineCost("llama-3.1-8b", "h100", kv_dtype="fp8")
    fp16 = RooflineCost("llama-3.1-8b", "h100", kv_dtype="fp16")
    assert (fp8.attention_dtype, fp16.attention_dtype) == ("fp8", "fp16")
    n = 8192  # compute-bound: the FLOP term of a full prompt, all layers
    flops = 4.0 * n * (n / 2.0) * m.q_size * m.num_hidden_layers
    want = flops / (g.fp8_tflops * 1e12 * p.attn_prefill_fp8_compute_eff
                    * n / (n + p.attn_prefill_fp8_half_tokens))
    assert fp8.prefill_attention_time(n, 0) == pytest.approx(want, rel=1e-12)
    assert fp8.prefill_attention_eff(n) == pytest.approx(
        p.attn_prefill_fp8_compute_eff * n / (n + p.attn_prefill_fp8_half_tokens))
    # the hot path prices the same attention (whole iteration - its linear and fixed parts),
    # and FP8 makes a long prompt's attention ~1.4x faster here
    for cost in (fp8, fp16):
        attn_call = cost(Batch(0, [(n, 0)], n, 0, 0)) - cost.linear_time(n, 1) \
            - cost.fixed_time(1)
        assert attn_call == pytest.approx(cost.prefill_attention_time(n, 0), rel=1e-9)
    assert 1.2 < fp16.prefill_attention_time(n, 0) / fp8.prefill_attention_time(n, 0) < 1.7
    # decode: only the KV bytes change (half), priced the same way in both paths
    for ctx in (128, 4096, 1 << 16):
        d = Batch(0, (), 0, 64, 64 * ctx)
        assert fp8.pure_decode_cost(64)(64 * ctx) == fp8(d)
    # the fp16 pricing where FP8 attention does not apply
    for cost in (RooflineCost("llama-3.1-8b", "a100", kv_dtype="fp8"),
                 RooflineCost("llama-3.1-8b", "h100", kv_dtype="int8"),
                 RooflineCost("llama-3.1-8b", "h100", kv_dtype="fp8", params=dataclasses.replace(
                     p, attn_prefill_fp8_compute_eff=None))):
        assert cost.attention_dtype == "fp16"
    none = RooflineCost("llama-3.1-8b", "h100", kv_dtype="fp8",
                        params=dataclasses.replace(p, attn_prefill_fp8_compute_eff=None))
    kv_bytes = RooflineCost("llama-3.1-8b", "h100", kv_dtype=1.0)  # one byte, dtype unnamed
    assert none.prefill_attention_time(n, 0) == fp16.prefill_attention_time(n, 0)
    assert kv_bytes.attention_dtype == "fp16"
    # an unfitted GPU with FP8 cores (H200) takes the H100's curve: the only one fitted
    assert fitted_params("h200").attn_prefill_fp8_compute_eff == p.attn_prefill_fp8_compute_eff
    with pytest.raises(ValueError, match="attn_prefill_fp8_compute_eff"):
        dataclasses.replace(p, attn_prefill_fp8_compute_eff=1.5)
    with pytest.raises(ValueError, match="attn_prefill_fp8_half_tokens"):
        dataclasses.replace(p, attn_prefill_fp8_half_tokens=-1.0)


def test_prefill_attention_efficiency_saturates_in_the_context():
    cost = RooflineCost("llama-2-7b", "h100")
    p = cost.params
    e, half = p.attn_prefill_compute_eff, p.attn_prefill_half_tokens
    assert cost.prefill_attention_eff(half) == pytest.approx(e / 2)
    effs = [cost.prefill_attention_eff(L) for L in (128, 512, 2048, 8192, 1 << 20)]
    assert effs == sorted(effs) and effs[-1] == pytest.approx(e, rel=1e-3)
    # compute-bound chunk: the closed form, 4 c (p + c/2) d_q FLOPs per layer at eff(p + c)
    m, g = get_model("llama-2-7b"), get_gpu("h100")
    c, cached = 2048, 6144
    flops = m.num_hidden_layers * 4 * c * (cached + c / 2) * m.q_size
    assert cost.prefill_attention_time(c, cached) == pytest.approx(
        flops / (g.fp16_tflops * 1e12 * e * (c + cached) / (c + cached + half)))
    # the hot path prices the same term (everything else equal)
    flat = RooflineCost("llama-2-7b", "h100",
                        params=dataclasses.replace(p, attn_prefill_half_tokens=0.0))
    batch = Batch(0, [(c, cached)], c, 0, 0)
    assert cost(batch) - flat(batch) == pytest.approx(
        cost.prefill_attention_time(c, cached) - flat.prefill_attention_time(c, cached))
    # half = 0: a flat efficiency (the model before this fit)
    assert flat.prefill_attention_eff(16) == flat.prefill_attention_eff(16384) == e


def test_decode_steps_against_published_measurements(fit_roofline):
    params = {g: fitted_params(g) for g in ("a100", "h100")}
    rep = fit_roofline.decode_report(params)
    assert len(rep) == 114 and set(rep["split"]) == {"fit", "held-out"}
    # the H200 (no fitted terms) is priced as the roofline prices it: the fitted GPUs' mean;
    # its rows are held out but the XQA blog's run without XQA, the fit of the per-query-head
    # decode kernel's re-read fraction (tests/test_roofline_gqa.py)
    assert fit_roofline.unfitted_params(params) == fitted_params("h200")
    h200 = rep[rep["gpu"] == "h200"]
    assert (h200[h200["engine"] != "tensorrt-llm-0.6a"]["split"] == "held-out").all()
    assert _shipped()["decode_report"] == rep.round(2).to_dict(orient="records")
    # batch-1 decode steps of a bare generation loop (gpt-fast, A100, one GPU): fp16 +6.2 %,
    # int8 weights -6.3 %, int4 (group 32) -11.7 %: its scales and zeros priced, the rest of
    # the gap is the dequantisation inside the kernel (was -21.8 % without the scales)
    gf = rep[rep["engine"] == "gpt-fast"]
    one = gf[gf["tensor_parallel"] == 1].set_index("weight_dtype")["error_pct"]
    assert abs(one["fp16"]) <= 7 and abs(one["int8"]) <= 7 and -13 <= one["int4"] <= -10
    # tensor-parallel batch-1 steps with gpt-fast's one-shot all-reduce: +4 to +19 % (were
    # +6 to +51 % with NCCL medians)
    tp = gf[gf["tensor_parallel"] > 1]["error_pct"]
    assert len(tp) == 6 and (tp > 0).all() and tp.max() <= 19
    # static batches of 1-8 (NeMo, 128 in, 20 out, A100 and H100, TP 1-8): median |error|
    # 11.7 %; batch 1 within 12 %, and the gap grows with the batch (a per-sequence cost of
    # that engine the roofline does not price): -11 to -21 % at batch 8
    nemo = rep[rep["metric"] == "latency"]
    assert len(nemo) == 32 and np.median(np.abs(nemo["error_pct"])) <= 12
    assert nemo[nemo["batch_size"] == 1]["error_pct"].abs().max() <= 12
    b8 = nemo[nemo["batch_size"] == 8]["error_pct"]
    assert (b8 < -11).all() and (b8 > -22).all()
    # LMDeploy's median decode steps (A100, batch 1-64): within 10 % at batch 16-64 for every
    # model, held-out Llama-2-13B and -70B (4 GPUs) included; at batch 1 its C++ engine is
    # faster than the roofline's per-iteration CPU cost of a Python engine allows (+26 %)
    lm = rep[rep["engine"] == "lmdeploy-0.1-turbomind"]
    assert len(lm) == 33
    for model, g in lm[lm["batch_size"] >= 16].groupby("model"):
        assert np.median(np.abs(g["error_pct"])) <= 10, model
    # per batch band (fit / held out): 1-8 15.2 / 11.3 %, 16-32 8.0 / 4.8 %, 33-127 4.3 / 6.3 %,
    # 128-256 43.8 (the XQA pair's fit row: only its ratio is fitted) / 26.6 %, above 256
    # 6.2 / 7.6 % (5.6 % with one all-reduce per Falcon/GPT-J layer: separate_reduce_report);
    # with every decode kernel group-aware the held-out bands were 5.4, 6.3, 38.0 and 12.2 %
    # (the four 128-256 rows: all with 2,048 output tokens, three of them GQA models)
    bands = fit_roofline.band_report(rep)
    assert _shipped()["decode_band_report"] == bands.dropna().round(2).to_dict(orient="records")
    bands = bands.set_index(["batch", "split"])
    group_aware = fit_roofline.decode_report(params, 0.0)
    was = fit_roofline.band_report(group_aware).set_index(["batch", "split"])
    assert bands.loc[("16-32", "held-out"), "median_abs_error_pct"] <= 5
    assert bands.loc[("16-32", "fit"), "median_abs_error_pct"] <= 9
    assert bands.loc[("33-127", "held-out"), "median_abs_error_pct"] <= 6.5
    assert bands.loc[("1-8", "held-out"), "median_abs_error_pct"] <= 12
    assert bands.loc[("128-256", "held-out"), "points"] == 4
    assert 26 <= bands.loc[("128-256", "held-out"), "median_abs_error_pct"] <= 27
    assert 37.5 <= was.loc[("128-256", "held-out"), "median_abs_error_pct"] <= 38.5
    assert bands.loc[(">256", "held-out"), "median_abs_error_pct"] <= 8
    # the bar over its whole range, batch 1-256: 7.9 % fit (17 rows), 8.5 % held out
    # (83 rows), the bands above included
    assert bands.loc[("1-256", "fit"), "points"] == 17
    assert bands.loc[("1-256", "held-out"), "points"] == 83
    assert bands.loc[("1-256", "fit"), "median_abs_error_pct"] <= 8
    assert bands.loc[("1-256", "held-out"), "median_abs_error_pct"] <= 9
    assert was.loc[(">256", "held-out"), "median_abs_error_pct"] >= 12
    # the rows that moved are exactly the grouped-query rows of the per-query-head engines
    per_head = np.array([e in fit_roofline.PER_HEAD_DECODE_ENGINES and
                         get_model(m).num_key_value_heads < get_model(m).num_attention_heads
                         for e, m in zip(rep["engine"], rep["model"])])
    moved = rep["predicted"].to_numpy() != group_aware["predicted"].to_numpy()
    assert (moved == per_head).all() and per_head.sum() == 18
    # TensorRT-LLM 0.6.1 on 2-8 H100s, 2,048 output tokens: were 48-56 % fewer tokens/s than
    # predicted (the same table's one-GPU rows within 8 %); now within 10.1 % (within 9 % with
    # one all-reduce per Falcon layer)
    sel = ((rep["tensor_parallel"] > 1) & (rep["output_tokens"] == 2048)
           & (rep["gpu"] == "h100")).to_numpy()
    assert sel.sum() == 4 and (group_aware["error_pct"][sel] < -44).all()
    assert rep["error_pct"][sel].abs().max() <= 10.5
    # ... and the pattern across every TensorRT-LLM table (A100, H100, H200; TP 1-8): with
    # 2,048-4,096 output tokens, grouped-query models (Llama-2-70B, Falcon-180B) got 37-77 %
    # less throughput than predicted with a group-aware kernel, multi-head ones (GPT-J,
    # Llama-2-7B/-13B) at most 25 % off (median |error| 3.4 %). With the per-query-head kernel
    # where the engine had no XQA, the held-out grouped-query rows are at median 10.1 % (was
    # 44.4 %), -19 to +28.5 % (worst: Llama-2-70B on 4 A100s, predicted too slow) but for
    # 0.7a's two rows, which ran with XQA and stay at -37 and -44 %
    thr = (rep["metric"] == "throughput").to_numpy() & (rep["output_tokens"] >= 2048).to_numpy()
    gqa = np.array([get_model(m).num_key_value_heads < get_model(m).num_attention_heads
                    for m in rep["model"]])
    assert (thr & gqa).sum() == 10 and (group_aware["error_pct"][thr & gqa] < -36).all()
    held = thr & gqa & (rep["split"] == "held-out").to_numpy()
    assert held.sum() == 9 and np.median(np.abs(rep["error_pct"][held])) <= 10.5
    assert np.median(np.abs(group_aware["error_pct"][held])) >= 44
    fixed = held & per_head
    assert fixed.sum() == 7 and rep["error_pct"][fixed].between(-20, 29).all()
    xqa = held & ~per_head
    assert xqa.sum() == 2 and rep["error_pct"][xqa].between(-44, -37).all()
    mha = rep["error_pct"][thr & ~gqa]
    assert len(mha) == 9 and mha.abs().max() <= 25 and np.median(mha.abs()) <= 3.5
