import json
from importlib import resources

import numpy as np
import pytest

from sim import get_gpu, get_model
from sim.engine.batch import Batch
from sim.costs.roofline import RooflineCost, fitted_params


class FakeBatch:
    def __init__(self, prefills=(), decodes=0, context=0):
        self.prefills = list(prefills)
        self.num_prefill_tokens = sum(n for n, _ in self.prefills)
        self.num_decode_tokens = decodes
        self.decode_context_tokens = context


def test_shipped_fit_reproduces_and_meets_10_percent_on_held_out_model(load_script):
    fit_roofline = load_script("experiments/fit_roofline.py")
    params, rep = fit_roofline.fit_all()
    stored = json.loads(resources.files("sim").joinpath("data/roofline_fit.json").read_text())
    for gpu, p in params.items():
        assert stored["params"][gpu]["gemm_compute_eff"] == p.gemm_compute_eff
        assert stored["params"][gpu]["elementwise_eff"] == p.elementwise_eff
    held = rep[rep["split"] == "held-out"]
    assert set(held["gpu"]) == {"a100", "h100"}
    assert (rep["median_ape_pct"] <= 10).all(), rep
    assert (held["median_ape_pct"] <= 10).all()
    # the fit is physical: ~70% of peak FLOP/s, 75-95% of peak bandwidth (profiles README)
    for p in params.values():
        assert 0.6 <= p.gemm_compute_eff <= 0.8 and 0.7 <= p.gemm_memory_eff <= 0.95


def test_decode_of_one_token_reads_the_weights_and_matches_measured_layers():
    cost = RooflineCost("llama-2-7b", "h100")
    m, g, p = get_model("llama-2-7b"), get_gpu("h100"), fitted_params("h100")
    weights = m.total_params() * 2 - m.vocab_size * m.hidden_size * 2  # input embedding not read
    t = cost(FakeBatch(decodes=1, context=1)) - p.overhead_s
    assert t > weights / (g.memory_bandwidth_gbps * 1e9)  # never faster than peak bandwidth
    # Vidur's measured H100 kernels for one layer at 1 token, x 32 layers (+ 1 extra residual add)
    import pandas as pd
    with resources.files("sim").joinpath("data/profiles/vidur_h100_Llama-2-7b-hf_layer_ms.csv").open() as f:
        prof = pd.read_csv(f)
    row = prof[(prof.tensor_parallel == 1) & (prof.num_tokens == 1)].iloc[0]
    ops = [c for c in prof.columns if c.endswith("_ms") and c != "emb_ms"]
    measured = 32 * (row[ops].sum() + row["add_ms"]) * 1e-3
    lm_head = cost.linear_time(1, 1) - cost.linear_time(1, 0)
    attention = cost(FakeBatch(decodes=1, context=1)) - p.overhead_s - cost.linear_time(1, 1)
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
    expected = (p.overhead_s + m.num_hidden_layers * (sum(ops.values()) + ops["add"])
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
