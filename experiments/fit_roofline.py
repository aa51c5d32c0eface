"""Fit the roofline's efficiency factors to measured A100/H100 per-layer kernel timings.

    python experiments/fit_roofline.py            # prints the report; writes nothing
    python experiments/fit_roofline.py --write    # also overwrites sim/data/roofline_fit.json

Data: Vidur's measured per-layer op timings (``sim/data/profiles/``; MIT, Microsoft), token
counts 1-4,096, TP 1/2/4/8. Per GPU the fit chooses the GEMM compute and memory efficiencies,
one memory efficiency per elementwise op and a kernel-time floor, minimising the mean absolute
log error on the *fit* models; the *held-out* model (Llama-2-70B on both GPUs) is never seen by
the fit. The report gives median and P90 absolute percentage error per op family.

The prefill attention's efficiency curve (``eff x L / (L + half)`` over a context of ``L``
tokens) per GPU from published causal forward benchmarks of the kernel its engines run
(``sim/data/attention_kernels.csv``: FlashAttention-2 on an A100, FlashAttention-3 on an H100),
fitted on the head-dim-128 full-prompt rows; a chunk over a cached prefix (A100) and head dims
64 and 256 (H100) are held out, and FlashAttention-2 on the H100 is reported as another kernel.
The FP8 curve (H100, at the FP8 peak: ``attn_prefill_fp8_*``) from FlashAttention-3's FP8
forward: its causal head-dim-256 panel fit, the head-dim-64 one held out.

Then the fixed costs and the FP8 efficiency, from published end-to-end measurements
(``sim/data/cpu_overheads.csv``, ``sim/data/published_latency.csv``, each row sourced):

- ``overhead_s``: the intercept of vLLM's CPU time per iteration (schedule + prepare inputs +
  sampler + output processing) against batch size, Vidur's A100 profiling of Llama-2-7B
  (held out: CodeLlama-34B); its slope is the per-sequence cost of that synchronous engine,
  stored as ``synchronous_cpu`` (not a default: vLLM >= 0.6 overlaps it with the GPU);
- per GPU, ``eager_layer_overhead_s`` (and on the H100 ``fp8_gemm_compute_eff``), minimising
  the squared log error of batch-1 first-token latency against TensorRT-LLM's published table
  on the *fit* models (Llama-2-7B and -70B); GPT-J-6B and Falcon-180B (other architectures) are
  held out. A prefill launches its kernels one by one (TensorRT-LLM 0.5 had no CUDA graphs);
- then per GPU ``attn_decode_memory_eff``, minimising the squared log error of TensorRT-LLM's
  published static-batch throughputs (TP 1; Llama-2-7B fit, GPT-J-6B and the TP 2-8 rows held
  out) and, on the A100, LMDeploy's median decode steps (Llama-2-7B fit; -13B and -70B held
  out), at most ``MAX_BANDWIDTH_EFF`` of the peak bandwidth;
- then the fraction of a grouped-query KV head's re-reads that a decode kernel which is not
  group-aware (one thread block per query head: TensorRT-LLM before XQA) takes from HBM,
  ``attn_decode_reread_fraction``, fitted to one published ratio only (TensorRT-LLM's XQA blog:
  Llama-2-70B on one H200, the same static batch without and with XQA, :data:`XQA_PAIR`) and
  applied to the rows of the engines that had no group-aware kernel
  (:data:`PER_HEAD_DECODE_ENGINES`, each with its source);
- not fitted: the engines that all-reduced a parallel attention+MLP layer's two outputs
  separately (:data:`SEPARATE_REDUCE_ENGINES`, TensorRT-LLM before 0.7.1: Falcon and GPT-J),
  priced with ``parallel_block_allreduces`` 2, and the rows that moves
  (:func:`separate_reduce_report`);
- a cross-check of that per-layer term: what a CUDA graph saved per decode step and layer in
  vLLM pull request #1440 (Llama-2-7B, batch 1, 100 tokens, eager vs graph);
- the custom all-reduce's stage latency and rate (``custom_allreduce.csv``: vLLM's kernel on
  2-8 H100s fit, TensorRT-LLM's kernels held out), shared by every GPU with NVLink;
- a report of every decode-dominated row (:func:`decode_report`): batch-1 decode steps (gpt-fast
  on an A100), static batches of 1-8 (NeMo's Llama-2 table), LMDeploy's median decode steps at
  batches 1-64 (A100) and the throughput tables, with the median |error| per batch band and
  split (:func:`band_report`), the rows the per-query-head kernel moved (:func:`moved_rows`)
  and the grouped-query / multi-head split of the long-output rows (:func:`head_split_report`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from sim.costs.roofline import ELEMENTWISE_OPS, GEMM_OPS, RooflineCost, RooflineParams
from sim.costs.roofline_params import mean_terms

PROFILE_MODELS = {"Llama-2-7b-hf": "llama-2-7b", "Llama-2-70b-hf": "llama-2-70b",
                  "Meta-Llama-3-8B": "llama-3.1-8b"}  # Llama-3-8B = Llama-3.1-8B's architecture
FIT = {"a100": ["Llama-2-7b-hf", "Meta-Llama-3-8B"], "h100": ["Llama-2-7b-hf"]}
HELD_OUT = {"a100": ["Llama-2-70b-hf"], "h100": ["Llama-2-70b-hf"]}
OPS = GEMM_OPS + ELEMENTWISE_OPS


def load_profiles() -> pd.DataFrame:
    """Long table: gpu, model, tensor_parallel, num_tokens, op, measured_s."""
    frames = []
    folder = resources.files("sim").joinpath("data/profiles")
    for f in folder.iterdir():
        name = f.name
        if not name.endswith("_layer_ms.csv"):
            continue
        _, gpu, rest = name.split("_", 2)
        model = rest[: -len("_layer_ms.csv")]
        with f.open() as fh:
            d = pd.read_csv(fh)
        long = d.melt(id_vars=["tensor_parallel", "num_tokens"],
                      value_vars=[f"{op}_ms" for op in OPS], var_name="op", value_name="ms")
        long["op"] = long["op"].str[:-3]
        long["gpu"], long["model"] = gpu, model
        frames.append(long)
    df = pd.concat(frames, ignore_index=True)
    df["measured_s"] = df.pop("ms") * 1e-3
    return df[df["measured_s"] > 0].reset_index(drop=True)


def _work(df) -> pd.DataFrame:
    """Attach FLOPs and bytes per row (independent of the efficiencies)."""
    parts = []
    for (gpu, model, tp), g in df.groupby(["gpu", "model", "tensor_parallel"]):
        cost = RooflineCost(PROFILE_MODELS[model], gpu, tensor_parallel=int(tp))
        work = cost.op_work(g["num_tokens"].to_numpy(dtype=np.float64))
        g = g.copy()
        g["flops"] = [float(np.broadcast_to(work[op][0], (len(g),))[i]) for i, op in
                      enumerate(g["op"])]
        g["bytes"] = [float(work[op][1][i]) for i, op in enumerate(g["op"])]
        g["peak"], g["bw"] = cost.peak, cost.bw
        parts.append(g)
    return pd.concat(parts)


def predict(w: pd.DataFrame, p: RooflineParams) -> np.ndarray:
    flops, nbytes = w["flops"].to_numpy(), w["bytes"].to_numpy()
    peak, bw = w["peak"].to_numpy(), w["bw"].to_numpy()
    is_gemm = w["op"].isin(GEMM_OPS).to_numpy()
    eff = np.where(is_gemm, p.gemm_memory_eff,
                   w["op"].map(lambda op: p.elementwise_eff.get(op, 1.0)).to_numpy())
    t = np.maximum(nbytes / (bw * eff), p.kernel_floor_s)
    return np.where(is_gemm, np.maximum(t, flops / (peak * p.gemm_compute_eff)) + p.gemm_latency_s,
                    t)


def _mal(pred, meas):
    return float(np.mean(np.abs(np.log(pred / meas))))


def fit_gpu(w: pd.DataFrame) -> RooflineParams:
    g = w[w["op"].isin(GEMM_OPS)]
    flops, nbytes, meas = g["flops"].to_numpy(), g["bytes"].to_numpy(), g["measured_s"].to_numpy()
    peak, bw = g["peak"].to_numpy(), g["bw"].to_numpy()
    grid = np.arange(0.30, 1.001, 0.01)
    best = (np.inf, None, None, None)
    for t0 in np.arange(0.0, 15.01e-6, 1e-6):
        for ce in grid:
            tc = flops / (peak * ce)
            for me in grid:
                err = _mal(np.maximum(tc, nbytes / (bw * me)) + t0, meas)
                if err < best[0]:
                    best = (err, ce, me, t0)
    _, ce, me, t0 = best
    best_total, chosen = np.inf, None
    for floor in np.arange(1e-6, 8.01e-6, 0.5e-6):
        effs, total = {}, 0.0
        for op in ELEMENTWISE_OPS:
            e = w[w["op"] == op]
            b, bw_, m = e["bytes"].to_numpy(), e["bw"].to_numpy(), e["measured_s"].to_numpy()
            errs = [(_mal(np.maximum(b / (bw_ * x), floor), m), x) for x in np.arange(0.05, 1.001, 0.01)]
            err, effs[op] = min(errs)
            total += err
        if total < best_total:
            best_total, chosen = total, (floor, effs)
    floor, effs = chosen
    return RooflineParams(gemm_compute_eff=round(float(ce), 3), gemm_memory_eff=round(float(me), 3),
                          gemm_latency_s=float(t0),
                          elementwise_eff={k: round(float(v), 3) for k, v in effs.items()},
                          kernel_floor_s=float(floor))


def report(w: pd.DataFrame, params: dict) -> pd.DataFrame:
    rows = []
    for gpu, g in w.groupby("gpu"):
        pred = predict(g, params[gpu])
        g = g.assign(pred=pred, ape=np.abs(pred / g["measured_s"].to_numpy() - 1) * 100)
        for model, gm in g.groupby("model"):
            split = "held-out" if model in HELD_OUT[gpu] else "fit"
            fams = {"gemm": gm[gm["op"].isin(GEMM_OPS)],
                    "elementwise": gm[gm["op"].isin(ELEMENTWISE_OPS)]}
            layer = gm.groupby(["tensor_parallel", "num_tokens"])[["pred", "measured_s"]].sum()
            layer_ape = np.abs(layer["pred"] / layer["measured_s"] - 1) * 100
            for fam, f in fams.items():
                rows.append((gpu, model, split, fam, len(f), f["ape"].median(),
                             f["ape"].quantile(0.9)))
            rows.append((gpu, model, split, "layer total", len(layer), layer_ape.median(),
                         layer_ape.quantile(0.9)))
    return pd.DataFrame(rows, columns=["gpu", "model", "split", "family", "points",
                                       "median_ape_pct", "p90_ape_pct"])


def fit_all():
    """Per GPU the kernel fit (:func:`fit_gpu`) with the prefill attention's efficiency curve
    (:func:`fit_attention`); and the per-op report."""
    w = _work(load_profiles())
    attention = fit_attention()
    params = {}
    for gpu in FIT:
        params[gpu] = dataclasses.replace(
            fit_gpu(w[(w["gpu"] == gpu) & w["model"].isin(FIT[gpu])]), **attention[gpu])
    return params, report(w, params)


DATA = resources.files("sim").joinpath("data")
# the prefill attention kernel each GPU's engines run (vLLM and SGLang use FlashAttention-3 on
# Hopper): its published forward benchmarks fit the roofline's prefill attention efficiency
ATTENTION_KERNEL = {"a100": "flashattention-2", "h100": "flashattention-3"}
# the curve's terms per attention dtype (FP8: at the FP8 peak, over an fp8 KV cache)
ATTENTION_TERMS = {"fp16": ("attn_prefill_compute_eff", "attn_prefill_half_tokens"),
                   "fp8": ("attn_prefill_fp8_compute_eff", "attn_prefill_fp8_half_tokens")}


def load_attention() -> pd.DataFrame:
    """``sim/data/attention_kernels.csv`` with, per row, the causal FLOPs as the roofline counts
    them (queries are the last ``seqlen_q`` of ``seqlen_kv`` keys: ``4 b h d c (p + c/2)``), the
    context ``L = seqlen_kv`` and the measured seconds (``time_ms``, else the published TFLOP/s
    over FlashAttention's own count, ``2 b h d s_q s_kv``)."""
    with DATA.joinpath("attention_kernels.csv").open() as f:
        d = pd.read_csv(f)
    if not d["causal"].all():
        raise ValueError("attention_kernels.csv: only causal rows describe a prefill")
    c, bhd = d["seqlen_q"], d["batch_size"] * d["num_heads"] * d["head_dim"]
    d["flops"] = 4.0 * bhd * c * (d["seqlen_kv"] - c + c / 2)
    published = 2.0 * bhd * d["seqlen_q"] * d["seqlen_kv"] / (d["tflops"] * 1e12)
    d["measured_s"] = np.where(d["time_ms"].notna(), d["time_ms"] * 1e-3, published)
    d["peak"] = [RooflineCost("llama-2-7b", g).peak_fp16 if t == "fp16" else
                 RooflineCost("llama-2-7b", g, weight_dtype=t).peak
                 for g, t in zip(d["gpu"], d["dtype"])]
    return d


def _attention_time(d, eff, half):
    L = d["seqlen_kv"].to_numpy(dtype=float)
    return d["flops"].to_numpy() / (d["peak"].to_numpy() * eff * L / (L + half))


def fit_attention() -> dict:
    """Per GPU ``attn_prefill_compute_eff`` and ``attn_prefill_half_tokens`` minimising the
    squared log error of the *fit* rows of its kernel (for each half-saturation context on a
    16-token grid the best plateau is closed-form: the geometric mean of the ratios)."""
    d = load_attention()
    out = {}
    for gpu, kernel in ATTENTION_KERNEL.items():
        out[gpu] = {}
        for dtype, terms in ATTENTION_TERMS.items():
            g = d[(d["gpu"] == gpu) & (d["kernel"] == kernel) & (d["split"] == "fit")
                  & (d["dtype"] == dtype)]
            if g.empty:  # no published FP8 forward of this GPU's kernel: the fp16 curve
                continue
            best = (np.inf, None, None)
            for half in np.arange(0.0, 8192.1, 16.0):
                r = np.log(_attention_time(g, 1.0, half) / g["measured_s"].to_numpy())
                eff = float(np.exp(r.mean()))  # time scales as 1 / eff
                err = float(np.sum((r - np.log(eff)) ** 2))
                if err < best[0] and eff <= 1:
                    best = (err, round(eff, 3), float(half))
            out[gpu].update(zip(terms, best[1:]))
    return out


def _attention_terms(p: RooflineParams, dtype: str):
    """``(eff, half)`` of the prefill attention curve of ``dtype`` in ``p``."""
    eff_name, half_name = ATTENTION_TERMS[dtype]
    return getattr(p, eff_name), getattr(p, half_name)


def attention_report(params: dict) -> pd.DataFrame:
    """Every row of ``attention_kernels.csv`` for a GPU in ``params``: measured and predicted
    TFLOP/s (FlashAttention's count) and the signed error of the predicted time."""
    d = load_attention()
    d = d[d["gpu"].isin(list(params))].copy()
    groups = list(d.groupby(["gpu", "dtype"], sort=False))
    pred = np.concatenate([_attention_time(g, *_attention_terms(params[gpu], dtype))
                           for (gpu, dtype), g in groups])
    d = pd.concat([g for _, g in groups])
    fa_flops = 2.0 * d["batch_size"] * d["num_heads"] * d["head_dim"] * d["seqlen_q"] \
        * d["seqlen_kv"]
    d["measured_tflops"] = fa_flops / d["measured_s"] / 1e12
    d["predicted_tflops"] = fa_flops / pred / 1e12
    d["error_pct"] = (pred / d["measured_s"] - 1) * 100
    return d[["gpu", "kernel", "dtype", "head_dim", "num_kv_heads", "batch_size", "seqlen_q",
              "seqlen_kv",
              "split", "measured_tflops", "predicted_tflops", "error_pct"]].reset_index(drop=True)
# Sustained HBM bandwidth stays below peak (75-95 % in STREAM-like measurements, see
# sim/data/profiles/README.md): a fitted memory efficiency is capped here.
MAX_BANDWIDTH_EFF = 0.95
CPU_PHASES = ("schedule_ms", "sampler_ms", "prepare_inputs_ms", "process_outputs_ms")


def _ape(pred, meas):
    return np.abs(np.asarray(pred) / np.asarray(meas) - 1) * 100


def fit_cpu_overheads():
    """``(intercept_s, per_seq_s, report)``: least-squares line of vLLM's CPU time per
    iteration against batch size on the fit rows; the report has the held-out error."""
    with DATA.joinpath("cpu_overheads.csv").open() as f:
        d = pd.read_csv(f)
    d["total_s"] = d[list(CPU_PHASES)].sum(axis=1) * 1e-3
    fit = d[d["split"] == "fit"]
    slope, intercept = np.polyfit(fit["batch_size"], fit["total_s"], 1)
    if slope < 0 or intercept < 0:
        raise ValueError(f"CPU overhead fit is not physical: {intercept} + {slope} x batch")
    d["pred_s"] = intercept + slope * d["batch_size"]
    rep = [(split, len(g), float(np.median(_ape(g["pred_s"], g["total_s"]))))
           for split, g in d.groupby("split")]
    return float(intercept), float(slope), pd.DataFrame(rep, columns=["split", "points",
                                                                      "median_ape_pct"])


def load_latency() -> pd.DataFrame:
    with DATA.joinpath("published_latency.csv").open() as f:
        return pd.read_csv(f)


def measured_graph_saving(lat: pd.DataFrame) -> float:
    """Seconds per layer per decode step that replaying a CUDA graph saves (eager - graph)."""
    e = lat[lat["metric"] == "e2e"].set_index("engine")
    eager, graph = e.loc["vllm-0.2-eager"], e.loc["vllm-0.2-cuda-graph"]
    from sim.specs.models import get_model
    layers = get_model(eager["model"]).num_hidden_layers
    steps = int(eager["output_tokens"]) - 1  # the prefill runs eagerly in both
    return (eager["value"] - graph["value"]) * 1e-3 / steps / layers


def _cost(r, params):
    group = getattr(r, "weight_group_size", None)
    if group == group and group:  # a published int4 group size (not NaN)
        params = dataclasses.replace(params, int4_group_size=int(group))
    return RooflineCost(r.model, r.gpu, tensor_parallel=int(r.tensor_parallel),
                        weight_dtype=r.weight_dtype, kv_dtype=r.kv_dtype, params=params)


# engines that run a bare generation loop (no scheduler, CUDA graphs replayed without a host
# sync): no per-iteration CPU cost
BARE_LOOP_ENGINES = ("gpt-fast",)
# engines whose published runs all-reduce through NCCL only: TensorRT-LLM 0.5/0.6.1's benchmark
# engines are built without --use_custom_all_reduce (docs/source/performance.md's build
# commands), NeMo's table names no option (the default: off), LMDeploy 0.1's TurboMind had only
# NCCL. gpt-fast runs PyTorch's intra-node one-shot all-reduce (its README: ENABLE_INTRA_NODE_COMM=1)
NCCL_ONLY_ENGINES = ("tensorrt-llm-0.5", "tensorrt-llm-0.6.1", "nemo-tensorrt-llm",
                     "lmdeploy-0.1-turbomind")
# engines whose prefill attention over an fp8 KV cache runs in fp16: TensorRT-LLM 0.5/0.6.1's
# documented FP8 builds (docs/source/performance.md) pass --use_gpt_attention_plugin float16
# --enable_context_fmha with --fp8_kv_cache and no FP8 context attention; 0.7a's H200 blog
# gives no build command, taken to be the same (and 0.6a's, the XQA blog's run without XQA)
FP16_ATTENTION_ENGINES = ("tensorrt-llm-0.5", "tensorrt-llm-0.6a", "tensorrt-llm-0.6.1",
                          "tensorrt-llm-0.7a")
# engines whose published decode ran on a generation attention kernel that is not group-aware
# (TensorRT-LLM's masked MHA, one thread block per query head, before XQA): priced with the
# fitted attn_decode_reread_fraction. From the sources only:
# - 0.6a: the XQA blog's "w/o XQA" run (docs/source/blogs/XQA-kernel.md @ 585c7565: Llama-70B,
#   one H200, 128/2,048, 1,227 tok/s/GPU against 2,941 with XQA); Falcon180B-H200.md @ 3c44cb97
#   shows the same 2.4x as "v0.7a vs v0.6a ... 1xH200 TP1, FP8, BS 192";
# - 0.5: Falcon180B-H200.md: "TensorRT-LLM has improved its Group Query Attention (GQA) kernels,
#   in the generation phase, providing up to 2.4x improvement on Llama-70B over TensorRT-LLM v0.5";
# - 0.6.1 (performance.md @ 138f96d4 and 77d24b5f): the release notes (release-notes.md @
#   001eaece) first list "MMHA optimization for MQA and GQA" and "FP8 KV cache support for XQA
#   kernel" under 0.7.1, the first release after 0.6.1.
# Not marked: 0.7a (its Llama-70B 128/2,048 row, 2,941, is the XQA blog's "w/ XQA" figure); NeMo
# and gpt-fast's multi-head or batch-1 rows (nothing to re-read, or a ~200-token context);
# LMDeploy 0.1's TurboMind, whose decoder attention takes 4 query heads of a group per thread
# block (lmdeploy @ 08ecad80 decoder_multihead_attention.cu: HeadPerCta = 4 when G % 4 == 0), so
# Llama-2-70B's KV heads are read twice, not 8 times (that it is the kernel of v0.1.0a1 is not
# established from the stored sources)
PER_HEAD_DECODE_ENGINES = ("tensorrt-llm-0.5", "tensorrt-llm-0.6a", "tensorrt-llm-0.6.1")
# engines whose tensor-parallel Falcon and GPT-J layers all-reduce the attention and the MLP
# outputs separately (parallel_block_allreduces 2, where the roofline's default sums them and
# reduces once): TensorRT-LLM's FalconDecoderLayer and GPTJDecoderLayer before 0.7.1
# (tensorrt_llm/models/falcon/model.py and gptj/model.py @ 027cd518) hand tp_group to both the
# Attention and the MLP, whose output projections are RowLinears that each all-reduce
# (layers/linear.py, layers/mlp.py); the release notes (release-notes.md @ 001eaece) list
# "Optimize AllReduce for parallel attention on Falcon and GPT-J" under 0.7.1, the first release
# after 0.6.1, and falcon/model.py from then on (e.g. @ 585c7565) passes tp_group=None to both
# ("Not to apply allreduce inside the Attention/MLP layers") and reduces their sum once. 0.6a is
# an alpha of 0.6; 0.7a's rows (Llama only) are not affected either way. Not fitted: a count
SEPARATE_REDUCE_ENGINES = ("tensorrt-llm-0.5", "tensorrt-llm-0.6a", "tensorrt-llm-0.6.1")
# the fit of attn_decode_reread_fraction: the same run without and with XQA (one ratio)
XQA_PAIR = ("tensorrt-llm-0.6a", "tensorrt-llm-0.7a")
DECODE_METRICS = ("step", "latency")


def predict_published(rows: pd.DataFrame, params: RooflineParams, *,
                      reread: float = 0.0, separate_reduce: bool = True) -> np.ndarray:
    """Each row's metric in its unit: ``ttft`` (ms) is one prefill iteration of a batch-1
    prompt; ``throughput`` (output tok/s) is a static batch as TensorRT-LLM's benchmark runs
    it: one prefill iteration of the whole batch, then ``output_tokens - 1`` decode steps over
    a growing context. Those steps are priced without the per-layer launch gaps (their kernels
    at these batch sizes outlast their launches), the prefills with them. ``latency`` (ms) is
    the same static batch's duration; ``step`` (ms) its mean decode step. A bare-loop engine
    (:data:`BARE_LOOP_ENGINES`) pays no per-iteration CPU cost; an engine of
    :data:`NCCL_ONLY_ENGINES` no custom all-reduce, one of :data:`FP16_ATTENTION_ENGINES` no FP8
    prefill attention, one of :data:`PER_HEAD_DECODE_ENGINES` decode attention that re-reads
    a KV head per query head, ``reread`` of the re-reads from HBM
    (``attn_decode_reread_fraction``); with ``separate_reduce`` one of
    :data:`SEPARATE_REDUCE_ENGINES` two all-reduces per parallel attention+MLP layer
    (``parallel_block_allreduces``; False: the default one); an ``int4`` row with a
    ``weight_group_size`` reads that group size's scales and zeros. ``tok/s/gpu`` is the
    throughput over the tensor-parallel GPUs."""
    from sim.engine.core.batch import Batch
    out = []
    for r in rows.itertuples():
        b, n, o = int(r.batch_size), int(r.input_tokens), int(r.output_tokens)
        p = params if r.engine not in BARE_LOOP_ENGINES else dataclasses.replace(
            params, overhead_s=0.0, overhead_per_seq_s=0.0)
        if r.engine in NCCL_ONLY_ENGINES:
            p = dataclasses.replace(p, custom_allreduce_max_bytes=0)
        if r.engine in FP16_ATTENTION_ENGINES:
            p = dataclasses.replace(p, attn_prefill_fp8_compute_eff=None)
        if r.engine in PER_HEAD_DECODE_ENGINES and reread:
            p = dataclasses.replace(p, attn_decode_reread_fraction=reread)
        if r.engine in SEPARATE_REDUCE_ENGINES and separate_reduce:
            p = dataclasses.replace(p, parallel_block_allreduces=2)
        if r.metric == "ttft":
            out.append(_cost(r, p)(Batch(0, [(n, 0)] * b, b * n, 0, 0)) * 1e3)
            continue
        cost = _cost(r, dataclasses.replace(p, cuda_graph_max_batch=1 << 30))
        steps = sum(cost(Batch(0, (), 0, b, b * (n + k))) for k in range(1, o))
        if r.metric == "step":
            out.append(steps / (o - 1) * 1e3)
            continue
        t = cost(Batch(0, [(n, 0)] * b, b * n, 0, 0)) + steps
        per = int(r.tensor_parallel) if r.unit == "tok/s/gpu" else 1
        out.append(t * 1e3 if r.metric == "latency" else b * o / t / per)
    return np.array(out)


def unfitted_params(params: dict) -> RooflineParams:
    """What the roofline gives a GPU without fitted terms (an H200): term by term the mean of
    ``params`` over the fitted GPUs (:func:`sim.costs.roofline_params.mean_terms`, as
    :func:`~sim.costs.roofline_params.fitted_params` does from the shipped file)."""
    return RooflineParams(**mean_terms([_fitted_terms(p) for p in params.values()]))


def _fitted_terms(p: RooflineParams) -> dict:
    """``p``'s terms, less an FP8 attention curve's saturation where it has no FP8 curve."""
    terms = dataclasses.asdict(p)
    if terms["attn_prefill_fp8_compute_eff"] is None:
        del terms["attn_prefill_fp8_half_tokens"]
    return terms


def fit_per_head_decode(params: dict) -> tuple:
    """``(attn_decode_reread_fraction, report)``: the fraction of a grouped-query KV head's
    re-reads that a per-query-head decode kernel takes from HBM, fitted to one published ratio,
    :data:`XQA_PAIR`: the same static batch (Llama-2-70B, one H200, batch 192, 128/2,048, FP8)
    without and with XQA. The fraction ``f`` (bisection on [0, 1], rounded to 3 decimals) makes
    the predicted time of the run without XQA over the one with it the published throughput
    ratio; both are priced alike (``params`` per GPU, the H200 with :func:`unfitted_params`)
    except the kernel. Raises ``ValueError`` if even ``f = 1`` (every query head from HBM)
    falls short of the ratio."""
    lat = load_latency()
    setting = ["metric", "gpu", "model", "tensor_parallel", "weight_dtype", "kv_dtype",
               "batch_size", "input_tokens", "output_tokens", "unit"]
    without = lat[lat["engine"] == XQA_PAIR[0]]
    with_ = lat[lat["engine"] == XQA_PAIR[1]].merge(without[setting], on=setting)
    if len(without) != 1 or len(with_) != 1:
        raise ValueError(f"published_latency.csv: expected one {XQA_PAIR[0]} row and one "
                         f"{XQA_PAIR[1]} row of the same setting ({setting})")
    gpu = without["gpu"].iloc[0]
    p = params.get(gpu) or unfitted_params(params)
    target = float(with_["value"].iloc[0] / without["value"].iloc[0])  # time without / with
    base = float(predict_published(with_, p)[0])  # throughput: the time's inverse

    def ratio(f):
        return base / float(predict_published(without, p, reread=f)[0])
    if ratio(1.0) < target:
        raise ValueError(f"even attn_decode_reread_fraction 1 predicts a ratio of {ratio(1.0):.3f} "
                         f"where {XQA_PAIR} measured {target:.3f}")
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if ratio(mid) < target else (lo, mid)
    f = round(0.5 * (lo + hi), 3)
    cost = RooflineCost(without["model"].iloc[0], gpu,
                        tensor_parallel=int(without["tensor_parallel"].iloc[0]),
                        params=dataclasses.replace(p, attn_decode_reread_fraction=f))
    return f, {"engines": list(PER_HEAD_DECODE_ENGINES), "pair": list(XQA_PAIR),
               "measured_ratio": round(target, 4), "predicted_ratio": round(ratio(f), 4),
               "query_group_size": cost.query_group_size,
               "decode_kv_reads": round(cost.decode_kv_reads, 4)}


def decode_report(params: dict, reread: float | None = None, *,
                  separate_reduce: bool = True) -> pd.DataFrame:
    """Every decode-dominated row of ``published_latency.csv`` (``step``, ``latency``,
    ``throughput``) with its split, predicted with the fitted ``params`` per GPU (a GPU without
    them, the H200, with :func:`unfitted_params`: its rows are held out, but for the XQA pair's
    run without XQA, the fit of :func:`fit_per_head_decode`), the engines of
    :data:`PER_HEAD_DECODE_ENGINES` with ``reread`` (None: that fit's value) and those of
    :data:`SEPARATE_REDUCE_ENGINES` with ``separate_reduce`` (:func:`predict_published`)."""
    if reread is None:
        reread = fit_per_head_decode(params)[0]
    lat = load_latency()
    rows = lat[lat["metric"].isin(DECODE_METRICS + ("throughput",))]
    parts = [g.assign(predicted=predict_published(g, params.get(gpu) or unfitted_params(params),
                                                  reread=reread, separate_reduce=separate_reduce))
             for gpu, g in rows.groupby("gpu", sort=False)]
    d = pd.concat(parts)
    d["error_pct"] = (d["predicted"] / d["value"] - 1) * 100
    if "throughput" in set(d["metric"]):  # a throughput too high is a step too fast
        thr = d["metric"] == "throughput"
        d.loc[thr, "error_pct"] = (d.loc[thr, "value"] / d.loc[thr, "predicted"] - 1) * 100
    return d[["metric", "engine", "gpu", "model", "tensor_parallel", "weight_dtype",
              "batch_size", "input_tokens", "output_tokens", "split", "value", "predicted",
              "error_pct"]].reset_index(drop=True)


def separate_reduce_report(params: dict, reread: float) -> pd.DataFrame:
    """The rows that :data:`SEPARATE_REDUCE_ENGINES`' separate all-reduces move (first tokens
    and decode-dominated rows of a parallel attention+MLP model at TP > 1): the signed error of
    the time (a first token or a step too slow > 0; a throughput row's measured / predicted - 1)
    with the default one all-reduce per layer, ``error_one_pct``, and with two, ``error_pct``."""
    from sim.specs.models import get_model
    lat = load_latency()
    rows = lat[lat["metric"].isin(("ttft", "throughput") + DECODE_METRICS)
               & lat["engine"].isin(SEPARATE_REDUCE_ENGINES) & (lat["tensor_parallel"] > 1)
               & np.array([get_model(m).parallel_attn for m in lat["model"]])]
    out = []
    for gpu, g in rows.groupby("gpu", sort=False):
        p = params.get(gpu) or unfitted_params(params)
        one, two = (predict_published(g, p, reread=reread, separate_reduce=s) for s in (False,
                                                                                        True))
        thr = (g["metric"] == "throughput").to_numpy()
        meas = g["value"].to_numpy()
        out.append(g.assign(predicted=two,
                            error_one_pct=np.where(thr, meas / one, one / meas) * 100 - 100,
                            error_pct=np.where(thr, meas / two, two / meas) * 100 - 100))
    d = pd.concat(out)
    return d[["metric", "engine", "gpu", "model", "tensor_parallel", "batch_size",
              "input_tokens", "output_tokens", "split", "value", "predicted", "error_one_pct",
              "error_pct"]].reset_index(drop=True)


# decode batch bands: the issue's bar names 1-8, 16-32 and 128-256 ("decode steps at batch
# 1-256 within 10 % median"); the rows between and above get bands of their own, and the
# whole range the bar names a row of its own (last)
BATCH_BANDS = ((1, 8), (16, 32), (33, 127), (128, 256), (257, 1 << 20), (1, 256))


def band_report(decode: pd.DataFrame) -> pd.DataFrame:
    """Median and worst error of :func:`decode_report`'s rows per batch band and split (a band
    without published rows: 0 points, NaN errors)."""
    out = []
    for lo, hi in BATCH_BANDS:
        name = f"{lo}-{hi}" if hi < 1 << 20 else f">{lo - 1}"
        band = decode[decode["batch_size"].between(lo, hi)]
        for split in ("fit", "held-out"):
            e = band.loc[band["split"] == split, "error_pct"].to_numpy()
            out.append((name, split, len(e), float(np.median(np.abs(e))) if len(e) else np.nan,
                        float(e[np.argmax(np.abs(e))]) if len(e) else np.nan))
    return pd.DataFrame(out, columns=["batch", "split", "points", "median_abs_error_pct",
                                      "worst_error_pct"])


def moved_rows(before: pd.DataFrame, after: pd.DataFrame) -> pd.DataFrame:
    """The rows of two :func:`decode_report` s whose prediction differs, with both errors."""
    keys = ["engine", "gpu", "model", "tensor_parallel", "batch_size", "input_tokens",
            "output_tokens", "split", "value"]
    moved = before["predicted"].to_numpy() != after["predicted"].to_numpy()
    return before.loc[moved, keys].assign(
        error_before_pct=before.loc[moved, "error_pct"],
        error_pct=after.loc[moved, "error_pct"]).reset_index(drop=True)


def head_split_report(before: pd.DataFrame, after: pd.DataFrame,
                      min_output_tokens: int = 2048) -> pd.DataFrame:
    """Throughput rows of :func:`decode_report` with at least ``min_output_tokens`` outputs, by
    attention (grouped-query or multi-head) and split: rows, median |error| and the signed
    error range, before and after (two reports of the same rows)."""
    from sim.specs.models import get_model
    thr = (before["metric"] == "throughput") & (before["output_tokens"] >= min_output_tokens)
    gqa = np.array([get_model(m).num_key_value_heads < get_model(m).num_attention_heads
                    for m in before["model"]])
    out = []
    for name, sel in (("grouped-query", gqa), ("multi-head", ~gqa)):
        for split in ("fit", "held-out"):
            m = thr.to_numpy() & sel & (before["split"] == split).to_numpy()
            if not m.any():
                continue
            b, a = before["error_pct"].to_numpy()[m], after["error_pct"].to_numpy()[m]
            out.append((name, split, int(m.sum()), float(np.median(np.abs(b))),
                        float(np.median(np.abs(a))), float(a.min()), float(a.max())))
    return pd.DataFrame(out, columns=["attention", "split", "points", "median_abs_before_pct",
                                      "median_abs_error_pct", "min_error_pct", "max_error_pct"])


def _log_err(rows, params):
    return float(np.sum(np.log(predict_published(rows, params) / rows["value"].to_numpy()) ** 2))


def fit_latency(params: dict, shared: dict):
    """Per GPU, fitted on the *fit* rows: ``eager_layer_overhead_s`` (and where the rows run
    fp8 GEMMs ``fp8_gemm_compute_eff``) to the first-token latencies, then
    ``attn_decode_memory_eff`` to the decode-heavy throughputs and decode steps; then, with
    those, the per-query-head decode kernel's re-read fraction (:func:`fit_per_head_decode`);
    and the report of every first-token and throughput row. Returns ``(fitted, report,
    (reread, per_head_report))``."""
    lat = load_latency()
    rows = lat[lat["metric"].isin(["ttft", "throughput"]) & lat["gpu"].isin(list(params))]
    fitted, reports = {}, []
    groups = list(rows.groupby("gpu"))
    for gpu, g in groups:
        base = dataclasses.replace(params[gpu], **shared)
        fit = g[(g["split"] == "fit") & (g["metric"] == "ttft")]
        meas = fit["value"].to_numpy()
        layers = np.array([RooflineCost(m, gpu).model.num_hidden_layers for m in fit["model"]])
        uses_fp8 = bool((fit["weight_dtype"] == "fp8").any())
        best = (np.inf, None, None)
        for eff in (np.arange(0.20, 1.001, 0.01) if uses_fp8 else [None]):
            p = dataclasses.replace(base, fp8_gemm_compute_eff=None if eff is None
                                    else round(float(eff), 2))
            t0 = predict_published(fit, p)
            for x in np.arange(0.0, 300.01e-6, 0.5e-6):
                err = float(np.sum(np.log((t0 + layers * x * 1e3) / meas) ** 2))
                if err < best[0]:
                    best = (err, p.fp8_gemm_compute_eff, round(float(x), 7))
        _, eff, x = best
        fitted[gpu] = {"eager_layer_overhead_s": x}
        if eff is not None:
            fitted[gpu]["fp8_gemm_compute_eff"] = eff
        p = dataclasses.replace(base, **fitted[gpu])
        thr = lat[(lat["gpu"] == gpu) & (lat["split"] == "fit")
                  & lat["metric"].isin(["throughput", "step"])]
        _, dec = min((_log_err(thr, dataclasses.replace(p, attn_decode_memory_eff=e)), e)
                     for e in np.round(np.arange(0.50, MAX_BANDWIDTH_EFF + 1e-9, 0.01), 2))
        fitted[gpu]["attn_decode_memory_eff"] = float(dec)
    final = {gpu: dataclasses.replace(params[gpu], **shared, **fitted[gpu]) for gpu in fitted}
    reread, per_head = fit_per_head_decode(final)
    for gpu, g in groups:
        g = g.assign(predicted=predict_published(g, final[gpu], reread=reread),
                     before=predict_published(g, params[gpu], reread=reread))
        g["error_pct"] = (g["predicted"] / g["value"] - 1) * 100
        g["error_before_pct"] = (g["before"] / g["value"] - 1) * 100
        reports.append(g)
    cols = ["metric", "unit", "gpu", "model", "tensor_parallel", "weight_dtype", "batch_size",
            "input_tokens", "output_tokens", "split", "value", "predicted", "error_pct",
            "error_before_pct"]
    return fitted, pd.concat(reports)[cols].reset_index(drop=True), (reread, per_head)


# vLLM's CustomAllreduce serves messages up to its max_size, 8 MiB by default
# (vllm/distributed/device_communicators/custom_all_reduce.py)
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 1024 * 1024


def load_custom_allreduce() -> pd.DataFrame:
    with DATA.joinpath("custom_allreduce.csv").open() as f:
        return pd.read_csv(f)


def _custom_ar_time(d, t0, rate):
    n, tp = d["size_bytes"].to_numpy(float), d["num_workers"].to_numpy(float)
    return np.minimum(t0 + (tp - 1) * n / rate, 2 * t0 + 2 * (tp - 1) / tp * n / rate)


def fit_custom_allreduce():
    """``(params, report)``: the stage latency and bytes/s of the custom all-reduce's closed
    form (:meth:`RooflineCost.custom_allreduce_time`) minimising the squared log error of the
    *fit* rows of ``custom_allreduce.csv`` (vLLM's kernel on 2-8 H100s, 512 B-1 MiB); the
    held-out rows are another kernel (TensorRT-LLM's one-/two-shot, as SGLang ships it)."""
    d = load_custom_allreduce()
    fit = d[d["split"] == "fit"]
    meas = fit["latency_us"].to_numpy() * 1e-6
    best = (np.inf, None, None)
    for t0 in np.arange(0.5e-6, 20.01e-6, 0.1e-6):
        for rate in np.arange(10e9, 400.1e9, 1e9):
            err = float(np.sum(np.log(_custom_ar_time(fit, t0, rate) / meas) ** 2))
            if err < best[0]:
                best = (err, round(float(t0), 8), float(rate))
    _, t0, rate = best
    d["predicted_us"] = _custom_ar_time(d, t0, rate) * 1e6
    d["error_pct"] = (d["predicted_us"] / d["latency_us"] - 1) * 100
    rep = [(k, split, len(g), float(np.median(np.abs(g["error_pct"]))),
            float(g["error_pct"].to_numpy()[np.argmax(np.abs(g["error_pct"].to_numpy()))]))
           for (k, split), g in d.groupby(["kernel", "split"])]
    return ({"custom_allreduce_max_bytes": CUSTOM_ALLREDUCE_MAX_BYTES,
             "custom_allreduce_latency_s": t0, "custom_allreduce_bytes_per_s": rate},
            pd.DataFrame(rep, columns=["kernel", "split", "points", "median_abs_error_pct",
                                       "worst_error_pct"]))


def fit_fixed_costs(params: dict):
    """Everything after the kernel fit: ``(shared, per_gpu, synchronous_cpu, cpu_report,
    latency_report, cross_checks, per_head_decode)`` (see the module docstring;
    ``per_head_decode``: ``(attn_decode_reread_fraction, report)`` of a decode kernel that is
    not group-aware, :func:`fit_per_head_decode`)."""
    intercept, slope, cpu_rep = fit_cpu_overheads()
    custom_ar, _ = fit_custom_allreduce()
    shared = {"overhead_s": round(intercept, 7), **custom_ar}
    per_gpu, lat_rep, per_head = fit_latency(params, shared)
    checks = {"graph_saving_per_layer_s (vLLM #1440)": round(
        measured_graph_saving(load_latency()), 7)}
    return shared, per_gpu, {"overhead_s": round(intercept, 7),
                             "overhead_per_seq_s": round(slope, 8)}, cpu_rep, lat_rep, checks, \
        per_head


SHIPPED = Path(__file__).resolve().parents[1] / "sim" / "data" / "roofline_fit.json"


def document(params, rep, fixed) -> dict:
    """The JSON document of a fit: ``params`` and ``rep`` from :func:`fit_all`, ``fixed`` from
    :func:`fit_fixed_costs`."""
    shared, per_gpu, sync_cpu, cpu_rep, lat_rep, checks, (reread, per_head) = fixed
    decode = decode_report(final_params(params, fixed), reread)
    return {"source": "experiments/fit_roofline.py on sim/data/profiles (Vidur, MIT), "
                      "sim/data/attention_kernels.csv, sim/data/cpu_overheads.csv, "
                      "sim/data/custom_allreduce.csv and sim/data/published_latency.csv",
            "fit_models": FIT, "held_out_models": HELD_OUT,
            "params": {g: {"gemm_compute_eff": p.gemm_compute_eff,
                           "gemm_memory_eff": p.gemm_memory_eff,
                           "gemm_latency_s": p.gemm_latency_s,
                           "elementwise_eff": p.elementwise_eff,
                           "kernel_floor_s": p.kernel_floor_s,
                           **{t: v for t, v in _fitted_terms(p).items()
                              if t.startswith("attn_prefill") and v is not None},
                           **per_gpu.get(g, {})}
                       for g, p in params.items()},
            "shared": shared, "synchronous_cpu": sync_cpu, "cross_checks": checks,
            "per_head_decode": {"params": {"attn_decode_reread_fraction": reread}, **per_head},
            "report": rep.round(2).to_dict(orient="records"),
            "attention_report": attention_report(params).round(2).to_dict(orient="records"),
            "cpu_overhead_report": cpu_rep.round(2).to_dict(orient="records"),
            "latency_report": lat_rep.round(2).to_dict(orient="records"),
            "decode_report": decode.round(2).to_dict(orient="records"),
            "decode_band_report": band_report(decode).dropna().round(2).to_dict(
                orient="records"),
            "separate_reduce_report": {
                "engines": list(SEPARATE_REDUCE_ENGINES),
                "rows": separate_reduce_report(final_params(params, fixed), reread).round(
                    2).to_dict(orient="records")},
            "custom_allreduce_report": fit_custom_allreduce()[1].round(2).to_dict(
                orient="records")}


def final_params(params, fixed) -> dict:
    """Per GPU, the kernel fit with the fixed costs fitted after it (what the roofline ships)."""
    shared, per_gpu = fixed[0], fixed[1]
    return {g: dataclasses.replace(p, **shared, **per_gpu.get(g, {})) for g, p in params.items()}


def main(argv=None):
    """Fit and print the report; the fit is written only when asked (``--write``: the shipped
    ``sim/data/roofline_fit.json``, which the roofline reads; ``--output PATH``: elsewhere)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true",
                    help=f"overwrite the shipped fit, {SHIPPED.relative_to(SHIPPED.parents[2])} "
                         f"(default: print only)")
    ap.add_argument("--output", default=None, metavar="PATH",
                    help="write the fit to this file instead (default: none)")
    a = ap.parse_args(argv)
    params, rep = fit_all()
    fixed = fit_fixed_costs(params)
    target = a.output or (SHIPPED if a.write else None)
    if target is not None:
        Path(target).write_text(json.dumps(document(params, rep, fixed), indent=1) + "\n")
    _, _, _, cpu_rep, lat_rep, _, (reread, per_head) = fixed
    with pd.option_context("display.width", 160, "display.float_format", "{:.2f}".format):
        print(rep.to_string(index=False))
        print(cpu_rep.to_string(index=False))
        print(lat_rep.to_string(index=False))
        print(attention_report(params).to_string(index=False))
        dec = decode_report(final_params(params, fixed), reread)
        print(dec.to_string(index=False))
        print(band_report(dec).to_string(index=False))
        print(f"per-query-head decode (not group-aware): attn_decode_reread_fraction {reread}",
              per_head)
        group_aware = decode_report(final_params(params, fixed), 0.0)
        print("rows priced with it (error before: every kernel group-aware):")
        print(moved_rows(group_aware, dec).to_string(index=False))
        print("before:", band_report(group_aware).dropna().to_string(index=False))
        print(head_split_report(group_aware, dec).to_string(index=False))
        print("two all-reduces per parallel attention+MLP layer "
              f"({', '.join(SEPARATE_REDUCE_ENGINES)}): the rows they move")
        print(separate_reduce_report(final_params(params, fixed), reread).to_string(index=False))
        one = decode_report(final_params(params, fixed), reread, separate_reduce=False)
        print("before (one all-reduce):", band_report(one).dropna().to_string(index=False))
        print(fit_custom_allreduce()[1].to_string(index=False))
    for g, p in params.items():
        print(g, p)
    print(f"wrote {target}" if target is not None else
          f"not written (--write updates {SHIPPED.name}, --output PATH writes elsewhere)")
    return params, rep


if __name__ == "__main__":
    main()
