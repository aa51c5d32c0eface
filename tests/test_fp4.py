"""FP4 weight formats (sim/specs/fp4.py): NVFP4's FP8 scale per 16 values and MXFP4's E8M0
scale per 32 in the weight bytes of the memory budget and the roofline; FP4 GEMMs only on FP4
tensor cores, weight-only (4-bit reads, the 16-bit peak) elsewhere, FP4 activations there an
error."""

import pytest

import sim
from sim.costs.roofline import RooflineCost
from sim.specs.gpus import get_gpu
from sim.specs.memory import bytes_per_value, memory_budget


def test_scale_bytes_per_weight():
    assert bytes_per_value("weight_dtype", "nvfp4") == 4 / 8 + 8 / 8 / 16 == 0.5625
    assert bytes_per_value("weight_dtype", "mxfp4") == 4 / 8 + 8 / 8 / 32 == 0.53125
    assert bytes_per_value("weight_dtype", "fp4") == 0.5625  # fp4: NVFP4


def test_the_budget_counts_the_scales():
    m = sim.get_model("gpt-oss-120b")
    for dtype, per in (("mxfp4", 0.53125), ("nvfp4", 0.5625)):
        b = memory_budget(m, 85.9, weight_dtype=dtype)
        assert -b.term("weights") == round(m.total_params() * per)


@pytest.mark.parametrize("dtype, per", [("nvfp4", 0.5625), ("mxfp4", 0.53125)])
def test_fp4_formats_on_and_off_fp4_tensor_cores(dtype, per):
    b200 = RooflineCost("gpt-oss-20b", "b200", weight_dtype=dtype)
    assert (b200.compute_dtype, b200.peak, b200.wb) == ("fp4", 9000e12, per)
    h100 = RooflineCost("gpt-oss-20b", "h100", weight_dtype=dtype)
    g = get_gpu("h100")
    assert (h100.compute_dtype, h100.peak, h100.wb) == ("fp16", g.fp16_tflops * 1e12, per)
    assert "no FP4 tensor cores" in h100.compute_note
    with pytest.raises(ValueError, match="H100-80GB-SXM has no FP4 tensor cores"):
        RooflineCost("gpt-oss-20b", "h100", weight_dtype=dtype, activation_dtype="fp4")


def test_weight_only_fp4_decodes_read_the_scales():
    # a memory-bound decode's GEMMs read every weight once: their time is the bytes'
    nv = RooflineCost("llama-3.1-70b", "h100", weight_dtype="nvfp4", tensor_parallel=2)
    mx = RooflineCost("llama-3.1-70b", "h100", weight_dtype="mxfp4", tensor_parallel=2)
    up = lambda c: c.op_times(1)["mlp_up_proj"] - c.params.gemm_latency_s
    assert up(nv) / up(mx) == pytest.approx(0.5625 / 0.53125, rel=1e-3)


def test_mxfp4_is_a_weight_dtype_of_the_cli(tmp_path):
    from sim.cli import main
    assert main(["run", "--model", "gpt-oss-20b", "--gpu", "h100", "--weight-dtype", "mxfp4",
                 "-w", "azure-code", "-n", "5", "-q", "-o", str(tmp_path / "o")]) == 0
