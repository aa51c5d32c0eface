"""The roofline's per-layer linear and elementwise ops: their FLOPs and bytes, and their seconds.

A mixin of :class:`~sim.costs.roofline.RooflineCost`: :class:`RooflineOps` reads the host's
``model``, ``tp`` (tensor parallelism), ``wb`` (bytes per weight), ``params``
(:class:`~sim.costs.roofline_params.RooflineParams`), ``peak`` and ``_gemm_ce`` (the GEMMs'
compute peak and efficiency), ``bw`` (bytes/s). Each op costs ``max(FLOPs / (peak x
compute_eff), bytes / (bandwidth x memory_eff), kernel_floor)``; per layer:

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
- elementwise ops (two norms, or one for a parallel block that shares it, RoPE, the
  activation, two residual adds), memory-bound;
- tensor parallelism divides the FLOPs and bytes of the sharded ops (the all-reduces it adds
  are :mod:`sim.costs.roofline_collectives`').

int4 weights also read one fp16 scale and one fp16 zero per ``int4_group_size`` weights
(AWQ/GPTQ: 128; gpt-fast: 32): ``wb`` includes them. A checkpoint whose routed experts have
their own precision (gpt-oss: MXFP4 experts, BF16 attention and embeddings): the experts read
``ewb`` bytes per weight and compute at ``_expert_rate`` (the host's), the shared experts and
every other GEMM at ``wb`` and the weight dtype's peak.

Invariants: an op's work depends only on the number of tokens (so the host memoises it per
token count); the scalar and the array paths (one token count, or an array of them) give the
same floats bit for bit: the same IEEE operations in the same order (Python's ``max`` on
scalars, ``np.maximum`` folded left on arrays).
"""

from __future__ import annotations

import numpy as np

from ..specs.layers import LINEAR, linear_dims
from .moe import moe_work
from .roofline_params import EXPERT_OPS, GEMM_OPS, MOE_GEMM_OPS, MOE_STREAM_OPS

ACT_BYTES = 2  # activations in fp16/bf16


def _maximum(*values):
    """``np.maximum`` of two or more arrays (or scalars), folded left."""
    out = values[0]
    for v in values[1:]:
        out = np.maximum(out, v)
    return out



class RooflineOps:
    """The per-layer ops of :class:`~sim.costs.roofline.RooflineCost` (see the module
    docstring)."""

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
                           k=k, gate=gate, weight_bytes=self.ewb,  # (routed: their own dtype)
                           router_weight_bytes=wb)
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
        elif m.attn_output_gate:  # q_proj also projects the output gate
            pre = gemm(tokens, h, (2 * m.q_size + 2 * m.kv_size) / tp)
            post = gemm(tokens, m.q_size / tp, h)
            norm_in = (0.0, tokens * h * 2 * ACT_BYTES)
            rope = (0.0, tokens * 2 * (m.q_size + m.kv_size) / tp * ACT_BYTES)
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
                rate = (self._expert_rate or gemm_rate) * p.moe_gemm_compute_scale if moe \
                    and op in EXPERT_OPS else gemm_rate
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
        dense = self.model.num_dense_layers
        if dense:
            layers = self.model.num_hidden_layers
            d = self._times(self.op_work(tokens, dense_layer=True))
            out = {op: (dense * d.get(op, 0.0) + (layers - dense) * t) / layers
                   for op, t in out.items()}
        linear = self.model.layer_counts().get(LINEAR, 0) if self.model.has_local_layers else 0
        if linear:  # a linear-attention layer's own projections (sim.costs.roofline_layers)
            layers = self.model.num_hidden_layers
            lin = self._times(self._linear_attention_work(tokens))
            out.update({op: (linear * lin[op] + (layers - linear) * out[op]) / layers
                        for op in lin if op != "add"})
        return out

    def _linear_attention_work(self, tokens) -> dict:
        """``(FLOPs, bytes)`` of a Gated DeltaNet layer's projections (in_proj_qkvz + ba,
        out_proj) and its causal convolution (in place of RoPE), per layer."""
        m, wb = self.model, self.wb
        kd, vd, vh = linear_dims(m, self.tp)
        h = m.hidden_size
        width = 2 * kd + 2 * vd + 2 * vh
        t = np.asarray(tokens, dtype=np.float64) if not np.isscalar(tokens) else float(tokens)
        return {"attn_pre_proj": (2.0 * t * h * width,
                                  h * width * wb + t * (h + width) * ACT_BYTES),
                "attn_post_proj": (2.0 * t * vd * h, vd * h * wb + t * (vd + h) * ACT_BYTES),
                "attn_rope": (0.0, t * 2 * (2 * kd + vd) * ACT_BYTES),
                "add": (0.0, t * 3 * h * ACT_BYTES)}  # (for _times; not averaged)
