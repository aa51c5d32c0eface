"""The roofline's attention: prefill chunks over their cached context, decode steps over theirs,
and multi-head latent attention (MLA) as vLLM runs it.

A mixin of :class:`~sim.costs.roofline.RooflineCost`: :meth:`RooflineAttention._init_attention`
reads the host's ``model``, ``tp``, ``gpu``, ``params``, ``kvb`` and ``kv_dtype`` (the KV cache's
bytes per value and dtype), ``peak_fp16``, ``peak``, ``_gemm_ce``, ``wb`` and ``bw``, and sets
the per-context-token coefficients the host's hot path (``RooflineCost.__call__``) adds up:

- prefill attention of each chunk of ``c`` new tokens over ``p`` cached ones (causal:
  ``4 c (p + c/2) d_q`` FLOPs, at an efficiency that saturates with the context ``L = p + c``:
  ``attn_prefill_compute_eff x L / (L + attn_prefill_half_tokens)``; over an fp8 KV cache on a
  GPU with FP8 tensor cores, ``attention_dtype`` "fp8": the FP8 peak on its own fitted curve,
  ``attn_prefill_fp8_compute_eff`` and ``attn_prefill_fp8_half_tokens``) - the curves fitted to
  published FlashAttention-2/-3 forward benchmarks, FP16 and FP8
  (``sim/data/attention_kernels.csv``);
- decode attention (each sequence reads its whole KV context; its compute bound stays at the
  fp16 peak; on a kernel that is not group-aware, one thread block per query head as
  TensorRT-LLM's masked MHA before XQA, a grouped-query model's ``G`` query heads per KV head
  each read it, and the KV bytes cross HBM ``decode_kv_reads = 1 + attn_decode_reread_fraction x
  (G - 1)`` times: the fraction of re-reads L2 does not serve, 0 by default, fitted to
  TensorRT-LLM's XQA blog pair).

MLA (DeepSeek-V2/V3): decode attends over the cached latent (``kv_lora_rank +
qk_rope_head_dim`` values per token, read once for all heads; the K and V up-projections
absorbed into the query and output, so per query token they cost what the ``kv_b_proj`` GEMM
costs), prefill attention is ordinary attention with ``qk_nope + qk_rope``-wide keys and
``v_head_dim``-wide values, and each prefill chunk up-projects the latents of its cached prefix
again (a GEMM over the cached tokens, :meth:`~RooflineAttention._upproj_time`).

Invariants: every term is at least the layers' kernel floor; a decode's price (without speculation)
is linear in its context tokens (one coefficient, ``_decode_s_per_ctx``, the larger of the compute
and memory bounds), so a batch's decode attention is one multiplication by its context tokens;
:meth:`~RooflineAttention.prefill_attention_time` and the host's hot path compute the same closed
form.
"""

from __future__ import annotations

from .roofline_ops import ACT_BYTES


class RooflineAttention:
    """The attention terms of :class:`~sim.costs.roofline.RooflineCost` (see the module
    docstring)."""

    def _init_attention(self):
        """Set the attention coefficients (see the module docstring)."""
        m, tp, g, p = self.model, self.tp, self.gpu, self.params
        layers = m.num_hidden_layers
        # prefill attention: fp16 peak and curve, or over an fp8 KV cache on FP8 tensor cores
        # (with a fitted FP8 curve) FP8 peak and its own curve
        self.attention_dtype = "fp8" if (
            str(self.kv_dtype).lower() == "fp8" and g.fp8_tflops
            and p.attn_prefill_fp8_compute_eff is not None) else "fp16"
        if self.attention_dtype == "fp8":
            self._attn_flops_s = g.fp8_tflops * 1e12 * p.attn_prefill_fp8_compute_eff
            self._attn_half = float(p.attn_prefill_fp8_half_tokens)
        else:
            self._attn_flops_s = self.peak_fp16 * p.attn_prefill_compute_eff
            self._attn_half = float(p.attn_prefill_half_tokens)  # prefill attention's saturation
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
