import dataclasses
import json
from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from sim import ModelConfig, get_gpu, get_model
from sim.engine.core.batch import Batch
from sim.costs.roofline import GEMM_OPS, RooflineCost, fitted_params


class FakeBatch:
    def __init__(self, prefills=(), decodes=0, context=0):
        self.prefills = list(prefills)
        self.num_prefill_tokens = sum(n for n, _ in self.prefills)
        self.num_decode_tokens = decodes
        self.decode_context_tokens = context


def test_shipped_fit_reproduces_and_meets_10_percent_on_held_out_model(load_script, monkeypatch,
                                                                       tmp_path, capsys):
    fit_roofline = load_script("experiments/fit_roofline.py")
    params, rep = fit_roofline.fit_all()
    stored = json.loads(resources.files("sim").joinpath("data/roofline_fit.json").read_text())
    for gpu, p in params.items():
        assert stored["params"][gpu]["gemm_compute_eff"] == p.gemm_compute_eff
        assert stored["params"][gpu]["elementwise_eff"] == p.elementwise_eff
    # the fixed costs and the FP8 efficiency fitted after the kernels reproduce too
    fixed = fit_roofline.fit_fixed_costs(params)
    shared, per_gpu, sync_cpu, _, lat, _, (reread, _) = fixed
    assert stored["shared"] == shared and stored["synchronous_cpu"] == sync_cpu
    assert stored["per_head_decode"]["params"] == {"attn_decode_reread_fraction": reread}
    for gpu, terms in per_gpu.items():
        assert {k: stored["params"][gpu][k] for k in terms} == terms
    # every first-token and throughput row of the fitted GPUs (the H200: decode_report only)
    assert len(lat) == 45 and set(lat["split"]) == {"fit", "held-out"}
    held = rep[rep["split"] == "held-out"]
    assert set(held["gpu"]) == {"a100", "h100"}
    assert (rep["median_ape_pct"] <= 10).all(), rep
    assert (held["median_ape_pct"] <= 10).all()
    # the fit is physical: ~70% of peak FLOP/s, 75-95% of peak bandwidth (profiles README)
    for p in params.values():
        assert 0.6 <= p.gemm_compute_eff <= 0.8 and 0.7 <= p.gemm_memory_eff <= 0.95
    # the shipped file is this fit's document, and the script writes it only when asked
    doc = json.dumps(fit_roofline.document(params, rep, fixed), indent=1) + "\n"
    shipped = fit_roofline.SHIPPED
    assert doc == shipped.read_text()
    # ... and `python experiments/fit_roofline.py` writes it only when asked (--write)
    writes = []
    real_write = type(tmp_path).write_text

    def write_text(path, text, *args, **kwargs):  # the shipped file is never touched here
        writes.append(path)
        return real_write(tmp_path / "written.json" if path == shipped else path, text, *args,
                          **kwargs)
    monkeypatch.setattr(type(tmp_path), "write_text", write_text)
    monkeypatch.setattr(fit_roofline, "fit_all", lambda: (params, rep))  # fitted above
    monkeypatch.setattr(fit_roofline, "fit_fixed_costs", lambda p: fixed)
    fit_roofline.main([])
    assert writes == [] and "not written (--write updates roofline_fit.json" in \
        capsys.readouterr().out
    fit_roofline.main(["--output", str(tmp_path / "elsewhere.json")])
    assert writes == [tmp_path / "elsewhere.json"]
    fit_roofline.main(["--write"])  # redirected to tmp_path by the patch above
    assert writes[-1] == fit_roofline.SHIPPED
    assert (tmp_path / "written.json").read_text() == doc


def test_decode_of_one_token_reads_the_weights_and_matches_measured_layers():
    cost = RooflineCost("llama-2-7b", "h100")
    m, g, p = get_model("llama-2-7b"), get_gpu("h100"), fitted_params("h100")
    weights = m.total_params() * 2 - m.vocab_size * m.hidden_size * 2  # input embedding not read
    fixed = cost.fixed_time(1, graphed=True)  # a decode of one replays a CUDA graph
    assert fixed == p.overhead_s
    t = cost(FakeBatch(decodes=1, context=1)) - fixed
    assert t > weights / (g.memory_bandwidth_gbps * 1e9)  # never faster than peak bandwidth
    # Vidur's measured H100 kernels for one layer at 1 token, x 32 layers (+ 1 extra residual add)
    import pandas as pd
    with resources.files("sim").joinpath("data/profiles/vidur_h100_Llama-2-7b-hf_layer_ms.csv").open() as f:
        prof = pd.read_csv(f)
    row = prof[(prof.tensor_parallel == 1) & (prof.num_tokens == 1)].iloc[0]
    ops = [c for c in prof.columns if c.endswith("_ms") and c != "emb_ms"]
    measured = 32 * (row[ops].sum() + row["add_ms"]) * 1e-3
    lm_head = cost.linear_time(1, 1) - cost.linear_time(1, 0)
    attention = cost(FakeBatch(decodes=1, context=1)) - fixed - cost.linear_time(1, 1)
    assert t - lm_head - attention == pytest.approx(measured, rel=0.10)


def test_large_prefill_is_compute_bound_and_matches_flops():
    cost = RooflineCost("llama-2-7b", "a100")
    p = fitted_params("a100")
    n = 4096
    t = cost.linear_time(n, 1)
    flops = 2 * n * (get_model("llama-2-7b").total_params() - 2 * 32000 * 4096)
    assert t == pytest.approx(flops / (312e12 * p.gemm_compute_eff), rel=0.15)


def test_tensor_parallel_faster_and_pays_all_reduce():
    one = RooflineCost("llama-3.1-70b", "h100", tensor_parallel=4)
    two = RooflineCost("llama-3.1-70b", "h100", tensor_parallel=8)
    b = FakeBatch(prefills=[(2048, 0)])
    assert two(b) < one(b)
    assert one.allreduce_time(64 * 2**20) == pytest.approx(0.322e-3 * 1.2, rel=0.5)  # README
    assert RooflineCost("llama-3.1-8b", "h100").allreduce_time(1e6) == 0.0
    ring = RooflineCost("llama-3.1-70b", "b200", tensor_parallel=2)  # no measured table: ring
    assert ring.allreduce_time(1e8) > ring.allreduce_time(1e6) > 0


def test_quantized_weights_speed_up_decode_and_fp8_compute():
    b16 = RooflineCost("llama-3.1-8b", "h100")
    b8 = RooflineCost("llama-3.1-8b", "h100", weight_dtype="fp8")
    b4 = RooflineCost("llama-3.1-8b", "h100", weight_dtype="int4")
    d = FakeBatch(decodes=8, context=8 * 1000)
    assert b4(d) < b8(d) < b16(d)
    assert b8.peak == pytest.approx(2 * b16.peak, rel=0.01)
    assert b4.peak == b16.peak  # weight-only int4 computes in fp16
    kv8 = RooflineCost("llama-3.1-8b", "h100", kv_dtype="fp8")
    long = FakeBatch(decodes=64, context=64 * 8000)
    assert kv8(long) < b16(long)


def test_attention_terms_grow_with_context():
    c = RooflineCost("llama-3.1-8b", "h100")
    assert c(FakeBatch(decodes=32, context=32 * 8000)) > c(FakeBatch(decodes=32, context=32 * 100))
    a = c.prefill_attention_time(1024, 0)
    b = c.prefill_attention_time(1024, 16384)
    assert b > 5 * a
    # chunking a prompt costs more attention in total than one pass, but not hugely
    chunks = sum(c.prefill_attention_time(512, k * 512) for k in range(8))
    assert c.prefill_attention_time(4096, 0) <= chunks <= 2.5 * c.prefill_attention_time(4096, 0)


def test_faster_gpus_are_faster_and_moe_reads_touched_experts():
    b = FakeBatch(decodes=16, context=16 * 2000)
    t = {g: RooflineCost("llama-3.1-8b", g)(b) for g in ("a100", "h100", "h200", "b200")}
    assert t["b200"] < t["h200"] < t["h100"] < t["a100"]
    moe = RooflineCost("mixtral-8x7b", "h100")
    one = moe.op_times(1)["mlp_up_proj"]
    many = moe.op_times(256)["mlp_up_proj"]
    assert many > 3 * one  # one token touches 2 experts, 256 tokens touch all 8


def test_hot_path_matches_per_op_sum():
    c = RooflineCost("llama-3.1-8b", "h100")
    batch = Batch(0, [(300, 200)], 300, 0, 0)
    ops = c.op_times(300)
    p = c.params
    m = c.model
    expected = (c.fixed_time(1) + m.num_hidden_layers * (sum(ops.values()) + ops["add"])
                + max(2 * 300 * 0 + 2.0 * 1 * m.hidden_size * m.vocab_size / (c.peak * p.gemm_compute_eff),
                      (m.hidden_size * m.vocab_size * 2 + (m.hidden_size + m.vocab_size) * 2)
                      / (c.bw * p.gemm_memory_eff), p.kernel_floor_s)
                + c.prefill_attention_time(300, 200))
    assert c(batch) == pytest.approx(expected, rel=1e-9)


def test_bad_arguments():
    with pytest.raises(ValueError, match="tensor_parallel"):
        RooflineCost("llama-3.1-8b", "h100", tensor_parallel=3)
    with pytest.raises(ValueError, match="gpu"):
        RooflineCost("llama-3.1-8b", "tpu")
    with pytest.raises(ValueError, match="weight_dtype"):
        RooflineCost("llama-3.1-8b", "h100", weight_dtype="fp5")
    assert np.isfinite(RooflineCost("qwen2.5-0.5b", "l40s")(FakeBatch(decodes=1, context=5)))


# -- architectures: closed-form work of one token on small hand-made configs ----------------
SMALL = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
             intermediate_size=256, vocab_size=100)  # head_dim 16
MLA = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
           intermediate_size=128, vocab_size=100, q_lora_rank=32, kv_lora_rank=16,
           qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)


def _gemm_flops(work, ops):
    return sum(work[op][0] for op in ops)


def test_non_gated_mlp_is_two_gemms_not_three():
    h, i = 64, 256
    gated = RooflineCost(ModelConfig("gated", **SMALL), "h100")
    plain = RooflineCost(ModelConfig("plain", gated_mlp=False, **SMALL), "h100")
    mlp = ("mlp_up_proj", "mlp_down_proj")
    assert _gemm_flops(gated.op_work(1), mlp) == 3 * 2 * h * i  # gate, up, down
    assert _gemm_flops(plain.op_work(1), mlp) == 2 * 2 * h * i  # fc1, fc2
    # one token reads the weights: 2 h I of them instead of 3 h I; the activation reads I
    # and writes I instead of reading 2 I (gate, up) and writing I
    w_plain, w_gated = plain.op_work(1), gated.op_work(1)
    assert w_plain["mlp_up_proj"][1] == h * i * 2 + (h + i) * 2
    assert w_gated["mlp_up_proj"][1] == 2 * h * i * 2 + (h + 2 * i) * 2
    assert w_plain["mlp_act"][1] == 2 * i * 2 and w_gated["mlp_act"][1] == 3 * i * 2
    # the whole layer per token: 2 x (4 h^2 attention + 2 h I MLP) FLOPs
    assert _gemm_flops(w_plain, GEMM_OPS) == 2 * (4 * h * h + 2 * h * i)
    assert plain.linear_time(4096, 0) < gated.linear_time(4096, 0)


def test_parallel_block_shares_its_norm_and_one_all_reduce():
    seq = RooflineCost(ModelConfig("seq", gated_mlp=False, **SMALL), "h100", tensor_parallel=2)
    par = RooflineCost(ModelConfig("par", gated_mlp=False, parallel_attn=True,
                                   norms_per_layer=1, **SMALL), "h100", tensor_parallel=2)
    two_norms = RooflineCost(ModelConfig("neox", gated_mlp=False, parallel_attn=True,
                                         **SMALL), "h100", tensor_parallel=2)
    ws, wp = seq.op_work(1), par.op_work(1)
    assert "post_attention_layernorm" not in wp and "post_attention_layernorm" in ws
    assert _gemm_flops(wp, GEMM_OPS) == _gemm_flops(ws, GEMM_OPS)  # same GEMMs
    t = 512
    reduce = seq.allreduce_time(t * 64 * 2)
    assert reduce > 0
    norm = seq.op_times(t)["post_attention_layernorm"]
    assert seq.linear_time(t, 0) - par.linear_time(t, 0) == pytest.approx(2 * (norm + reduce),
                                                                           rel=1e-12)
    assert seq.linear_time(t, 0) - two_norms.linear_time(t, 0) == pytest.approx(2 * reduce,
                                                                                rel=1e-12)


def test_parallel_block_reduced_twice_pays_one_more_all_reduce_per_layer():
    """``parallel_block_allreduces`` 2 (attention and MLP outputs each reduced, TensorRT-LLM
    before 0.7.1): one more all-reduce of the layer's activations per layer, exactly; a
    sequential block (two either way) and a single GPU are not moved."""
    kw = dict(gated_mlp=False, parallel_attn=True, norms_per_layer=1, **SMALL)
    one = RooflineCost(ModelConfig("par", **kw), "h100", tensor_parallel=2)
    two = RooflineCost(ModelConfig("par", **kw), "h100", tensor_parallel=2,
                       params=dataclasses.replace(one.params, parallel_block_allreduces=2))
    t, layers = 512, one.model.num_hidden_layers
    assert two.linear_time(t, 0) - one.linear_time(t, 0) == pytest.approx(
        layers * one.allreduce_time(t * 64 * 2), rel=1e-12)
    assert two(Batch(0, [(t, 0)], t, 0, 0)) > one(Batch(0, [(t, 0)], t, 0, 0))
    for model, tp in ((ModelConfig("seq", gated_mlp=False, **SMALL), 2),
                      (ModelConfig("par", **kw), 1)):
        a = RooflineCost(model, "h100", tensor_parallel=tp)
        b = RooflineCost(model, "h100", tensor_parallel=tp,
                         params=dataclasses.replace(a.params, parallel_block_allreduces=2))
        assert a.linear_time(t, 0) == b.linear_time(t, 0)


def test_roofline_costs_that_price_differently_repr_differently():
    """(review9) A sweep keys grid values by repr: RooflineCost's named the model, GPU, TP and
    weights only, so a grid of the default and parallel_block_allreduces=2 (or kv_dtype fp8)
    read as one value and gave every row the same point's result. The shipped prices' repr is
    unchanged; a kv dtype other than 2 bytes and each term that differs from the fitted ones
    are in it."""
    import pandas as pd
    from sim import SimConfig
    from sim.tools.sweep import sweep
    base = RooflineCost("falcon-40b", "a100", tensor_parallel=4)
    assert repr(base) == "RooflineCost('falcon-40b', 'A100-80GB-SXM', tp=4, weights=fp16)"
    two = RooflineCost("falcon-40b", "a100", tensor_parallel=4,
                       params=dataclasses.replace(base.params, parallel_block_allreduces=2))
    fp8 = RooflineCost("falcon-40b", "a100", tensor_parallel=4, kv_dtype="fp8")
    assert repr(two).endswith("weights=fp16, params(parallel_block_allreduces=2))")
    assert repr(fp8).endswith("weights=fp16, kv=fp8)")
    df = pd.DataFrame({"arrival_time": np.arange(6) * 0.05, "num_prompt_tokens": 512,
                       "num_output_tokens": 4})
    table = sweep(df, {"cost_model": [base, two]}, base=SimConfig(kv_blocks=2000), workers=1,
                  progress=False)
    assert table["ttft_mean"].iloc[1] > table["ttft_mean"].iloc[0] * 1.1


def test_mla_gemm_flops_of_one_token_are_twice_its_weights():
    m = ModelConfig("mla", **MLA)
    h, heads, q_lora, kv_lora, nope, rope, v = 64, 4, 32, 16, 8, 4, 8
    weights = (h * q_lora + q_lora * heads * (nope + rope)  # q_a, q_b
               + h * (kv_lora + rope)  # kv_a (the latent and the shared rope key)
               + kv_lora * heads * (nope + v)  # kv_b: absorbed into q and the output
               + heads * v * h)  # o_proj
    assert m.attention_params_per_layer() == weights + q_lora + kv_lora  # + the latent norms
    w = RooflineCost(m, "h100").op_work(1)
    assert _gemm_flops(w, ("attn_pre_proj", "attn_post_proj")) == 2 * weights
    assert w["attn_pre_proj"][0] == 2 * (h * q_lora + q_lora * heads * (nope + rope)
                                         + h * (kv_lora + rope) + kv_lora * heads * nope)


def test_mla_decode_reads_the_latent_per_context_token():
    cost = RooflineCost(ModelConfig("mla", **MLA), "h100")
    p, g = cost.params, get_gpu("h100")
    # per layer and context token: 16 + 4 latent values (fp16) read once for all heads; per
    # head, scores over 16 + 4 values and a weighted sum over 16
    flops, nbytes = 2 * 4 * ((16 + 4) + 16), (16 + 4) * 2
    slope = 2 * max(flops / (g.fp16_tflops * 1e12 * p.attn_prefill_compute_eff),
                    nbytes / (g.memory_bandwidth_gbps * 1e9 * p.attn_decode_memory_eff))
    a = cost(FakeBatch(decodes=1, context=10**6))
    b = cost(FakeBatch(decodes=1, context=2 * 10**6))
    assert (b - a) / 10**6 == pytest.approx(slope, rel=1e-9)


def test_mla_kv_read_is_much_smaller_than_mha():
    ds = get_model("deepseek-v3")  # an MHA twin: 128 K and V heads of 192
    twin = dataclasses.replace(ds, kv_lora_rank=0, q_lora_rank=0, qk_nope_head_dim=0,
                               qk_rope_head_dim=0, v_head_dim=0)
    assert twin.head_dim == 192 and not twin.is_mla
    mla, mha = RooflineCost(ds, "h100"), RooflineCost(twin, "h100")

    def per_context_token(c):
        return (c(FakeBatch(decodes=64, context=2 * 10**6))
                - c(FakeBatch(decodes=64, context=10**6))) / 10**6

    assert per_context_token(mha) > 20 * per_context_token(mla)
    # and the KV cache the memory budget reserves per token: 576 values per layer, not
    # 2 x 128 x 192
    from sim import kv_cache_bytes
    assert kv_cache_bytes(1, model=twin) == 2 * 61 * 128 * 192 * 2
    assert kv_cache_bytes(1, model=twin) > 80 * kv_cache_bytes(1, model=ds)


def test_mla_prefill_is_mha_shaped_and_reexpands_the_cached_latents():
    m = ModelConfig("mla", **MLA)
    cost = RooflineCost(m, "h100")
    p, g = cost.params, get_gpu("h100")
    peak, bw = g.fp16_tflops * 1e12, g.memory_bandwidth_gbps * 1e9
    new, cached = 256, 4096
    pair = 2 * 4 * (12 + 8)  # per (query, key) and layer: 12-wide scores, 8-wide values, 4 heads
    flops = pair * new * (cached + new / 2)
    nbytes = (cached + new) * (20 * 2 + 4 * 20 * 2) + new * 4 * 20 * 2
    attention = 2 * max(flops / (peak * p.attn_prefill_compute_eff),
                        nbytes / (bw * p.attn_decode_memory_eff), p.kernel_floor_s)
    up_flops = 2 * cached * 16 * 4 * (8 + 8)  # kv_b_proj over the cached latents
    up_bytes = 16 * 4 * (8 + 8) * 2 + cached * (16 + 4 * 16) * 2
    upproj = 2 * max(up_flops / (peak * p.gemm_compute_eff),
                     up_bytes / (bw * p.gemm_memory_eff), p.kernel_floor_s)
    assert cost.prefill_attention_time(new, 0) == pytest.approx(
        2 * max(pair * new * new / 2 / (peak * p.attn_prefill_compute_eff),
                (new * 40 + new * 160 + new * 160) / (bw * p.attn_decode_memory_eff),
                p.kernel_floor_s), rel=1e-12)
    assert cost.prefill_attention_time(new, cached) == pytest.approx(attention + upproj,
                                                                     rel=1e-12)


def test_moe_shared_experts_and_dense_first_layers():
    m = ModelConfig("ds-mini", **{**MLA, "num_hidden_layers": 3}, num_local_experts=4,
                    num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                    dense_intermediate_size=256)
    cost = RooflineCost(m, "h100")
    h, i = 64, 128
    moe, dense = cost.op_work(1), cost.op_work(1, dense_layer=True)
    assert _gemm_flops(moe, ("mlp_up_proj", "mlp_down_proj")) == (2 + 1) * 3 * 2 * h * i
    assert _gemm_flops(dense, ("mlp_up_proj", "mlp_down_proj")) == 3 * 2 * h * 256
    # op_times is the mean over the layers: 1 dense + 2 MoE
    t = cost.op_times(100)
    for op, d in cost._times(cost.op_work(100, dense_layer=True)).items():
        assert 3 * t[op] == pytest.approx(d + 2 * cost._times(cost.op_work(100))[op], rel=1e-12)


@pytest.mark.parametrize("name, tp", [("gpt-j-6b", 1), ("falcon-40b", 2), ("deepseek-v3", 8),
                                      ("qwen3-30b-a3b", 1), ("falcon-7b", 1)])
def test_hot_path_matches_per_op_sum_for_new_architectures(name, tp):
    c = RooflineCost(name, "h100", tensor_parallel=tp)
    batch = Batch(0, [(300, 200), (50, 0)], 350, 7, 7 * 900)
    m, p = c.model, c.params
    ops = c.op_times(357)
    layers = m.num_hidden_layers
    v = m.vocab_size / tp
    expected = (c.fixed_time(9) + layers * (sum(ops.values()) + ops["add"])
                + layers * (1 if m.parallel_attn else 2)
                * c.allreduce_time(357 * m.hidden_size * 2)
                + max(2.0 * 9 * m.hidden_size * v / (c.peak * p.gemm_compute_eff),
                      (m.hidden_size * v * 2 + 9 * (m.hidden_size + v) * 2)
                      / (c.bw * p.gemm_memory_eff), p.kernel_floor_s)
                + c.prefill_attention_time(300, 200) + c.prefill_attention_time(50, 0)
                + max(7 * 900 * c._decode_s_per_ctx, layers * p.kernel_floor_s))
    assert c(batch) == pytest.approx(expected, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from([("llama-3.1-8b", "h100", 1), ("llama-2-70b", "a100", 4),
                             ("mixtral-8x7b", "h100", 2), ("deepseek-v3", "h200", 8),
                             ("falcon-7b", "a100", 1)]),
       num_decodes=st.integers(1, 600), per_seq=st.integers(1, 40_000))
def test_pure_decode_price_is_the_batch_price_bit_for_bit(name, num_decodes, per_seq):
    """The engine's fast-forward prices pure-decode iterations with ``pure_decode_cost``: it
    must equal pricing the batch itself exactly (CUDA-graph sizes and over, tiny contexts that
    hit the kernel floor, MoE and MLA models), or fast-forwarded runs would drift."""
    model, gpu, tp = name
    c = RooflineCost(model, gpu, tensor_parallel=tp)
    price = c.pure_decode_cost(num_decodes)
    for ctx in (num_decodes, num_decodes * per_seq, num_decodes * per_seq + 7):
        batch = Batch(0, [], 0, num_decodes, ctx)
        assert price(ctx) == c(batch)


@pytest.mark.parametrize("model, gpu, kw", [
    ("llama-3.1-8b", "h100", {}), ("llama-2-70b", "a100", {"tensor_parallel": 4}),
    ("mixtral-8x7b", "h100", {"tensor_parallel": 2}), ("deepseek-v3", "h200",
                                                        {"tensor_parallel": 8}),
    ("llama-3.1-70b", "h200", {"tensor_parallel": 2, "weight_dtype": "fp8"})])
def test_every_batch_sizes_pure_decode_price_at_once_is_each_ones_bit_for_bit(model, gpu, kw):
    """The planner's decode bound prices batch sizes 1..1,300 in one call
    (``pure_decode_costs``): each must be ``pure_decode_cost(b)(context)`` exactly, across the
    linear-op memo's 512-count blocks, CUDA-graph sizes and the attention floor - on a fresh
    cost model and on one whose memo the scalar path filled first."""
    b = np.arange(1, 1301)
    for ctx in (b, b * 901 + 5):
        scalar = RooflineCost(model, gpu, **kw)
        expected = [scalar.pure_decode_cost(int(n))(int(c)) for n, c in zip(b, ctx)]
        assert RooflineCost(model, gpu, **kw).pure_decode_costs(b, ctx).tolist() == expected
        assert scalar.pure_decode_costs(b, ctx).tolist() == expected


def test_scalar_op_times_equal_the_vectorised_ones_exactly():
    """``_times`` has a scalar branch (Python's max) beside the array one (np.maximum): the
    same values bit for bit, as floats."""
    for model, tp in (("llama-3.1-8b", 1), ("mixtral-8x7b", 2), ("deepseek-v3", 8)):
        c = RooflineCost(model, "h100", tensor_parallel=tp)
        tokens = np.arange(1, 700, dtype=np.float64)
        vector = c._times(c.op_work(tokens))
        for n in (1, 2, 255, 256, 699):
            scalar = c._times(c.op_work(n))
            assert {type(v) for v in scalar.values()} == {float}
            assert scalar == {op: float(t[n - 1]) for op, t in vector.items()}


def test_mean_terms_of_gpus_without_a_fit():
    """A GPU without fitted terms gets, term by term, the mean over the fitted GPUs: a term
    missing or None on a GPU is left out, one equal everywhere is kept as is (an int stays an
    int), per-op dicts are averaged per op."""
    from sim.costs.roofline_params import mean_terms
    got = mean_terms([{"a": 0.5, "n": 512, "e": {"x": 0.2, "y": 1.0}, "f8": None},
                      {"a": 0.7, "n": 512, "e": {"x": 0.4, "y": 1.0}, "f8": 0.6, "h": 16.0}])
    assert got == {"a": pytest.approx(0.6), "n": 512, "e": {"x": pytest.approx(0.3), "y": 1.0},
                   "f8": 0.6, "h": 16.0}
    assert isinstance(got["n"], int)
    assert mean_terms([{"f8": None}, {"f8": None}]) == {}


def test_h200_gemms_measured_here_compute_bound_within_10_percent():
    """Our own H200 run (sim/data/NOTICE.md): Llama-3.1-8B's four dense GEMMs timed as CuPy
    fp16 products. From 2,048 tokens on (compute-bound) the shipped roofline, fitted to other
    GPUs' published timings and never to these rows, prices them within 10 % (median 6 %). At
    512 tokens and below it is optimistic (13.6-88.8 % under) - most at 1-8 tokens, where CuPy's
    own GEMMs take 102-177 us for what Vidur's cuBLAS timings on an H100 do in 16-64 us, so
    those rows are not a test of it. Measured 643-762 TFLOP/s from 2,048 tokens on."""
    import pandas as pd
    with resources.files("sim").joinpath("data/profiles/h200_gemm_cupy_fp16.csv").open() as f:
        rows = pd.read_csv(f)
    assert set(rows.device) == {"NVIDIA H200"} and len(rows) == 44
    cost = RooflineCost("llama-3.1-8b", "h200")
    priced = [cost.op_times(t)[op] for op, t in zip(rows.op, rows.tokens)]
    err = 100 * (np.array(priced) / rows.measured_s.to_numpy() - 1)
    big, small = (rows.tokens >= 2048).to_numpy(), (rows.tokens <= 512).to_numpy()
    assert np.median(np.abs(err[big])) <= 8 and np.abs(err[big]).max() <= 10.5
    assert (err[small] < 0).all()  # optimistic below: a known gap, pinned so a change shows
    tflops = 2 * rows.tokens * rows.k * rows.n / rows.measured_s / 1e12  # the README's range
    assert np.allclose(tflops, rows.tflops, rtol=1e-9)
    assert 643 <= tflops[big].min() < 644 and 761 < tflops[big].max() <= 762
    assert round(float(np.median(tflops[big]))) == 724


def test_gemm_check_times_the_shapes_the_roofline_prices(tmp_path, load_script):
    """experiments/gemm_check.py on the CPU: its GEMM shapes are the roofline's (FLOPs 2·t·k·n
    of op_work) and it writes one row per op and token count."""
    gemm_check = load_script("experiments/gemm_check.py")
    cost = RooflineCost("tinyllama-1.1b", "h200")
    for op, (k, n) in gemm_check.shapes(cost.model).items():
        assert cost.op_work(7)[op][0] == 2 * 7 * k * n
    out = tmp_path / "g.csv"
    df = gemm_check.main(["--device", "cpu", "--model", "tinyllama-1.1b", "--tokens", "1", "4",
                          "--repeats", "1", "-o", str(out)])
    assert len(df) == 8 and (df.measured_s > 0).all() and out.exists()
    assert df.roofline_s.tolist() == [cost.op_times(t)[op] for op, t in zip(df.op, df.tokens)]


def test_cupy_gemms_measured_on_h200_are_slower_than_engines_below_2048_tokens():
    """Why the H200 rows below 2,048 tokens do not test the roofline: the 4096 x 4096 GEMM
    (the O projection of Llama-2-7B and of Llama-3.1-8B alike) took CuPy on an H200 1.4-9x
    what it took PyTorch on an H100 in Vidur's timings at 1-1,024 tokens, where the H200 has
    the same compute and more bandwidth; from 2,048 tokens on the two agree within 15 %."""
    import pandas as pd
    files = resources.files("sim").joinpath("data/profiles")
    with files.joinpath("h200_gemm_cupy_fp16.csv").open() as f:
        ours = pd.read_csv(f)
    with files.joinpath("vidur_h100_Llama-2-7b-hf_layer_ms.csv").open() as f:
        vidur = pd.read_csv(f)
    ours = ours[ours.op == "attn_post_proj"].set_index("tokens").measured_s
    vidur = vidur[vidur.tensor_parallel == 1].set_index("num_tokens").attn_post_proj_ms * 1e-3
    ratio = (ours / vidur).dropna()
    assert len(ratio) == 10  # 1-4,096 tokens (Vidur stops there)
    assert (ratio[ratio.index <= 1024] >= 1.4).all() and ratio.max() < 10
    assert (abs(ratio[ratio.index >= 2048] - 1) <= 0.15).all()


@settings(max_examples=80, deadline=None)
@given(name=st.sampled_from([("llama-3.1-8b", "h100", 1), ("llama-2-70b", "a100", 4),
                             ("mixtral-8x7b", "h100", 2), ("deepseek-v3", "h200", 8),
                             ("falcon-7b", "a100", 1), ("falcon-40b", "h100", 2),
                             ("gpt-j-6b", "h100", 1), ("qwen3-30b-a3b", "h100", 1)]),
       tokens=st.lists(st.integers(1, 20_000), min_size=1, max_size=6),
       sampled=st.integers(0, 600))
def test_linear_time_table_is_the_scalar_sum_bit_for_bit(name, tokens, sampled):
    """``linear_time`` prices a block of token counts at once (``layers_time``'s array pass):
    each entry equals the scalar sum of the per-op times and all-reduces exactly, wherever
    the token count falls in its block."""
    model, gpu, tp = name
    c = RooflineCost(model, gpu, tensor_parallel=tp)
    m, p = c.model, c.params
    for n in tokens:
        ops = c.op_times(n)
        layer = sum(ops.values()) + ops["add"]
        layer += c._allreduces_per_layer * c.allreduce_time(n * m.hidden_size * 2)
        expected = m.num_hidden_layers * layer
        assert c.layers_time(n) == expected
        if sampled:
            v = m.vocab_size / tp
            expected += max(2.0 * sampled * m.hidden_size * v / (c.peak * c._gemm_ce),
                            (m.hidden_size * v * c.wb + sampled * (m.hidden_size + v) * 2)
                            / (c.bw * p.gemm_memory_eff), p.kernel_floor_s)
        assert c.linear_time(n, sampled) == expected
