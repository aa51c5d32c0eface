"""sim.costs.moe and the roofline's MoE layer: routing expectations against a seeded
Monte-Carlo and closed forms, the MoE ops worked by hand for Mixtral-8x7B at batch 1 and 256,
dense models untouched, and the published fused-MoE kernel rows recomputed."""

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.costs.moe import _binomial_pmf, expected_busiest, expected_touched, moe_work
from sim.costs.roofline import RooflineCost
from sim.costs.roofline_params import EXPERT_OPS, MOE_GEMM_OPS, MOE_STREAM_OPS, fitted_params


def _monte_carlo_busiest(tokens, k, experts, runs, seed):
    """Mean and standard error of the busiest expert's load: every token picks k distinct
    experts uniformly (the k smallest of E uniform draws)."""
    rng = np.random.default_rng(seed)
    picks = np.argsort(rng.random((runs, tokens, experts)), axis=2)[:, :, :k]
    counts = np.zeros((runs, experts))
    run = np.repeat(np.arange(runs), tokens * k)
    np.add.at(counts, (run, picks.reshape(runs, -1).ravel()), 1)
    busiest = counts.max(axis=1)
    assert (counts.sum(axis=1) == tokens * k).all()
    return busiest.mean(), busiest.std() / np.sqrt(runs)


@pytest.mark.parametrize("tokens, k, experts, runs", [
    (1, 2, 8, 2000), (2, 2, 8, 4000), (3, 2, 8, 4000), (4, 2, 8, 4000), (16, 2, 8, 2000),
    (256, 2, 8, 1000), (64, 8, 128, 300), (256, 6, 64, 300)])
def test_busiest_expert_is_a_lower_bound_near_the_monte_carlo(tokens, k, experts, runs):
    mc, se = _monte_carlo_busiest(tokens, k, experts, runs, seed=tokens + experts)
    approx = expected_busiest(tokens, k, experts)
    assert approx <= mc + 3 * se  # the loads are negatively associated: a lower bound
    # within 10 % below 4 tokens, 5 % from 4 up (less as the tokens grow)
    assert approx == pytest.approx(mc, rel=0.10 if tokens < 4 else 0.05 + 3 * se / mc)
    assert tokens * k / experts <= approx <= tokens


def test_busiest_expert_closed_forms():
    assert expected_busiest(0, 2, 8) == 0.0
    assert expected_busiest(1, 2, 8) == 1.0  # one token: each of its experts has one row
    assert expected_busiest(7, 8, 8) == 7.0  # every expert gets every token
    # two tokens, top-1 of 2 experts: both on one expert with probability 1/2 -> E[max] = 1.5
    # (the independence form gives sum_m 1 - F(m)^2 = 1 - 1/16 + 1 - 9/16 = 1.375, a lower
    # bound 8 % under)
    assert expected_busiest(2, 1, 2) == pytest.approx(1.375)


def test_binomial_pmf_matches_scipy():
    from scipy.stats import binom
    for n, p in ((1, 0.25), (40, 0.25), (5000, 0.0625), (3000, 1.0)):
        assert np.allclose(_binomial_pmf(n, p), binom.pmf(np.arange(n + 1), n, p),
                           atol=1e-12, rtol=1e-9)


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(0, 5000), experts=st.integers(1, 256), data=st.data())
def test_touched_experts_are_bounded(tokens, experts, data):
    k = data.draw(st.integers(1, experts))
    touched = expected_touched(tokens, k, experts)
    assert 0 <= touched <= min(experts, tokens * k) + 1e-9
    assert expected_touched(tokens + 1, k, experts) >= touched


MIXTRAL_H, MIXTRAL_I = 4096, 14336


@pytest.mark.parametrize("tokens", [1, 256])
def test_mixtral_moe_ops_by_hand(tokens):
    """Mixtral-8x7B on two H100s (TP 2): every MoE op's FLOPs and bytes, and its seconds."""
    cost = RooflineCost("mixtral-8x7b", "h100", tensor_parallel=2)
    p, h, w = cost.params, MIXTRAL_H, MIXTRAL_I / 2  # one expert's width on one GPU
    work = cost.op_work(tokens)
    touched = 2.0 if tokens == 1 else 8 * (1 - 0.75 ** 256)
    rows = 2 * tokens
    expected = {
        "moe_router": (2 * tokens * h * 8, h * 8 * 2 + tokens * (h * 2 + 8 * 4)),
        "moe_topk": (0.0, tokens * (8 * 4 + 2 * (4 + 4))),
        "moe_permute": (0.0, 3 * tokens * h * 2),
        "moe_unpermute": (0.0, 3 * tokens * h * 2),
        "mlp_up_proj": (2 * rows * h * 2 * w, touched * h * 2 * w * 2 + rows * (h + 2 * w) * 2),
        "mlp_down_proj": (2 * rows * w * h, touched * w * h * 2 + rows * (w + h) * 2),
        "mlp_act": (0.0, rows * 3 * w * 2),
    }
    for op, (flops, nbytes) in expected.items():
        assert work[op] == pytest.approx((flops, nbytes), rel=1e-12), op
    times = cost.op_times(tokens)
    peak, bw = 989.4e12, 3350e9
    for op in ("mlp_up_proj", "mlp_down_proj"):
        flops, nbytes = expected[op]
        assert times[op] == pytest.approx(max(
            flops / (peak * p.gemm_compute_eff * p.moe_gemm_compute_scale),
            nbytes / (bw * p.gemm_memory_eff), p.kernel_floor_s) + p.gemm_latency_s, rel=1e-12)
    flops, nbytes = expected["moe_router"]
    assert times["moe_router"] == pytest.approx(max(
        flops / (peak * p.gemm_compute_eff), nbytes / (bw * p.gemm_memory_eff),
        p.kernel_floor_s) + p.gemm_latency_s, rel=1e-12)
    for op in MOE_STREAM_OPS:
        assert times[op] == pytest.approx(max(expected[op][1] / (bw * p.elementwise_eff["add"]),
                                              p.kernel_floor_s), rel=1e-12)
    if tokens == 1:  # batch 1: two experts' weights, 2 x 3 x 4096 x 7168 x 2 B = 352 MB/s...
        assert times["mlp_up_proj"] + times["mlp_down_proj"] == pytest.approx(
            2 * 3 * h * w * 2 / (bw * p.gemm_memory_eff) + 2 * p.gemm_latency_s, rel=1e-3)
        # ... and the routing ops are all at the kernel floor
        assert all(times[op] == p.kernel_floor_s for op in MOE_STREAM_OPS)


def test_expert_gemm_scale_applies_to_the_routed_gemms_only():
    """Compute-bound (8,192 tokens): the experts' GEMMs slow down by exactly the scale; the
    router, attention projections and everything else do not move."""
    base = fitted_params("h100")
    a = RooflineCost("mixtral-8x7b", "h100", params=dataclasses.replace(
        base, moe_gemm_compute_scale=1.0)).op_times(8192)
    b = RooflineCost("mixtral-8x7b", "h100", params=dataclasses.replace(
        base, moe_gemm_compute_scale=0.5)).op_times(8192)
    for op in a:
        if op in EXPERT_OPS:
            assert b[op] - base.gemm_latency_s == pytest.approx(
                2 * (a[op] - base.gemm_latency_s), rel=1e-12)
        else:
            assert b[op] == a[op], op


@pytest.mark.parametrize("name, tp", [("llama-3.1-8b", 1), ("llama-2-70b", 4), ("gpt-j-6b", 1),
                                      ("falcon-40b", 2)])
def test_dense_models_are_untouched(name, tp):
    base = fitted_params("h100")
    cost = RooflineCost(name, "h100", tensor_parallel=tp)
    other = RooflineCost(name, "h100", tensor_parallel=tp, params=dataclasses.replace(
        base, moe_gemm_compute_scale=0.3))
    work = cost.op_work(np.array([1, 64, 4096]))
    assert not set(work) & set(MOE_GEMM_OPS + MOE_STREAM_OPS)
    for tokens in (1, 256, 8192):
        assert cost.linear_time(tokens, 1) == other.linear_time(tokens, 1)


def test_moe_work_is_linear_in_tokens_but_the_weights():
    kw = dict(hidden=64, width=32, num_experts=4, k=2, gate=2, weight_bytes=2)
    a, b = moe_work(10, **kw), moe_work(20, **kw)
    for op in ("moe_topk", "moe_permute", "moe_unpermute"):
        assert b[op][1] == 2 * a[op][1]
    for op in ("moe_router", "mlp_up_proj", "mlp_down_proj"):
        assert b[op][0] == 2 * a[op][0]  # FLOPs per token; bytes add the weights once


def test_kernel_rows_fit_and_held_out_error_recomputed(load_script):
    """The shipped scale is the fit on the fit rows; the held-out report is recomputed from the
    data (the numbers, not their size, are what is checked; README "Fidelity")."""
    mk = load_script("experiments/moe_kernels.py")
    rows = mk.load()
    assert set(rows["split"]) == {"fit", "held-out"}
    assert (rows[rows["split"] == "fit"]["model"] == "mixtral-8x7b").all()
    assert rows["source"].str.len().min() > 40  # every row cites its source
    scale = mk.fit_scale(rows)
    assert fitted_params("a100").moe_gemm_compute_scale == scale
    assert fitted_params("h100").moe_gemm_compute_scale == scale
    assert json.dumps(mk.document(scale), indent=1) + "\n" == mk.SHIPPED.read_text()
    rep = mk.report()
    held = rep[rep["split"] == "held-out"]
    assert len(held) == 41 and len(rep) == 56
    stored = {(r["split"], r["model"]): r for r in json.loads(mk.SHIPPED.read_text())["report"]}
    for (split, model, _, _), r in mk.summary(rep).round(3).iterrows():
        assert stored[(split, model)]["median_abs"] == r["median_abs"]
        assert stored[(split, model)]["median_signed"] == r["median_signed"]
    # the fitted scale lowers the compute-bound fit rows' error (batch >= 1,024) and changes
    # none of the memory-bound ones (batch <= 128)
    flat = mk.report(1.0)
    fit = rep["split"] == "fit"
    big, small = fit & (rep["batch_tokens"] >= 1024), fit & (rep["batch_tokens"] <= 128)
    assert rep.loc[big, "error"].abs().max() < flat.loc[big, "error"].abs().max()
    assert (rep.loc[small, "error"] == flat.loc[small, "error"]).all()


def test_moe_kernels_script_prints_without_writing(load_script, capsys):
    mk = load_script("experiments/moe_kernels.py")
    before = mk.SHIPPED.read_text()
    assert mk.main([]) == 0
    assert "moe_gemm_compute_scale fitted on the fit rows" in capsys.readouterr().out
    assert mk.SHIPPED.read_text() == before


def test_array_tokens_match_scalars_and_dense_first_layers_have_no_routing():
    cost = RooflineCost("mixtral-8x7b", "h100", tensor_parallel=2)
    tokens = np.array([1, 7, 256, 8192])
    arrays = cost.op_times(tokens)
    for j, t in enumerate(tokens):
        scalars = cost.op_times(int(t))
        assert {op: float(v[j]) for op, v in arrays.items()} == pytest.approx(scalars,
                                                                               rel=1e-12)
    # DeepSeek-V3: 3 dense layers of 61 have no router, so the mean over the layers carries
    # 58 / 61 of a MoE layer's routing ops
    ds = RooflineCost("deepseek-v3", "h100", tensor_parallel=8)
    moe_layer = ds._times(ds.op_work(64))
    mean = ds.op_times(64)
    for op in MOE_GEMM_OPS + MOE_STREAM_OPS:
        assert mean[op] == pytest.approx(58 / 61 * moe_layer[op], rel=1e-12)
