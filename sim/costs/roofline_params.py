"""The roofline's terms: :class:`RooflineParams` (efficiencies and fixed costs), the fitted
values per GPU (:func:`fitted_params`, from ``sim/data/roofline_fit.json``, written by
``experiments/fit_roofline.py``) and the compute peak a weight dtype runs at
(:func:`compute_peak`).

Invariants: every efficiency is in (0, 1]; every fixed cost and ``attn_prefill_half_tokens`` is
>= 0; ``attn_decode_reread_fraction`` is in [0, 1] (0, the default: a decode attention kernel
that reads each KV head once for its whole query-head group); ``cuda_graph_max_batch`` and
``custom_allreduce_max_bytes`` are integers >= 0 (0: every iteration runs eagerly; every
all-reduce goes through NCCL), ``int4_group_size`` one >= 1, ``parallel_block_allreduces`` 1 or
2 (a parallel attention+MLP block's all-reduces per layer; 1 by default). Prefill
attention over a context of ``L`` tokens (cached + new) runs at ``attn_prefill_compute_eff x L /
(L + attn_prefill_half_tokens)`` of the fp16 peak: short sequences give a FlashAttention kernel
few key blocks per query tile to pipeline, and the published kernel benchmarks fall well below
their plateau at 512 tokens. Over an fp8 KV cache on a GPU with FP8 tensor cores it runs at the
FP8 peak with its own curve (``attn_prefill_fp8_compute_eff``, ``attn_prefill_fp8_half_tokens``:
FlashAttention-3's FP8 forward) when that is fitted (``None``: the engine dequantises and computes
at the fp16 peak on the fp16 curve). A GPU without per-op profiles gets, term by term, the
mean over the profiled GPUs (an FP8 efficiency only from GPUs with FP8 tensor cores), then, on
top, the terms fitted to its own published kernel timings (``sim/data/gpu_kernel_fit.json``,
written by ``experiments/fit_gpu_kernels.py`` from ``sim/data/gpu_kernels.csv``: GEMM and
all-reduce measurements of that GPU, never another's). FP8/FP4 compute needs the GPU's FP8/FP4
tensor cores; otherwise the weights are dequantised and computed at the fp16 peak, and the
returned note says so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import numpy as np

from ..checks import fraction, positive_float
from ..specs.fp4 import FP4_DTYPES

ELEMENTWISE_OPS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
# a MoE layer's extra ops (sim.costs.moe): GEMMs, memory-bound routing ops (priced at the
# residual add's streaming efficiency), and the routed experts' GEMMs among GEMM_OPS
MOE_GEMM_OPS = ("moe_router",)
MOE_STREAM_OPS = ("moe_topk", "moe_permute", "moe_unpermute")
EXPERT_OPS = ("mlp_up_proj", "mlp_down_proj")


@dataclass(frozen=True, slots=True)
class RooflineParams:
    gemm_compute_eff: float = 0.72
    gemm_memory_eff: float = 0.78
    gemm_latency_s: float = 0.0  # fixed time added to every GEMM (launch, tails)
    elementwise_eff: dict = field(default_factory=lambda: {op: 0.6 for op in ELEMENTWISE_OPS})
    kernel_floor_s: float = 3e-6
    attn_prefill_compute_eff: float = 0.55  # prefill attention's FLOP/s efficiency, saturated
    # (these two defaults apply only to unfitted params: roofline_fit.json has the fitted ones)
    attn_prefill_half_tokens: float = 0.0  # context at which it reaches half that (0: flat)
    attn_decode_memory_eff: float = 0.7
    overhead_s: float = 1e-3  # per iteration (CPU: schedule, prepare inputs, sample)
    allreduce_eff: float = 0.7
    allreduce_latency_s: float = 2e-5
    overhead_per_seq_s: float = 0.0  # per sequence in the batch, not overlapped with the GPU
    eager_layer_overhead_s: float = 0.0  # per layer when not replaying a CUDA graph
    cuda_graph_max_batch: int = 512  # decode-only batches up to this size replay a graph
    fp8_gemm_compute_eff: float | None = None  # None: gemm_compute_eff
    # prefill attention over an fp8 KV cache on a GPU with FP8 tensor cores: at the FP8 peak with
    # its own curve (FlashAttention-3's FP8 forward); None: dequantised, fp16 peak and fp16 curve
    attn_prefill_fp8_compute_eff: float | None = None
    attn_prefill_fp8_half_tokens: float = 0.0
    # custom (one-/two-shot) all-reduce over NVLink for messages up to custom_allreduce_max_bytes
    # (vLLM's CustomAllreduce, max_size 8 MiB; 0: NCCL only): each stage costs
    # custom_allreduce_latency_s, and the bytes a GPU moves go at custom_allreduce_bytes_per_s
    custom_allreduce_max_bytes: int = 0
    custom_allreduce_latency_s: float = 0.0
    custom_allreduce_bytes_per_s: float = 0.0
    # int4 weights: one fp16 scale and one fp16 zero per group of this many weights (AWQ/GPTQ: 128)
    int4_group_size: int = 128
    # a MoE layer's routed-expert GEMMs (grouped GEMMs over the touched experts) compute at this
    # fraction of the dense GEMM rate; 1.0: the dense rate (fitted to sim/data/moe_kernels.csv)
    moe_gemm_compute_scale: float = 1.0
    # decode attention on a kernel that is not group-aware (one query head per thread block:
    # TensorRT-LLM's masked MHA before XQA, vLLM's paged_attention v1/v2): every query head of a
    # KV head's group of G reads that KV head again, and this fraction of the G - 1 re-reads
    # misses L2 and goes to HBM, so decode reads its KV bytes 1 + f (G - 1) times. 0: a
    # group-aware kernel (XQA, FlashAttention, FlashInfer) reads them once; 1: every query head
    # from HBM. Fitted to TensorRT-LLM's XQA blog pair
    # (fitted_params(..., group_aware_decode=False))
    attn_decode_reread_fraction: float = 0.0
    # all-reduces per layer of a parallel attention+MLP block under tensor parallelism: 1, the
    # two outputs summed and reduced once (vLLM's Falcon; TensorRT-LLM from 0.7.1: "Optimize
    # AllReduce for parallel attention on Falcon and GPT-J"), or 2, each row-parallel linear
    # reducing its own output (TensorRT-LLM 0.5-0.6.1's Falcon and GPT-J). A sequential block
    # always has two
    parallel_block_allreduces: int = 1

    def __post_init__(self):
        for f in ("gemm_compute_eff", "gemm_memory_eff", "attn_prefill_compute_eff",
                  "attn_decode_memory_eff", "allreduce_eff", "fp8_gemm_compute_eff",
                  "attn_prefill_fp8_compute_eff", "moe_gemm_compute_scale"):
            if getattr(self, f) is None and f in ("fp8_gemm_compute_eff",
                                                  "attn_prefill_fp8_compute_eff"):
                continue
            v = positive_float(f, getattr(self, f))
            if v > 1:
                raise ValueError(f"{f} must be at most 1, got {v}")
        for f in ("kernel_floor_s", "overhead_s", "allreduce_latency_s", "gemm_latency_s",
                  "overhead_per_seq_s", "eager_layer_overhead_s", "attn_prefill_half_tokens",
                  "attn_prefill_fp8_half_tokens",
                  "custom_allreduce_latency_s", "custom_allreduce_bytes_per_s"):
            positive_float(f, getattr(self, f), allow_zero=True)
        fraction("attn_decode_reread_fraction", self.attn_decode_reread_fraction,
                 allow_zero=True)
        for f in ("custom_allreduce_max_bytes", "int4_group_size"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < (f == "int4_group_size"):
                raise ValueError(f"{f} must be an integer >= {int(f == 'int4_group_size')}, "
                                 f"got {v!r}")
        if self.custom_allreduce_max_bytes and not self.custom_allreduce_bytes_per_s:
            raise ValueError("custom_allreduce_bytes_per_s must be > 0 when "
                             f"custom_allreduce_max_bytes is {self.custom_allreduce_max_bytes}")
        v = self.parallel_block_allreduces
        if isinstance(v, bool) or not isinstance(v, int) or v not in (1, 2):
            raise ValueError(f"parallel_block_allreduces must be 1 (one all-reduce of the summed "
                             f"attention and MLP outputs) or 2 (one each), got {v!r}")
        if isinstance(self.cuda_graph_max_batch, bool) or not isinstance(
                self.cuda_graph_max_batch, int) or self.cuda_graph_max_batch < 0:
            raise ValueError(f"cuda_graph_max_batch must be an integer >= 0 (0: always eager), "
                             f"got {self.cuda_graph_max_batch!r}")


KERNEL_FIT = "gpu_kernel_fit.json"  # terms fitted to a GPU's published kernel timings


@lru_cache(maxsize=4)
def _fitted(name="roofline_fit.json") -> dict:
    path = resources.files("sim").joinpath("data", name)
    if not path.is_file():
        return {}
    return json.loads(path.read_text())


def fitted_params(gpu_key: str, *, group_aware_decode: bool = True) -> RooflineParams:
    """The fitted terms of ``gpu_key`` ("a100", "h100"), else for each term the mean over the
    profiled GPUs, overlaid with the terms fitted to ``gpu_key``'s own published kernel timings
    (:data:`KERNEL_FIT`: "mi300x"; ``moe_fit.json``'s ``params[gpu_key]``: the MoE expert-GEMM
    scale fitted to that GPU's own fused-MoE timings, written by ``experiments/moe_kernels.py``);
    plus the terms shared by every GPU (``shared``: the CPU overheads, and ``moe_fit.json``'s
    ``shared`` scale, the one a GPU without fused-MoE fit rows gets: assumed there).
    ``group_aware_decode=False``: decode attention on a kernel with one query head per thread
    block, its L2-miss fraction of re-reads (``per_head_decode``) fitted to TensorRT-LLM's XQA
    blog pair (Llama-2-70B, one H200: 1,227 tok/s/GPU without XQA, 2,941 with it)."""
    if not isinstance(group_aware_decode, bool):
        raise TypeError(f"group_aware_decode must be True or False, got {group_aware_decode!r}")
    data = _fitted()
    fits = data.get("params", {})
    shared = {**data.get("shared", {}), **_fitted("moe_fit.json").get("shared", {})}
    if not group_aware_decode:
        if "per_head_decode" not in data:
            raise ValueError("group_aware_decode=False needs the per_head_decode fit in "
                             "roofline_fit.json (experiments/fit_roofline.py --write)")
        shared.update(data["per_head_decode"]["params"])
    own = {**_fitted("moe_fit.json").get("params", {}).get(gpu_key, {}),
           **_fitted(KERNEL_FIT).get("params", {}).get(gpu_key, {})}
    if not fits:
        return RooflineParams(**{**shared, **own})
    p = fits[gpu_key] if gpu_key in fits else mean_terms(list(fits.values()))
    return RooflineParams(**{**shared, **p, **own})


def mean_terms(fits: list) -> dict:
    """Term by term, the mean over several GPUs' terms (dicts of term -> value): a term missing
    or ``None`` on a GPU is left out of its mean, a term equal on every GPU is kept as it is
    (an integer stays one), a dict of per-op values is averaged per op."""
    out = {}
    for k in dict.fromkeys(k for g in fits for k in g):
        vals = [g[k] for g in fits if g.get(k) is not None]
        if not vals:
            continue
        if all(v == vals[0] for v in vals):
            out[k] = vals[0]
        elif isinstance(vals[0], dict):
            out[k] = {op: float(np.mean([v[op] for v in vals])) for op in vals[0]}
        else:
            out[k] = float(np.mean(vals))
    return out


def profiled_gpus() -> tuple:
    """The GPU keys fitted to per-op profiles (``roofline_fit.json``): the GPUs whose
    :func:`mean_terms` every other GPU gets for a term it has no measurement of."""
    return tuple(sorted(_fitted().get("params", {})))


def fitted_gpus() -> tuple:
    """The GPU keys with any term fitted to their own measurements: the profiled GPUs and
    those fitted to published kernel timings (:data:`KERNEL_FIT`, ``moe_fit.json``'s
    ``params``)."""
    return tuple(sorted({*profiled_gpus(), *_fitted(KERNEL_FIT).get("params", {}),
                         *_fitted("moe_fit.json").get("params", {})}))


def compute_peak(weight_dtype, nbytes, gpu, activation_dtype=None):
    """``(compute dtype, peak FLOP/s, note)`` of GEMMs on weights of ``weight_dtype``.

    fp4 weights: with ``activation_dtype`` None or "fp4", FP4 GEMMs at the FP4 peak on a GPU
    with FP4 tensor cores (NVFP4/MXFP4 on Blackwell), else weight-only (4-bit reads,
    dequantised, the fp16 peak: vLLM's MXFP4 gpt-oss on Hopper); "fp16"/"bf16" activations:
    weight-only everywhere. fp4 activations on a GPU without FP4 tensor cores are a
    ``ValueError``, as are fp4 activations with other weights."""
    key = weight_dtype.lower() if isinstance(weight_dtype, str) else str(weight_dtype)
    key = "fp4" if key in FP4_DTYPES else key  # nvfp4, mxfp4: their scales are in nbytes
    fp16 = gpu.fp16_tflops * 1e12
    act = None if activation_dtype is None else str(activation_dtype).lower()
    if act not in (None, "fp16", "bf16", "fp4"):
        raise ValueError(f"activation_dtype must be fp16, bf16 or fp4, got {activation_dtype!r}")
    if act == "fp4" and (key != "fp4" or not gpu.fp4_tflops):
        why = (f"{gpu.name} has no FP4 tensor cores (fp4 weights run weight-only there: "
               f"activation_dtype fp16)" if key == "fp4" else f"weight_dtype is {key}")
        raise ValueError(f"activation_dtype fp4 needs fp4 weights on a GPU with FP4 tensor "
                         f"cores: {why}")
    if key == "fp4" and act in ("fp16", "bf16"):
        return "fp16", fp16, "fp4 weights, weight-only: dequantised and computed at the fp16 peak"
    if key == "fp4":
        if gpu.fp4_tflops:
            return "fp4", gpu.fp4_tflops * 1e12, "fp4 GEMMs at the FP4 peak"
        return "fp16", fp16, (f"{gpu.name} has no FP4 tensor cores: fp4 weights are "
                              f"dequantised and computed at the fp16 peak")
    if key == "fp8" or nbytes == 1 and key != "int8":
        if gpu.fp8_tflops:
            return "fp8", gpu.fp8_tflops * 1e12, "fp8 GEMMs at the FP8 peak"
        return "fp16", fp16, (f"{gpu.name} has no FP8 tensor cores: fp8 weights are "
                              f"dequantised and computed at the fp16 peak")
    if key == "int8" and gpu.int8_tops:
        return "int8", gpu.int8_tops * 1e12, "int8 GEMMs at the INT8 peak"
    if nbytes < 2:  # weight-only int4 (or int8 without INT8 cores): dequantised in the kernel
        return "fp16", fp16, f"{key} weights are dequantised and computed at the fp16 peak"
    return "fp16", fp16, "fp16/bf16 GEMMs at the fp16 peak"
