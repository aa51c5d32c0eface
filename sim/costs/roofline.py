"""Roofline cost model from published GPU specs, with efficiencies fitted to measured kernels.

Per iteration, per layer, each op costs ``max(FLOPs / (peak x compute_eff), bytes /
(bandwidth x memory_eff), kernel_floor)``:

- GEMMs (fused QKV, O, gate+up, down; a non-gated MLP's fc1 and fc2; MLA: the low-rank Q
  and KV projections and the latent up-projections), reading their weights once per iteration;
- a MoE layer (:mod:`sim.costs.moe`, uniform routing): the router GEMM (``hidden x E``,
  replicated on every GPU), the top-k softmax over its fp32 logits, the permutation of the
  tokens into expert order and the un-permutation that sums each token's ``k`` outputs (memory-
  bound copies of ``tokens x (k + 1) x hidden`` activations each, at the residual add's
  fitted efficiency), and the expert GEMMs: the FLOPs of ``tokens x k`` rows, the weights of
  the expected touched experts ``E (1 - (1 - k/E)^tokens)``, plus the shared experts' dense
  FLOPs and weights, computing at ``moe_gemm_compute_scale`` (0.74) of the dense GEMM rate.
  That scale is the one fitted MoE term: least squares over vLLM's published Triton fused-MoE
  timings of Mixtral-8x7B (BF16, TP 2, H100, batch 1-1,536, vLLM PR #24700;
  ``sim/data/moe_kernels.csv``, ``experiments/moe_kernels.py``); at batch >= 1,024 the grouped
  GEMM reaches ~0.5 of the peak where a dense one reaches 0.7. The routing terms have no
  parameter (at batch 1 they are kernel floors: the measured kernel is 11 us above the
  weights' read time). Per-expert GEMM efficiency: the roofline's GEMM efficiency does not
  depend on the rows multiplied (a flat fraction of peak under ``max(compute, memory)``), so
  pricing each touched expert's ~``tokens x k / touched`` rows separately gives the same time
  as the aggregate; with uniform loads nothing changes. Load imbalance (the busiest expert,
  :func:`sim.costs.moe.expected_busiest`) is not priced: under tensor parallelism every GPU
  holds a slice of every expert and the grouped GEMM spreads every expert's tiles over the
  SMs, and the kernel rows cannot tell it from the aggregate; nor is the padding of each
  expert's rows to the kernel's M tile (its tile size is a per-batch tuning choice the
  TensorRT-LLM serving rows do not publish). Held out (38 rows: H200 / A100 BF16 and H100
  FP8, other shapes): ``experiments/moe_kernels.py`` reports their error; the transition
  between the memory- and compute-bound regimes (Mixtral batch 512: -20 %) is where
  ``max(compute, memory)`` is most optimistic;
- prefill attention of each chunk of ``c`` new tokens over ``p`` cached ones (causal:
  ``4 c (p + c/2) d_q`` FLOPs, at an efficiency that saturates with the context ``L = p + c``:
  ``attn_prefill_compute_eff x L / (L + attn_prefill_half_tokens)``; over an fp8 KV cache on a
  GPU with FP8 tensor cores, ``attention_dtype`` "fp8": the FP8 peak on its own fitted curve,
  ``attn_prefill_fp8_compute_eff`` and ``attn_prefill_fp8_half_tokens``) and decode attention
  (each sequence reads its whole KV context; its compute bound stays at the fp16 peak; on a
  kernel that is not group-aware, one thread block per query head as TensorRT-LLM's masked MHA
  before XQA, a grouped-query model's ``G`` query heads per KV head each read it, and the KV
  bytes cross HBM ``decode_kv_reads = 1 + attn_decode_reread_fraction x (G - 1)`` times: the
  fraction of re-reads L2 does not serve, 0 by default, fitted to TensorRT-LLM's XQA blog pair);
- elementwise ops (two norms, or one for a parallel block that shares it, RoPE, the
  activation, two residual adds), memory-bound;
- tensor parallelism divides FLOPs and bytes of the sharded ops and adds two all-reduces per
  layer (for a parallel attention+MLP block ``parallel_block_allreduces``: one by default, its
  two outputs summed before the reduction; two where the engine reduces each output in its
  row-parallel linear, as TensorRT-LLM did for Falcon and GPT-J before 0.7.1), priced from
  measured NCCL timings (interpolated by size) or a ring model; on
  NVLink, messages up to ``custom_allreduce_max_bytes`` (vLLM's 8 MiB) take the faster of that
  and a custom one-/two-shot kernel (:meth:`RooflineCost.custom_allreduce_time`: a stage
  latency per stage plus the bytes each GPU moves, fitted to published vLLM kernel timings) -
  at batch 1 an all-reduce is a few KiB and the custom kernel costs a third of NCCL's;
- the LM head once per iteration for the tokens that sample;
- fixed costs the kernel timings miss (:meth:`RooflineCost.fixed_time`): ``overhead_s`` per
  iteration (the engine's CPU work: scheduling, input preparation, sampler launch),
  ``overhead_per_seq_s`` per sequence in the batch (output processing; 0 by default: engines
  since vLLM 0.6 overlap it with the GPU) and ``eager_layer_overhead_s`` per layer when the
  iteration launches its kernels one by one (the gaps between kernels that per-kernel timings
  miss): every batch with a prefill, and decode-only batches of more than
  ``cuda_graph_max_batch`` sequences; smaller decode batches replay a CUDA graph and pay no
  per-layer term (vLLM captures graphs for decode batches up to 512 by default).

Compute peak by weight dtype (``compute_dtype``): fp8 weights run FP8 GEMMs at the FP8 peak
with their own fitted efficiency (``fp8_gemm_compute_eff``); int8 at the INT8 peak; fp4 at the
FP4 peak only on a GPU that has one (Blackwell), with the FP8 efficiency (no FP4 measurement
yet); everything else, fp4 on a GPU without FP4 tensor cores and int4 included, dequantises the
weights and computes at the fp16 peak (``compute_note`` says so). int4 weights also read one fp16
scale and one fp16 zero per ``int4_group_size`` weights (AWQ/GPTQ: 128; gpt-fast: 32).

Multi-head latent attention (MLA, DeepSeek-V2/V3) is priced as vLLM runs it: decode attends
over the cached latent (``kv_lora_rank + qk_rope_head_dim`` values per token, read once for
all heads; the K and V up-projections absorbed into the query and output, so per query token
they cost what the ``kv_b_proj`` GEMM costs), prefill attention is ordinary attention with
``qk_nope + qk_rope``-wide keys and ``v_head_dim``-wide values, and each prefill chunk
up-projects the latents of its cached prefix again (a GEMM over the cached tokens).

The efficiencies per GPU come from ``sim/data/roofline_fit.json``, fitted by
``experiments/fit_roofline.py`` to Vidur's measured A100/H100 per-layer timings; the fixed costs,
the FP8 efficiency and the decode attention's bandwidth efficiency to published end-to-end
measurements (``sim/data/cpu_overheads.csv``, ``sim/data/published_latency.csv``, every row
sourced); the prefill attention's efficiency curves to published FlashAttention-2/-3 forward
benchmarks, FP16 and FP8 (``sim/data/attention_kernels.csv``). The terms
and their fitted values live in :mod:`sim.costs.roofline_params`. Linear-op time depends only
on the number of tokens, so it is memoised per token count (the hot path is a dict lookup).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from importlib import resources

import numpy as np

from ..checks import positive_int
from ..specs.gpus import get_gpu
from ..specs.memory import bytes_per_value
from ..specs.memory_terms import check_tensor_parallel
from ..specs.models import get_model
from .moe import moe_work
from .roofline_params import (ELEMENTWISE_OPS, EXPERT_OPS, GEMM_OPS, MOE_GEMM_OPS,
                              MOE_STREAM_OPS, RooflineParams, compute_peak, fitted_params)

__all__ = ["ACT_BYTES", "ELEMENTWISE_OPS", "GEMM_OPS", "MOE_GEMM_OPS", "MOE_STREAM_OPS",
           "RooflineCost", "RooflineParams", "fitted_params"]

ACT_BYTES = 2  # activations in fp16/bf16


@lru_cache(maxsize=1)
def _allreduce_table() -> dict:
    import csv
    text = resources.files("sim").joinpath("data/profiles/vidur_all_reduce_ms.csv").read_text()
    table = {}
    for row in csv.DictReader(text.splitlines()):
        table.setdefault((row["gpu"], int(row["num_workers"])), []).append(
            (float(row["size_bytes"]), float(row["all_reduce_ms"]) * 1e-3))
    out = {}
    for k, v in table.items():
        sizes, times = np.array(sorted(v)).T
        # the lower envelope: an all-reduce never costs more than a measured larger one (it
        # could be padded to it); removes single noisy small-message medians (A100, 4 GPUs:
        # 61 us at 2 KiB against 16 us at 10 KiB)
        out[k] = (sizes, np.minimum.accumulate(times[::-1])[::-1])
    return out


_GPU_KEYS = {"A100-80GB-SXM": "a100", "H100-80GB-SXM": "h100", "H200-141GB-SXM": "h200",
             "L40S": "l40s", "B200-HGX": "b200", "MI300X": "mi300x"}


def _maximum(*values):
    """``np.maximum`` of two or more arrays (or scalars), folded left."""
    out = values[0]
    for v in values[1:]:
        out = np.maximum(out, v)
    return out


class RooflineCost:
    """``cost(batch) -> seconds`` for ``model`` on ``gpu`` (see module docstring)."""

    name = "roofline"

    def __init__(self, model="llama-3.1-8b", gpu="h100", *, tensor_parallel=1,
                 weight_dtype="fp16", kv_dtype="fp16", params: RooflineParams | None = None):
        self.model = get_model(model)
        self.gpu = get_gpu(gpu)
        self.gpu_key = _GPU_KEYS.get(self.gpu.name, self.gpu.name.lower())
        self.tp = check_tensor_parallel(self.model, positive_int("tensor_parallel",
                                                                 tensor_parallel))
        self.weight_dtype = weight_dtype
        self.kvb = bytes_per_value("kv_dtype", kv_dtype)
        self.kv_dtype = kv_dtype
        self.params = params or fitted_params(self.gpu_key)
        # weight bytes a GEMM reads per weight; int4 adds its groups' fp16 scale and zero
        self.wb = bytes_per_value("weight_dtype", weight_dtype)
        if str(weight_dtype).lower() == "int4":
            self.wb += 2 * ACT_BYTES / self.params.int4_group_size
        g = self.gpu
        self.bw = g.memory_bandwidth_gbps * 1e9
        self.peak_fp16 = g.fp16_tflops * 1e12
        self.compute_dtype, self.peak, self.compute_note = compute_peak(weight_dtype, self.wb, g)
        p = self.params
        self._gemm_ce = (p.fp8_gemm_compute_eff or p.gemm_compute_eff) if self.compute_dtype in (
            "fp8", "fp4") else p.gemm_compute_eff
        self._linear_cache = {}
        self._layers_rows = {}  # token count // LAYERS_BLOCK -> layers_time of the block
        m, tp = self.model, self.tp
        layers = m.num_hidden_layers
        self._fixed_s = p.overhead_s
        self._eager_s = layers * p.eager_layer_overhead_s
        self._per_seq_s = p.overhead_per_seq_s
        self._graph_max = p.cuda_graph_max_batch
        # prefill attention: fp16 peak and curve, or over an fp8 KV cache on FP8 tensor cores
        # (with a fitted FP8 curve) FP8 peak and its own curve
        self.attention_dtype = "fp8" if (
            str(kv_dtype).lower() == "fp8" and g.fp8_tflops
            and p.attn_prefill_fp8_compute_eff is not None) else "fp16"
        if self.attention_dtype == "fp8":
            self._attn_flops_s = g.fp8_tflops * 1e12 * p.attn_prefill_fp8_compute_eff
            self._attn_half = float(p.attn_prefill_fp8_half_tokens)
        else:
            self._attn_flops_s = self.peak_fp16 * p.attn_prefill_compute_eff
            self._attn_half = float(p.attn_prefill_half_tokens)  # prefill attention's saturation
        self._allreduces_per_layer = p.parallel_block_allreduces if m.parallel_attn else 2
        self._upproj = None  # MLA: (s per cached token (FLOPs), s (weights), s per cached (bytes))
        self.query_group_size = 1.0  # query heads per KV head and GPU (MLA: one latent)
        if m.is_mla:
            # per layer and context token: the latent (read once for all heads); FLOPs: scores
            # over kv_lora + rope, values over kv_lora, per head (the absorbed form)
            heads = m.num_attention_heads / tp
            self._kv_bytes_per_ctx = m.kv_latent_size * self.kvb
            decode_flops = 2 * heads * (m.kv_latent_size + m.kv_lora_rank)
            # prefill (vLLM's MHA form): qk_head-wide scores, v-wide values per (query, key)
            qkv_width = heads * (m.head_dim + m.v_head_dim)
            self._pair_flops = 2.0 * qkv_width
            self._q_per_gpu = heads * m.head_dim
            self._prefill_ctx_bytes = self._kv_bytes_per_ctx + qkv_width * ACT_BYTES
            self._prefill_new_bytes = qkv_width * ACT_BYTES  # read Q, write O
            up_width = m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
            self._upproj = (
                layers * 2.0 * up_width / (self.peak * self._gemm_ce),
                layers * up_width * self.wb / (self.bw * p.gemm_memory_eff),
                layers * (m.kv_lora_rank + heads * (m.qk_nope_head_dim + m.v_head_dim))
                * ACT_BYTES / (self.bw * p.gemm_memory_eff))
        else:
            # decode attention per context token per layer: K and V read, 4 d_q FLOPs
            kv_heads = max(1, m.num_key_value_heads // tp)
            self._kv_bytes_per_ctx = 2 * kv_heads * m.head_dim * self.kvb
            self._q_per_gpu = m.q_size / tp
            decode_flops = 4 * self._q_per_gpu
            # a kernel that is not group-aware reads each KV head once per query head of its
            # group (G per GPU), all but the first from L2 except attn_decode_reread_fraction
            self.query_group_size = m.num_attention_heads / tp / kv_heads
        # times each KV byte crosses HBM per decode step (1.0: once; MLA reads its latent once)
        self.decode_kv_reads = 1.0 + p.attn_decode_reread_fraction * (
            self.query_group_size - 1.0)
        self._decode_flops_s_per_ctx = (m.num_hidden_layers * decode_flops
                                        / (self.peak_fp16 * p.attn_prefill_compute_eff))
        self._decode_bytes_s_per_ctx = (m.num_hidden_layers * (self._kv_bytes_per_ctx
                                                               * self.decode_kv_reads)
                                        / (self.bw * p.attn_decode_memory_eff))
        self._decode_s_per_ctx = max(self._decode_flops_s_per_ctx, self._decode_bytes_s_per_ctx)
        self._attn_floor = layers * p.kernel_floor_s
        if m.is_mla:
            self._prefill_coeffs = (
                layers * self._pair_flops / self._attn_flops_s,
                layers * self._prefill_ctx_bytes / (self.bw * p.attn_decode_memory_eff),
                layers * self._prefill_new_bytes / (self.bw * p.attn_decode_memory_eff))
        else:
            self._prefill_coeffs = (  # prefill_attention_time = max(a n (p + n/2), b (p + n) + c n)
                layers * 4.0 * self._q_per_gpu / self._attn_flops_s,
                layers * self._kv_bytes_per_ctx / (self.bw * p.attn_decode_memory_eff),
                layers * 2 * self._q_per_gpu * ACT_BYTES / (self.bw * p.attn_decode_memory_eff))

    def op_work(self, tokens, dense_layer=False) -> dict:
        """Per layer, per op: ``(FLOPs, bytes)`` for ``tokens`` tokens (scalars or arrays).
        Elementwise ops have 0 FLOPs (memory-bound). A MoE model's layer is a MoE layer, or
        with ``dense_layer`` one of its ``first_k_dense_replace`` dense layers. A parallel block
        with one shared norm has no ``post_attention_layernorm``."""
        m, tp, wb = self.model, self.tp, self.wb
        h, inter = m.hidden_size, m.intermediate_size
        tokens = np.asarray(tokens, dtype=np.float64) if not np.isscalar(tokens) else float(tokens)

        def gemm(t, k_in, n_out, weight_copies=1.0):
            return (2.0 * t * k_in * n_out,
                    weight_copies * k_in * n_out * wb + t * (k_in + n_out) * ACT_BYTES)

        def fused(*parts):  # consecutive GEMMs priced as one op
            return (sum(f for f, _ in parts), sum(b for _, b in parts))

        gate = 2 if m.gated_mlp else 1  # gate+up (SwiGLU) or fc1 alone
        act_io = 3 if m.gated_mlp else 2  # activation: read 2 I write I, or read I write I
        moe = None
        if m.is_moe and not dense_layer:
            k = m.num_experts_per_tok
            moe = moe_work(tokens, hidden=h, width=inter / tp, num_experts=m.num_local_experts,
                           k=k, gate=gate, weight_bytes=wb)
            up, down = moe.pop("mlp_up_proj"), moe.pop("mlp_down_proj")
            act_tokens = tokens * k
            if m.n_shared_experts:  # always-on experts: a dense MLP of their total width, in
                shared = m.n_shared_experts * inter  # the grouped GEMM (SGLang fuses them so)
                up = fused(up, gemm(tokens, h, gate * shared / tp))
                down = fused(down, gemm(tokens, shared / tp, h))
                act_tokens = tokens * (k + m.n_shared_experts)
        else:
            if dense_layer:
                inter = m.dense_width
            up = gemm(tokens, h, gate * inter / tp)
            down = gemm(tokens, inter / tp, h)
            act_tokens = tokens
        if m.is_mla:
            heads = m.num_attention_heads / tp
            q_width = heads * m.head_dim
            q = (fused(gemm(tokens, h, m.q_lora_rank), gemm(tokens, m.q_lora_rank, q_width))
                 if m.q_lora_rank else gemm(tokens, h, q_width))
            # kv_a (latent + k_rope, replicated), then W_UK absorbed into q (decode) or the
            # K-nope up-projection of the new tokens (prefill): the same weights and FLOPs
            pre = fused(q, gemm(tokens, h, m.kv_latent_size),
                        gemm(tokens, m.kv_lora_rank, heads * m.qk_nope_head_dim))
            post = fused(gemm(tokens, m.kv_lora_rank, heads * m.v_head_dim),  # W_UV
                         gemm(tokens, heads * m.v_head_dim, h))
            # the q_a and kv_a latent norms ride with the input norm
            norm_in = (0.0, tokens * (h + m.q_lora_rank + m.kv_lora_rank) * 2 * ACT_BYTES)
            rope = (0.0, tokens * 2 * (heads * m.qk_rope_head_dim + m.qk_rope_head_dim)
                    * ACT_BYTES)
        else:
            pre = gemm(tokens, h, (m.q_size + 2 * m.kv_size) / tp)
            post = gemm(tokens, m.q_size / tp, h)
            norm_in = (0.0, tokens * h * 2 * ACT_BYTES)
            rope = (0.0, tokens * 2 * (m.q_size + m.kv_size) / tp * ACT_BYTES)
        ops = {
            "attn_pre_proj": pre,
            "attn_post_proj": post,
            "mlp_up_proj": up,
            "mlp_down_proj": down,
            "input_layernorm": norm_in,
        }
        if m.norms_per_layer == 2:
            ops["post_attention_layernorm"] = (0.0, tokens * h * 2 * ACT_BYTES)
        ops["attn_rope"] = rope
        ops["mlp_act"] = (0.0, act_tokens * act_io * inter / tp * ACT_BYTES)
        ops["add"] = (0.0, tokens * 3 * h * ACT_BYTES)
        if moe:
            ops.update(moe)
        return ops

    def _times(self, work) -> dict:
        """Seconds per op of ``work`` (:meth:`op_work`'s scalars or arrays): the larger of the
        compute and memory times, at least the kernel floor. Scalars use Python's ``max``
        (the same value as ``np.maximum``, 10x faster: a cache miss of the hot path). A MoE
        layer's work (it has a ``moe_router``): the experts' GEMMs compute at
        ``moe_gemm_compute_scale`` of the GEMM rate and the routing's memory-bound ops stream
        at the residual add's efficiency."""
        p = self.params
        moe = "moe_router" in work
        scalar = isinstance(work["add"][1], float)
        top = max if scalar else _maximum
        gemm_rate, bw, floor = self.peak * self._gemm_ce, self.bw, p.kernel_floor_s
        out = {}
        for op, (flops, nbytes) in work.items():
            if op in GEMM_OPS or moe and op in MOE_GEMM_OPS:
                rate = gemm_rate * p.moe_gemm_compute_scale if moe and op in EXPERT_OPS \
                    else gemm_rate
                t = top(flops / rate, nbytes / (bw * p.gemm_memory_eff),
                        floor) + p.gemm_latency_s
            else:
                eff = p.elementwise_eff["add" if moe and op in MOE_STREAM_OPS else op]
                t = top(nbytes / (bw * eff), floor)
            out[op] = t if scalar or np.ndim(t) else float(t)
        return out

    def op_times(self, tokens) -> dict:
        """Seconds per layer of each linear/elementwise op (scalars or arrays of tokens); for
        a MoE model with dense first layers, the mean over its layers."""
        out = self._times(self.op_work(tokens))
        dense = self.model.first_k_dense_replace if self.model.is_moe else 0
        if dense:
            layers = self.model.num_hidden_layers
            d = self._times(self.op_work(tokens, dense_layer=True))
            out = {op: (dense * d.get(op, 0.0) + (layers - dense) * t) / layers
                   for op, t in out.items()}
        return out

    def allreduce_time(self, nbytes) -> float:
        """Seconds of one all-reduce of ``nbytes`` over the tensor-parallel group: NCCL (the
        measured table, else a ring), or where the GPUs share NVLink and the message is at most
        ``custom_allreduce_max_bytes`` the faster of that and :meth:`custom_allreduce_time`."""
        if self.tp == 1:
            return 0.0
        p = self.params
        table = _allreduce_table().get((self.gpu_key, self.tp))
        if table is not None:
            sizes, times = table
            t = float(np.interp(nbytes, sizes, times, right=None)) if nbytes <= sizes[-1] \
                else float(times[-1] * nbytes / sizes[-1])
        else:
            link = self.gpu.link_bandwidth_gbps * 1e9 or 32e9  # else PCIe Gen4 x16 per direction
            t = p.allreduce_latency_s + 2 * (self.tp - 1) / self.tp * nbytes / (
                link * p.allreduce_eff)
        if nbytes <= p.custom_allreduce_max_bytes and self.gpu.link_bandwidth_gbps \
                and self.tp <= 8:
            t = min(t, self.custom_allreduce_time(nbytes))
        return t

    def custom_allreduce_time(self, nbytes) -> float:
        """The custom all-reduce kernels' closed form (vLLM, TensorRT-LLM, PyTorch's intra-node
        all-reduce): one-shot, every GPU reads the ``tp - 1`` other buffers and sums (one stage
        of ``custom_allreduce_latency_s``), or two-shot, a reduce-scatter then an all-gather (two
        stages, ``2 (tp - 1) / tp`` of the bytes); the cheaper of the two."""
        p, tp = self.params, self.tp
        t0, rate = p.custom_allreduce_latency_s, p.custom_allreduce_bytes_per_s
        return min(t0 + (tp - 1) * nbytes / rate, 2 * t0 + 2 * (tp - 1) / tp * nbytes / rate)

    LAYERS_BLOCK = 512  # token counts priced at once on a linear-time memo miss

    def layers_time(self, tokens: int) -> float:
        """All layers' linear ops and all-reduces for an iteration of ``tokens`` tokens (no
        sampling). Priced ``LAYERS_BLOCK`` token counts at a time through :meth:`op_times`'
        array path (one vectorised pass where a miss of an iteration's varying token count
        cost ~40 us of scalar Python, measured): elementwise, the same IEEE operations in the
        same order as the scalar path, so the same floats bit for bit (tests/test_roofline.py
        checks every preset against the scalar sum); the all-reduces stay scalar, one per
        token count (``allreduce_time`` reads a table)."""
        block, j = divmod(tokens - 1, self.LAYERS_BLOCK)
        row = self._layers_rows.get(block) if tokens > 0 else None
        if row is None:
            if tokens < 1:  # (no token: priced alone, not memoised)
                return self._layers_times(np.array([tokens]))[0]
            row = self._layers_rows[block] = self._layers_times(
                np.arange(block * self.LAYERS_BLOCK + 1, (block + 1) * self.LAYERS_BLOCK + 1))
        return row[j]

    def _layers_times(self, counts) -> list:
        """:meth:`layers_time` of each token count in the int array ``counts``."""
        ops = self.op_times(counts)
        layer = sum(ops.values()) + ops["add"]  # two residual adds per layer
        if self.tp > 1:
            nbytes = self.model.hidden_size * ACT_BYTES
            layer += self._allreduces_per_layer * np.array(
                [self.allreduce_time(t * nbytes) for t in counts.tolist()])
        return (self.model.num_hidden_layers * layer).tolist()

    def linear_time(self, tokens, sampled) -> float:
        """Everything but attention and overhead for an iteration of ``tokens`` tokens."""
        key = (tokens, sampled)
        t = self._linear_cache.get(key)
        if t is None:
            t = self.layers_time(tokens)
            if sampled:
                p, h, v = self.params, self.model.hidden_size, self.model.vocab_size / self.tp
                t += max(2.0 * sampled * h * v / (self.peak * self._gemm_ce),
                         (h * v * self.wb + sampled * (h + v) * ACT_BYTES)
                         / (self.bw * p.gemm_memory_eff), p.kernel_floor_s)
            self._linear_cache[key] = t
        return t

    def fixed_time(self, num_seqs, *, graphed=False) -> float:
        """The fixed costs of an iteration of ``num_seqs`` sequences (see the module docstring);
        ``graphed``: a decode-only batch that replays a CUDA graph."""
        t = self._fixed_s + self._per_seq_s * num_seqs
        return t if graphed else t + self._eager_s

    def prefill_attention_time(self, new, cached) -> float:
        """Attention of a prefill chunk of ``new`` tokens over ``cached`` ones, all layers (an
        MLA model's includes the up-projection of the cached latents)."""
        m, p = self.model, self.params
        if m.is_mla:
            flops = self._pair_flops * new * (cached + new / 2.0)
            nbytes = (cached + new) * self._prefill_ctx_bytes + new * self._prefill_new_bytes
        else:
            flops = 4.0 * new * (cached + new / 2.0) * self._q_per_gpu
            nbytes = (cached + new) * self._kv_bytes_per_ctx + 2 * new * self._q_per_gpu * ACT_BYTES
        t = m.num_hidden_layers * max(flops / (self._attn_flops_s * self._attn_saturation(
                                          cached + new)),
                                      nbytes / (self.bw * p.attn_decode_memory_eff),
                                      p.kernel_floor_s)
        return t + self._upproj_time(cached) if self._upproj and cached else t

    def prefill_attention_eff(self, context) -> float:
        """Prefill attention's fraction of its peak (the fp16 one, or the FP8 one when
        ``attention_dtype`` is "fp8") over ``context`` tokens (cached + new):
        ``attn_prefill_compute_eff x L / (L + attn_prefill_half_tokens)`` (or the fp8 terms)."""
        p = self.params
        eff = p.attn_prefill_fp8_compute_eff if self.attention_dtype == "fp8" else \
            p.attn_prefill_compute_eff
        return eff * self._attn_saturation(context)

    def _attn_saturation(self, context) -> float:
        return context / (context + self._attn_half)

    def _upproj_time(self, cached) -> float:
        """MLA: re-expanding ``cached`` latents into K-nope and V for a prefill chunk (all
        layers; one GEMM reading the kv_b weights and the latents)."""
        per_flop, weights, per_byte = self._upproj
        x, y = per_flop * cached, weights + per_byte * cached
        x = x if x > y else y
        return x if x > self._attn_floor else self._attn_floor

    def __call__(self, batch) -> float:
        # hot path (one call per iteration): a memo lookup plus closed forms; measured ~2x
        # faster than calling the per-op helpers
        n_dec = batch.num_decode_tokens
        prefills = batch.prefills
        spec = getattr(batch, "num_spec_tokens", 0)  # speculation: 1 + spec queries per decode
        q = n_dec * (1 + spec) if spec else n_dec
        key = (batch.num_prefill_tokens + q, q + len(prefills))
        t = self._linear_cache.get(key)
        if t is None:
            t = self.linear_time(*key)
        t += self._fixed_s + self._per_seq_s * key[1]  # fixed costs (fixed_time)
        if prefills or q > self._graph_max:  # graphs are captured per query-token count
            t += self._eager_s
        if n_dec:
            per_ctx = self._decode_s_per_ctx if not spec else max(
                (1 + spec) * self._decode_flops_s_per_ctx, self._decode_bytes_s_per_ctx)
            d = batch.decode_context_tokens * per_ctx
            t += d if d > self._attn_floor else self._attn_floor
        if prefills:
            a, b, c = self._prefill_coeffs
            floor, half = self._attn_floor, self._attn_half
            for new, cached in prefills:
                x = a * new * (cached + 0.5 * new)
                if half:  # efficiency saturating in the context (prefill_attention_eff)
                    x *= 1.0 + half / (cached + new)
                y = b * (cached + new) + c * new
                x = x if x > y else y
                t += x if x > floor else floor
            if self._upproj:
                for _, cached in prefills:
                    if cached:
                        t += self._upproj_time(cached)
        return t

    def pure_decode_cost(self, num_decodes: int):
        """The price of a batch of ``num_decodes`` decodes and nothing else (no prefill, no
        speculation) as a function of the tokens they attend over: ``f(context_tokens)``
        equals ``self(batch)`` bit for bit (the same terms added in the same order), for the
        engine's fast-forward of pure-decode iterations."""
        key = (num_decodes, num_decodes)
        t = self._linear_cache.get(key)
        if t is None:
            t = self.linear_time(*key)
        t += self._fixed_s + self._per_seq_s * num_decodes
        if num_decodes > self._graph_max:
            t += self._eager_s
        per_ctx, floor = self._decode_s_per_ctx, self._attn_floor

        def price(context_tokens, base=t):
            d = context_tokens * per_ctx
            return base + (d if d > floor else floor)
        return price

    def __repr__(self):  # what prices differ by (a sweep keys grid values by repr)
        kv = f", kv={self.kv_dtype}" if self.kvb != 2 else ""
        fitted = fitted_params(self.gpu_key)
        own = ", ".join(f"{f.name}={getattr(self.params, f.name)!r}"
                        for f in dataclasses.fields(self.params)
                        if getattr(self.params, f.name) != getattr(fitted, f.name))
        return (f"RooflineCost({self.model.name!r}, {self.gpu.name!r}, tp={self.tp}, "
                f"weights={self.weight_dtype}{kv}" + (f", params({own})" if own else "") + ")")
