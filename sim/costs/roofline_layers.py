"""The roofline's local and linear attention layers: sliding-window and chunked attention over
their window, and linear attention's fixed-size state (the layer kinds of
:mod:`sim.specs.layers`).

A mixin of :class:`~sim.costs.roofline.RooflineCost`. The host's attention coefficients
(:mod:`sim.costs.roofline_attention`) price the ``full_attention`` layers only (their count in
place of ``num_hidden_layers``); :meth:`RooflineLayers.extra_layers_time` adds, per iteration:

- local layers (``sliding_attention``, ``chunked_attention``): the same per-layer costs as a full
  layer's, over the tokens the window keeps: a decode reads ``min(L, W)`` tokens of KV (chunked:
  the current chunk's ``(L - 1) % C + 1``), a prefill chunk of ``c`` new tokens after ``p``
  cached ones does ``4 d_q`` FLOPs per (query, key) pair over ``integral_p^{p+c} min(x, W) dx``
  pairs (the full layers' ``c (p + c/2)`` until the window fills, ``c W`` after; chunked:
  ``integral (x mod C) dx``, each token over its chunk so far) and reads the KV of at most
  ``W + c`` tokens (chunked: from the first new token's chunk start); each at least the kernel
  floor;
- linear-attention layers (Gated DeltaNet): per token ``6 x value_heads x d_k x d_v`` FLOPs
  (the delta-rule state update and its readout), and per sequence the state read and written
  once per iteration (decode) or per chunk (prefill), at the fp16 peak and the decode-attention
  bandwidth efficiency. No kernel measurement of these exists: the terms are the full layers'
  fitted efficiencies, assumed.

A model with such layers needs each decode's context length (``needs_decode_lengths``) and has
no ``pure_decode_cost`` (its decode price is not linear in the summed context). Invariant: a
model with only full layers gets none of this (``_extra_layers`` False): its prices are the
host's own, bit for bit.
"""

from __future__ import annotations

from ..specs import layers as kinds
from .roofline_ops import ACT_BYTES


class RooflineLayers:
    """Local and linear attention layers of :class:`~sim.costs.roofline.RooflineCost` (see the
    module docstring)."""

    def _init_layers(self):
        """Set the local/linear coefficients; called after ``_init_attention``."""
        m, p = self.model, self.params
        counts = m.layer_counts() if m.has_local_layers else {kinds.FULL: m.num_hidden_layers}
        self._extra_layers = len(counts) > 1 or kinds.FULL not in counts
        if not self._extra_layers:
            return
        self.needs_decode_lengths = True
        self.pure_decode_cost = None  # decode price is not linear in the summed context
        n_full = counts.get(kinds.FULL, 0)
        scale = n_full / m.num_hidden_layers  # the host's coefficients priced every layer
        self._prefill_coeffs = tuple(c * scale for c in self._prefill_coeffs)
        self._decode_flops_s_per_ctx *= scale
        self._decode_bytes_s_per_ctx *= scale
        self._decode_s_per_ctx *= scale
        self._attn_floor_full = self._attn_floor * scale
        self._attn_floor *= scale
        floor = p.kernel_floor_s
        self._n_local = counts.get(kinds.SLIDING, 0) + counts.get(kinds.CHUNKED, 0)
        per_layer = (self._decode_s_per_ctx / n_full if n_full else
                     max(4 * self._q_per_gpu / (self.peak_fp16 * p.attn_prefill_compute_eff),
                         self._kv_bytes_per_ctx * self.decode_kv_reads
                         / (self.bw * p.attn_decode_memory_eff)))
        self._local_decode_s_per_ctx = self._n_local * per_layer
        bw = self.bw * p.attn_decode_memory_eff
        self._local_coeffs = (self._n_local * 4.0 * self._q_per_gpu / self._attn_flops_s,
                              self._n_local * self._kv_bytes_per_ctx / bw,
                              self._n_local * 2 * self._q_per_gpu * ACT_BYTES / bw)
        self._local_floor = self._n_local * floor
        self._n_linear = counts.get(kinds.LINEAR, 0)
        if self._n_linear:
            kd, vd, vh = kinds.linear_dims(m, self.tp)
            flops = 6.0 * vh * m.linear_key_head_dim * m.linear_value_head_dim
            state = kinds.linear_state_values(m, self.tp) * ACT_BYTES
            self._linear_flops_s = self._n_linear * flops / (self.peak_fp16
                                                             * p.attn_prefill_compute_eff)
            self._linear_state_s = self._n_linear * 2 * state / bw  # read and write
            self._linear_floor = self._n_linear * floor

    def _local_span(self, tokens: int) -> int:
        return kinds.local_tokens(self.model, tokens)

    def _window_pairs(self, new: int, cached: int) -> float:
        """(query, key) pairs of a local layer for ``new`` tokens after ``cached``: the
        integral of ``min(x, W)`` over ``[cached, cached + new]`` (chunked: ``W`` the chunk)."""
        lo, hi = cached, cached + new
        c = self.model.attention_chunk_size
        if c:  # a token attends to its chunk's tokens so far: integral of (x mod C)
            def f(x):
                return (x // c) * c * c / 2.0 + (x % c) ** 2 / 2.0
            return f(hi) - f(lo)
        w = self.model.sliding_window
        if hi <= w:
            return new * (cached + new / 2.0)
        if lo >= w:
            return float(new * w)
        return (w * w - lo * lo) / 2.0 + (hi - w) * w

    def extra_layers_time(self, batch) -> float:
        """The local and linear layers' attention of ``batch`` (0 for a model without them)."""
        t = 0.0
        lengths = batch.decode_context_lengths() if batch.num_decode_tokens else ()
        if self._n_local:
            w = self.model.sliding_window or self.model.attention_chunk_size
            if len(lengths):
                ctx = sum(self._local_span(int(n)) for n in lengths)
                d = ctx * self._local_decode_s_per_ctx
                t += d if d > self._local_floor else self._local_floor
            a, b, c = self._local_coeffs
            half = self._attn_half
            chunk = self.model.attention_chunk_size
            for new, cached in batch.prefills:
                # KV read: the window behind the first new token (chunked: its chunk's start)
                span = cached % chunk + new if chunk else min(cached + new, w + new)
                x = a * self._window_pairs(new, cached)
                if half:  # the prefill efficiency's saturation, over the tokens attended
                    x *= 1.0 + half / span
                y = b * span + c * new
                x = x if x > y else y
                t += x if x > self._local_floor else self._local_floor
        if self._n_linear:
            seqs = len(lengths) + len(batch.prefills)
            tokens = batch.num_decode_tokens + batch.num_prefill_tokens
            if seqs:
                x = tokens * self._linear_flops_s
                y = seqs * self._linear_state_s
                x = x if x > y else y
                t += x if x > self._linear_floor else self._linear_floor
        return t
