"""Layer types of a model: which layers attend fully, over a local window, or linearly, and what
each kind holds per sequence (the KV cache, or a fixed-size state) and weighs.

Kinds, in Hugging Face ``layer_types`` vocabulary:

- ``full_attention``: every cached token, K and V (or an MLA latent) per token;
- ``sliding_attention`` (gpt-oss, Gemma 2/3, Mistral-7B v0.1): the last ``sliding_window``
  tokens; the KV a layer holds stops growing at the window (vLLM's ``SlidingWindowManager``
  frees blocks behind it, SGLang's SWA pool sizes that layer group for the window);
- ``chunked_attention`` (Llama 4's local layers): the tokens of the current
  ``attention_chunk_size`` chunk; a layer holds ``(L - 1) % C + 1`` of a sequence of ``L``
  (vLLM's ``ChunkedLocalAttentionManager`` frees the past chunks' blocks);
- ``linear_attention`` (Qwen3-Next's Gated DeltaNet): no per-token cache but a fixed state per
  sequence: a ``linear_key_head_dim x linear_value_head_dim`` matrix per value head and the
  causal convolution's last ``linear_conv_kernel_dim - 1`` inputs of ``2 key_dim + value_dim``
  channels (vLLM's ``GatedDeltaNet`` state shapes; its mamba-style cache holds one per request).

Pattern: with ``full_attention_interval`` N > 0, layer ``i`` (from 0) is full when ``(i + 1) % N
== 0`` and of the model's local kind otherwise (gpt-oss N = 2: sliding, full, ...; Gemma 3 N = 6:
five local, one global; Llama 4 N = 4: three chunked, one global; Qwen3-Next N = 4: three
linear, one full); N = 0 with a local kind: every layer is local (Mistral-7B v0.1). A model has
at most one local kind. Pricing depends on the counts of each kind, not their positions.

Attention sinks (gpt-oss: one learned logit per head) add no KV and are not counted (< 0.001 %
of the parameters).
"""

from __future__ import annotations

FULL, SLIDING, CHUNKED, LINEAR = ("full_attention", "sliding_attention", "chunked_attention",
                                  "linear_attention")
KINDS = (FULL, SLIDING, CHUNKED, LINEAR)
LINEAR_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                 "linear_value_head_dim")


def local_kind(m) -> str | None:
    """The model's local layer kind (see the module docstring), or None: every layer full."""
    if m.sliding_window:
        return SLIDING
    if m.attention_chunk_size:
        return CHUNKED
    if m.linear_num_value_heads:
        return LINEAR
    return None


def check_layers(m) -> None:
    """Raise a ``ValueError`` naming the field when the layer-type fields do not make a model."""
    set_ = [f for f in ("sliding_window", "attention_chunk_size", "linear_num_value_heads")
            if getattr(m, f)]
    if len(set_) > 1:
        raise ValueError(f"a model has at most one local layer kind, got {' and '.join(set_)}")
    if m.full_attention_interval and not set_:
        raise ValueError(f"full_attention_interval {m.full_attention_interval} needs a local "
                         "layer kind (sliding_window, attention_chunk_size or linear_* heads)")
    if m.full_attention_interval > m.num_hidden_layers:
        raise ValueError(f"full_attention_interval must be at most num_hidden_layers="
                         f"{m.num_hidden_layers}, got {m.full_attention_interval}")
    if set_ and m.is_mla:
        raise ValueError(f"{set_[0]} with multi-head latent attention (kv_lora_rank) is not "
                         "modelled")
    if any(getattr(m, f) for f in LINEAR_FIELDS):
        missing = [f for f in LINEAR_FIELDS if not getattr(m, f)]
        if missing:
            raise ValueError(f"linear attention needs {', '.join(missing)} > 0")
        if m.linear_num_value_heads % m.linear_num_key_heads:
            raise ValueError(f"linear_num_key_heads {m.linear_num_key_heads} must divide "
                             f"linear_num_value_heads {m.linear_num_value_heads}")


def layer_types(m) -> tuple:
    """The kind of each layer, in order (see the module docstring)."""
    kind = local_kind(m)
    n = m.full_attention_interval
    if kind is None:
        return (FULL,) * m.num_hidden_layers
    return tuple(FULL if n and (i + 1) % n == 0 else kind for i in range(m.num_hidden_layers))


def layer_counts(m) -> dict:
    """Layers of each kind present: ``{kind: count}`` (full first)."""
    types = layer_types(m)
    return {k: types.count(k) for k in KINDS if k in types}


def linear_dims(m, tp: int = 1) -> tuple:
    """``(key_dim, value_dim, value_heads)`` of a linear-attention layer on one of ``tp`` GPUs
    (the heads sharded; at least one of each)."""
    kh = max(1, m.linear_num_key_heads // tp)
    vh = max(1, m.linear_num_value_heads // tp)
    return kh * m.linear_key_head_dim, vh * m.linear_value_head_dim, vh


def linear_attention_params(m) -> int:
    """Weights of one Gated DeltaNet layer: ``in_proj_qkvz`` (hidden -> 2 key_dim + 2
    value_dim), ``in_proj_ba`` (hidden -> 2 value heads), the depthwise causal convolution
    (``2 key_dim + value_dim`` channels x kernel), ``A_log`` and ``dt_bias`` (one per value
    head), the gated output norm (``linear_value_head_dim``) and ``out_proj`` (value_dim ->
    hidden)."""
    h = m.hidden_size
    kd, vd, vh = linear_dims(m)
    conv = (2 * kd + vd) * m.linear_conv_kernel_dim
    return (h * (2 * kd + 2 * vd) + h * 2 * vh + conv + 2 * vh + m.linear_value_head_dim
            + vd * h)


def linear_state_values(m, tp: int = 1) -> int:
    """Values of the fixed state one sequence holds in ONE linear-attention layer on one of
    ``tp`` GPUs: the recurrent state ``value_heads x key_head_dim x value_head_dim`` and the
    convolution's last ``kernel - 1`` inputs of ``2 key_dim + value_dim`` channels."""
    kd, vd, vh = linear_dims(m, tp)
    return (vh * m.linear_key_head_dim * m.linear_value_head_dim
            + max(0, m.linear_conv_kernel_dim - 1) * (2 * kd + vd))


def local_tokens(m, seq_len: int) -> int:
    """Tokens of a sequence of ``seq_len`` one local attention layer holds (and attends over):
    ``min(L, sliding_window)``, or the current chunk's ``(L - 1) % C + 1``; 0 tokens, or a
    model without such layers: 0."""
    if seq_len <= 0:
        return 0
    if m.sliding_window:
        return min(seq_len, m.sliding_window)
    if m.attention_chunk_size:
        return (seq_len - 1) % m.attention_chunk_size + 1
    return 0
