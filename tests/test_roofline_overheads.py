"""Fixed costs, CUDA graphs and compute peaks of the roofline, against published measurements.

Every measured figure used here is a row of ``sim/data/published_latency.csv`` or
``sim/data/cpu_overheads.csv`` (each with its source); the numbers the tests assert are the
errors the README's Fidelity table reports.
"""

import dataclasses
import json
from importlib import resources

import numpy as np
import pandas as pd
import pytest

from sim.costs.roofline import RooflineCost, RooflineParams, fitted_params
from sim.engine.core.batch import Batch


def _published(metric):
    with resources.files("sim").joinpath("data/published_latency.csv").open() as f:
        d = pd.read_csv(f)
    return d[d["metric"] == metric]


def _ttft_rows():
    return _published("ttft")


def _predict(rows, params_for=None):
    out = []
    for r in rows.itertuples():
        params = params_for(r.gpu) if params_for else None
        c = RooflineCost(r.model, r.gpu, tensor_parallel=int(r.tensor_parallel),
                         weight_dtype=r.weight_dtype, kv_dtype=r.kv_dtype, params=params)
        n = int(r.input_tokens)
        out.append(c(Batch(0, [(n, 0)], n, 0, 0)) * 1e3)
    return np.array(out)


def _old_model(gpu):
    """The roofline before the fixed costs: 1 ms per iteration, fp8 at the fp16 efficiency."""
    return dataclasses.replace(fitted_params(gpu), overhead_s=1e-3, eager_layer_overhead_s=0.0,
                               fp8_gemm_compute_eff=None, attn_decode_memory_eff=0.7)


def test_batch1_first_token_latency_at_128_tokens_within_16_percent():
    rows = _ttft_rows()
    short = rows[rows["input_tokens"] == 128]
    assert len(short) == 8  # 4 models x A100 fp16 / H100 fp8, TensorRT-LLM's table
    err = _predict(short) / short["value"].to_numpy() - 1
    before = _predict(short, _old_model) / short["value"].to_numpy() - 1
    # before: every 128-token prediction was 14-36 % too low (the finding)
    assert (before < -0.13).all() and before.min() > -0.37
    # now: each within 16 %, the median within 11 %, held-out models (GPT-J, Falcon-180B)
    # within 16 % too
    assert np.abs(err).max() <= 0.16, err
    assert np.median(np.abs(err)) <= 0.11
    held = (short["split"] == "held-out").to_numpy()
    assert np.abs(err[held]).max() <= 0.16 and np.median(np.abs(err[held])) <= 0.13
    for gpu in ("a100", "h100"):  # better on each GPU
        g = (short["gpu"] == gpu).to_numpy()
        assert np.median(np.abs(err[g])) < 0.5 * np.median(np.abs(before[g]))


def test_batch1_first_token_latency_at_2048_tokens_not_worse():
    rows = _ttft_rows()
    long = rows[rows["input_tokens"] == 2048]
    err = _predict(long) / long["value"].to_numpy() - 1
    before = _predict(long, _old_model) / long["value"].to_numpy() - 1
    assert np.median(np.abs(err)) <= 0.06 < np.median(np.abs(before))
    # one outlier left: Falcon-180B on 8 H100s in FP8, 32 % too fast (was 38 %)
    worst = long.iloc[int(np.argmax(np.abs(err)))]
    assert (worst["model"], worst["gpu"]) == ("falcon-180b", "h100")
    # next: Llama-2-70B on 4 A100s, 12.2 % too slow (prefill attention at the FlashAttention-2
    # efficiency measured on a power-limited A100)
    assert np.sort(np.abs(err))[-2] <= 0.125 and np.abs(err).max() <= 0.35


def _static_batch_throughput(row, params):
    """Output tok/s of TensorRT-LLM's static-batch benchmark: one prefill of the batch, then
    decode steps over a growing context (priced without launch gaps: see fit_roofline), its
    prefill attention in fp16 over the fp8 KV cache (the documented builds' attention plugin)."""
    p = dataclasses.replace(params, cuda_graph_max_batch=1 << 30,
                            attn_prefill_fp8_compute_eff=None)
    c = RooflineCost(row.model, row.gpu, weight_dtype=row.weight_dtype, kv_dtype=row.kv_dtype,
                     params=p)
    b, n, o = int(row.batch_size), int(row.input_tokens), int(row.output_tokens)
    t = c(Batch(0, [(n, 0)] * b, b * n, 0, 0))
    t += sum(c(Batch(0, (), 0, b, b * (n + k))) for k in range(1, o))
    return b * o / t


def test_decode_heavy_throughput_within_10_percent_of_published():
    rows = _published("throughput")
    # the TP 2-8 rows: test_roofline_collectives; the H200's (unfitted): test_roofline_attention
    rows = rows[(rows["tensor_parallel"] == 1) & rows["gpu"].isin(["a100", "h100"])]
    assert len(rows) == 13 and set(rows["batch_size"]) >= {48, 60, 112, 1024}
    meas = rows["value"].to_numpy()
    err = np.array([_static_batch_throughput(r, fitted_params(r.gpu))
                    for r in rows.itertuples()]) / meas - 1
    before = np.array([_static_batch_throughput(r, _old_model(r.gpu))
                       for r in rows.itertuples()]) / meas - 1
    # before: decode-heavy throughput 10-21 % too low (the finding), bar one row
    assert np.median(before) < -0.13 and (before < 0.02).all()
    held = (rows["split"] == "held-out").to_numpy()  # GPT-J-6B
    assert np.abs(err).max() <= 0.10 and np.median(np.abs(err)) <= 0.05
    assert np.abs(err[held]).max() <= 0.07 and np.median(np.abs(err[held])) <= 0.04
    # the fitted decode-attention bandwidth efficiency is physical (below peak)
    for gpu in ("a100", "h100"):
        assert 0.7 < fitted_params(gpu).attn_decode_memory_eff <= 0.95


def test_shipped_fixed_costs_are_the_published_measurements():
    fit = json.loads(resources.files("sim").joinpath("data/roofline_fit.json").read_text())
    with resources.files("sim").joinpath("data/cpu_overheads.csv").open() as f:
        cpu = pd.read_csv(f)
    total = cpu[["schedule_ms", "sampler_ms", "prepare_inputs_ms", "process_outputs_ms"]].sum(
        axis=1).to_numpy() * 1e-3
    fit_rows = (cpu["split"] == "fit").to_numpy()
    slope, intercept = np.polyfit(cpu["batch_size"][fit_rows], total[fit_rows], 1)
    p = fitted_params("a100")
    assert p.overhead_s == pytest.approx(intercept, rel=1e-4)  # ~1.2 ms per iteration
    assert fit["synchronous_cpu"]["overhead_per_seq_s"] == pytest.approx(slope, rel=1e-3)
    assert 1e-3 < p.overhead_s < 1.5e-3 and 8e-5 < slope < 1.2e-4  # 0.1 ms per sequence
    assert p.overhead_per_seq_s == 0.0  # overlapped with the GPU by default (docstring)
    report = {r["split"]: r["median_ape_pct"] for r in fit["cpu_overhead_report"]}
    assert report["fit"] <= 2 and report["held-out"] <= 30  # CodeLlama-34B held out
    # the fitted per-layer launch gap is of the order of what a CUDA graph saved in vLLM
    # (#1440: 47 us per layer and decode step, Llama-2-7B, batch 1)
    saving = fit["cross_checks"]["graph_saving_per_layer_s (vLLM #1440)"]
    assert saving == pytest.approx((1.2 - 1.05) / 99 / 32, rel=1e-2)
    for gpu in ("a100", "h100"):
        assert 1.0 <= fitted_params(gpu).eager_layer_overhead_s / saving <= 3.0


def test_cuda_graph_decode_batches_skip_the_per_layer_launch_term():
    c = RooflineCost("llama-2-7b", "a100")
    p = c.params
    eager = 32 * p.eager_layer_overhead_s
    assert eager > 0

    def decode(n, cost=c):
        return cost(Batch(0, (), 0, n, n * 100))

    # 512 sequences replay a graph, 513 launch eagerly: the step jumps by the eager term
    jump = decode(513) - decode(512)
    step = decode(512) - decode(511)
    assert jump - step == pytest.approx(eager, rel=1e-6)
    assert c.fixed_time(4) - c.fixed_time(4, graphed=True) == pytest.approx(eager)
    # any prefill runs eagerly
    mixed = c(Batch(0, [(16, 0)], 16, 4, 400))
    graph_free = RooflineCost("llama-2-7b", "a100", params=dataclasses.replace(
        p, eager_layer_overhead_s=0.0))
    assert mixed - graph_free(Batch(0, [(16, 0)], 16, 4, 400)) == pytest.approx(eager)
    never = RooflineCost("llama-2-7b", "a100", params=dataclasses.replace(
        p, cuda_graph_max_batch=0))  # enforce-eager
    assert decode(1, never) - decode(1) == pytest.approx(eager)


def test_per_sequence_overhead_adds_per_sequence():
    p = dataclasses.replace(fitted_params("h100"), overhead_per_seq_s=1e-4)
    c, base = RooflineCost("llama-3.1-8b", "h100", params=p), RooflineCost("llama-3.1-8b", "h100")
    b = Batch(0, [(100, 0), (50, 20)], 150, 30, 30 * 500)
    assert c(b) - base(b) == pytest.approx(32 * 1e-4, rel=1e-9)  # 2 prefills + 30 decodes
    assert c.fixed_time(32) - base.fixed_time(32) == pytest.approx(32 * 1e-4)


def test_fp8_gemms_use_their_fitted_efficiency_and_fp4_needs_fp4_cores():
    p = fitted_params("h100")
    assert 0.4 <= p.fp8_gemm_compute_eff <= 0.9  # fitted: ~0.63 of the FP8 peak
    fp8 = RooflineCost("llama-2-7b", "h100", weight_dtype="fp8")
    assert fp8.compute_dtype == "fp8" and fp8.peak == pytest.approx(1978.9e12)
    flops, _ = fp8.op_work(8192)["mlp_up_proj"]
    assert fp8.op_times(8192)["mlp_up_proj"] == pytest.approx(
        flops / (1978.9e12 * p.fp8_gemm_compute_eff) + p.gemm_latency_s, rel=1e-9)
    # FP4 at the FP4 peak only where the GPU has FP4 tensor cores
    b200 = RooflineCost("llama-2-7b", "b200", weight_dtype="fp4")
    assert b200.compute_dtype == "fp4" and b200.peak == pytest.approx(9000e12)
    h100 = RooflineCost("llama-2-7b", "h100", weight_dtype="fp4")
    assert h100.compute_dtype == "fp16" and h100.peak == pytest.approx(989.4e12)
    assert "no FP4 tensor cores" in h100.compute_note
    a100 = RooflineCost("llama-2-7b", "a100", weight_dtype="fp8")
    assert a100.compute_dtype == "fp16" and "no FP8 tensor cores" in a100.compute_note
    assert RooflineCost("llama-2-7b", "a100").compute_note.startswith("fp16")


def test_unfitted_gpus_use_the_mean_of_each_fitted_term():
    a, h, b = fitted_params("a100"), fitted_params("h100"), fitted_params("b200")
    assert b.eager_layer_overhead_s == pytest.approx(
        (a.eager_layer_overhead_s + h.eager_layer_overhead_s) / 2)
    assert a.fp8_gemm_compute_eff is None  # the A100 has no FP8: nothing fitted
    assert b.fp8_gemm_compute_eff == h.fp8_gemm_compute_eff
    assert b.overhead_s == a.overhead_s == h.overhead_s


@pytest.mark.parametrize("field, value", [("cuda_graph_max_batch", -1),
                                          ("cuda_graph_max_batch", 2.5),
                                          ("fp8_gemm_compute_eff", 1.5),
                                          ("eager_layer_overhead_s", -1e-6),
                                          ("overhead_per_seq_s", -1.0)])
def test_bad_params_name_the_field(field, value):
    with pytest.raises((ValueError, TypeError), match=field):
        RooflineParams(**{field: value})
