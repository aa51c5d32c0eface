"""The MoE expert-GEMM scale per GPU (sim/data/moe_fit.json ``params``, experiments/
moe_kernels.py): a GPU with fused-MoE fit rows of its own gets its own scale, and a B200 MoE
prefill is priced from it in closed form; every other GPU gets the shared scale, and its
provenance and ``sim run``'s note say it is assumed; B200's published rows (memory-bound) are
not moved by the scale."""

import json

import pytest

import sim.costs.roofline_params as rp
from sim.cli.main import main
from sim.costs.roofline import RooflineCost
from sim.costs.roofline_params import fitted_gpus, fitted_params
from sim.costs.roofline_terms import moe_note, provenance


def _with_moe_params(monkeypatch, extra):
    """``fitted_params`` reading a moe_fit.json whose ``params`` also hold ``extra``."""
    real = rp._fitted

    def fake(name="roofline_fit.json"):
        data = real(name)
        if name != "moe_fit.json":
            return data
        return {**data, "params": {**data.get("params", {}), **extra}}
    monkeypatch.setattr(rp, "_fitted", fake)


def test_a_gpus_own_scale_prices_its_moe_prefill_in_closed_form(monkeypatch):
    """Qwen3-235B-A22B on 8 B200s, a prefill of 8,192 tokens: each expert GEMM is compute-
    bound at a B200 scale of its own (0.37, half the shared 0.74): FLOPs / (B200's BF16 peak x
    GEMM efficiency x 0.37) + the GEMM latency; at the shared 0.74 the larger of that compute
    time and the weights' and activations' streaming; nothing else moves."""
    shared = fitted_params("b200")
    assert shared.moe_gemm_compute_scale == 0.74
    before = RooflineCost("qwen3-235b-a22b", "b200", tensor_parallel=8)
    _with_moe_params(monkeypatch, {"b200": {"moe_gemm_compute_scale": 0.37}})
    own = fitted_params("b200")
    assert own.moe_gemm_compute_scale == 0.37
    assert fitted_params("h200").moe_gemm_compute_scale == 0.74  # only B200 moves
    after = RooflineCost("qwen3-235b-a22b", "b200", tensor_parallel=8, params=own)
    m, tokens = after.model, 8192
    h, w, k = m.hidden_size, m.intermediate_size / 8, m.num_experts_per_tok
    flops = {"mlp_up_proj": 2 * tokens * k * h * 2 * w, "mlp_down_proj": 2 * tokens * k * w * h}
    peak = after.gpu.fp16_tflops * 1e12
    t0, t1 = before.op_times(tokens), after.op_times(tokens)
    for op, f in flops.items():
        assert after.op_work(tokens)[op][0] == pytest.approx(f, rel=1e-12)
        assert t1[op] == pytest.approx(
            f / (peak * own.gemm_compute_eff * 0.37) + own.gemm_latency_s, rel=1e-12)
        nbytes = before.op_work(tokens)[op][1]  # at 0.74 the larger of compute and memory
        assert t0[op] == pytest.approx(max(
            f / (peak * shared.gemm_compute_eff * 0.74),
            nbytes / (before.bw * shared.gemm_memory_eff)) + shared.gemm_latency_s, rel=1e-12)
        assert t1[op] > t0[op]
    assert all(t1[op] == t0[op] for op in t0 if op not in flops)
    assert after.layers_time(tokens) > before.layers_time(tokens)
    dense = RooflineCost("llama-3.1-70b", "b200", tensor_parallel=8)  # dense: untouched
    assert RooflineCost("llama-3.1-70b", "b200", tensor_parallel=8, params=own).layers_time(
        tokens) == dense.layers_time(tokens)


def test_the_shipped_fit_is_per_gpu_and_the_rest_is_assumed(load_script):
    mk = load_script("experiments/moe_kernels.py")
    shipped = json.loads(mk.SHIPPED.read_text())
    assert shipped["params"] == {g: {"moe_gemm_compute_scale": s}
                                 for g, s in mk.fit_per_gpu().items()}
    assert set(shipped["params"]) == {"h100"}  # the only GPU with fit rows
    assert "h100" in fitted_gpus()
    assert provenance("h100")["moe_gemm_compute_scale"][0] == "fitted"
    for gpu in ("b200", "mi300x", "h200", "a100", "l40s"):
        kind, note = provenance(gpu)["moe_gemm_compute_scale"]
        assert kind == "assumed" and "fitted on h100" in note, gpu
    assert "no mi300x fused-MoE kernel timing found" in provenance("mi300x")[
        "moe_gemm_compute_scale"][1]
    assert "its 3 fused-MoE rows" in provenance("b200")["moe_gemm_compute_scale"][1]


def test_b200_rows_are_memory_bound_and_within_five_percent(load_script):
    """vLLM PR #31448's B200 batch 1-4 rows: the scale does not move them (memory-bound), and
    the roofline with B200's assumed memory terms is within 5 % of each."""
    mk = load_script("experiments/moe_kernels.py")
    lo, hi = mk.report(0.3), mk.report(1.0)
    b200 = lo["gpu"] == "b200"
    assert b200.sum() == 3 and (lo.loc[b200, "split"] == "held-out").all()
    assert (lo.loc[b200, "predicted_us"] == hi.loc[b200, "predicted_us"]).all()
    assert (mk.report().loc[b200, "error"].abs() < 0.05).all()


def test_run_notes_an_assumed_moe_scale(capsys):
    assert moe_note(RooflineCost("qwen3-235b-a22b", "b200", tensor_parallel=8)).startswith(
        "MoE expert GEMMs at moe_gemm_compute_scale 0.74, assumed on B200")
    assert moe_note(RooflineCost("mixtral-8x7b", "h100", tensor_parallel=2)) is None
    assert moe_note(RooflineCost("llama-3.1-8b", "b200")) is None  # dense
    assert main(["run", "--gpu", "b200", "--model", "qwen3-30b-a3b", "--num-requests",
                 "20"]) in (0, None)
    assert "moe_gemm_compute_scale 0.74, assumed on B200" in capsys.readouterr().out
