"""A MoE checkpoint whose routed experts have their own precision (gpt-oss: MXFP4 experts, BF16
attention, router and embeddings): its config.json's quantization_config, the memory budget
against the published checkpoint sizes, and the experts' weight reads and peak."""

import pytest

import sim
from sim.costs.roofline import RooflineCost
from sim.specs.memory import memory_budget
from sim.specs.memory_terms import GiB

MXFP4 = 0.5 + 1 / 32  # 4-bit values + one E8M0 scale per 32 (OCP MX v1.0)
# gpt-oss model card (arXiv:2508.10925, OpenAI, 2025-08-05), Table 1 "Checkpoint Size"
PUBLISHED_GIB = {"gpt-oss-120b": 60.8, "gpt-oss-20b": 12.8}
GPT_OSS_QUANT = {"quant_method": "mxfp4", "modules_to_not_convert": [
    "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}


def _experts(m):
    return m.num_hidden_layers * m.num_local_experts * m.mlp_params_per_expert()


@pytest.mark.parametrize("name", sorted(PUBLISHED_GIB))
def test_the_weights_are_the_published_checkpoint(name):
    m = sim.get_model(name)
    b = memory_budget(m, 200, weight_dtype="bf16", expert_weight_dtype="mxfp4")
    experts = _experts(m)
    assert -b.term("weights") == round((m.total_params() - experts) * 2 + experts * MXFP4)
    assert -b.term("weights") / GiB == pytest.approx(PUBLISHED_GIB[name], rel=0.005)
    # neither uniform precision is the checkpoint: bf16 is 3-3.6x it, mxfp4 throughout 5-19 %
    # under
    for dtype, off in (("bf16", 1.5), ("mxfp4", 0.04)):
        uniform = -memory_budget(m, 400, weight_dtype=dtype).term("weights") / GiB
        assert abs(uniform / PUBLISHED_GIB[name] - 1) > off


def test_the_experts_over_ep_gpus_in_their_own_precision():
    m = sim.get_model("gpt-oss-120b")
    experts, rest = _experts(m), m.total_params() - _experts(m)
    b = memory_budget(m, 80, weight_dtype="bf16", expert_weight_dtype="mxfp4",
                      expert_parallel=4)  # data-parallel attention: the rest whole per GPU
    assert -b.term("weights") == round(rest * 2 + experts / 4 * MXFP4)
    tp2 = memory_budget(m, 80, weight_dtype="bf16", expert_weight_dtype="mxfp4",
                        tensor_parallel=2)
    assert -tp2.term("weights") == round(rest / 2 * 2 + experts / 2 * MXFP4)


def test_the_config_json_quantization_config_gives_the_experts_precision():
    cfg = {"model_type": "gpt_oss", "num_hidden_layers": 24, "hidden_size": 2880,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
           "intermediate_size": 2880, "vocab_size": 201088, "num_local_experts": 32,
           "num_experts_per_tok": 4, "quantization_config": GPT_OSS_QUANT}
    assert sim.ModelConfig.from_hf(cfg).expert_dtype == "mxfp4"
    assert sim.get_model("gpt-oss-20b").expert_dtype == "mxfp4"  # the preset, as shipped
    other = dict(cfg, quantization_config={"quant_method": "fp8"})  # every linear layer
    assert sim.ModelConfig.from_hf(other).expert_dtype == ""
    none = dict(cfg, quantization_config={"quant_method": "mxfp4", "modules_to_not_convert":
                                          ["model.layers.*.mlp.experts"]})
    assert sim.ModelConfig.from_hf(none).expert_dtype == ""  # (transformers: experts only)
    bare = dict(cfg, quantization_config={"quant_method": "mxfp4"})
    assert sim.ModelConfig.from_hf(bare).expert_dtype == "mxfp4"


def test_the_experts_read_their_own_bytes_and_the_rest_bf16():
    # one token of gpt-oss-20b touches 4 experts: gate+up 2 x 2880 x 2880 weights each
    mixed = RooflineCost("gpt-oss-20b", "h100", weight_dtype="bf16", expert_weight_dtype="mxfp4")
    bf16 = RooflineCost("gpt-oss-20b", "h100", weight_dtype="bf16")
    w, b = mixed.op_work(1.0), bf16.op_work(1.0)
    act = 4 * (2880 + 2 * 2880) * 2  # the 4 rows' activations in and out
    assert w["moe_router"] == b["moe_router"]  # the router stays bf16
    assert w["mlp_up_proj"][1] == pytest.approx(4 * 2880 * 2 * 2880 * MXFP4 + act, rel=1e-12)
    assert b["mlp_up_proj"][1] == pytest.approx(4 * 2880 * 2 * 2880 * 2 + act, rel=1e-12)
    assert w["attn_pre_proj"] == b["attn_pre_proj"]  # attention stays bf16
    # a batch-1 decode is memory-bound: the expert GEMMs take about MXFP4 / 2 of the time
    tw, tb = mixed._times(w), bf16._times(b)
    floor = mixed.params.gemm_latency_s
    assert (tw["mlp_up_proj"] - floor) / (tb["mlp_up_proj"] - floor) == pytest.approx(
        MXFP4 / 2, rel=0.01)
    assert mixed.layers_time(1) < bf16.layers_time(1)


def test_the_experts_peak_is_their_dtype_s_on_the_gpu():
    h100 = RooflineCost("gpt-oss-20b", "h100", weight_dtype="bf16", expert_weight_dtype="mxfp4")
    p = h100.params  # no FP4 tensor cores: dequantised, the fp16 peak
    assert h100._expert_rate == sim.get_gpu("h100").fp16_tflops * 1e12 * p.gemm_compute_eff
    b200 = RooflineCost("gpt-oss-20b", "b200", weight_dtype="bf16", expert_weight_dtype="mxfp4")
    q = b200.params
    assert b200._expert_rate == sim.get_gpu("b200").fp4_tflops * 1e12 * (
        q.fp8_gemm_compute_eff or q.gemm_compute_eff)
    assert b200.peak == sim.get_gpu("b200").fp16_tflops * 1e12  # the rest: bf16
    assert "experts=mxfp4" in repr(b200)


def test_a_run_takes_the_checkpoint_s_precision():
    cfg = sim.SimConfig(model="gpt-oss-120b", gpu="h100", weight_dtype="bf16",
                        expert_weight_dtype="checkpoint")
    assert cfg.expert_weight_dtype == "mxfp4"  # resolved, and recorded in the Result
    assert cfg.resolved_kv_blocks() > 0  # 60.7 GiB fits one H100; bf16 throughout does not
    with pytest.raises(ValueError, match="does not fit"):
        sim.SimConfig(model="gpt-oss-120b", gpu="h100", weight_dtype="bf16").resolved_kv_blocks()
    assert sim.SimConfig(model="gpt-oss-120b").expert_weight_dtype is None  # default: as given


@pytest.mark.parametrize("kw, message", [
    (dict(model="llama-3.1-8b", expert_weight_dtype="fp8"),
     "^expert_weight_dtype 'fp8' needs a mixture-of-experts model"),
    (dict(model="mixtral-8x7b", expert_weight_dtype="checkpoint"),
     "^expert_weight_dtype 'checkpoint': 'mixtral-8x7b' ships its experts"),
    (dict(model="mixtral-8x7b", expert_weight_dtype="fp6"), "^expert_weight_dtype must be one"),
])
def test_bad_expert_dtypes_are_one_line_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        sim.SimConfig(**kw)


def test_the_cli_takes_the_checkpoint_s_experts_and_names_the_flag(tmp_path, capsys):
    from sim.cli.main import main
    out = str(tmp_path / "r")
    assert main(["run", "--model", "gpt-oss-20b", "--weight-dtype", "bf16", "--expert-dtype",
                 "checkpoint", "-n", "5", "-o", out]) == 0
    capsys.readouterr()
    assert main(["run", "--model", "llama-3.1-8b", "--expert-dtype", "mxfp4", "-n", "5",
                 "-o", out + "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--expert-dtype 'mxfp4' needs a mixture" in err
