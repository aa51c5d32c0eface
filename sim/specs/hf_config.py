"""Reading a Hugging Face ``config.json``: the fields of a :class:`~sim.specs.models.ModelConfig`
from the names each model family uses for them.

:func:`model_fields` maps a config dict to ``ModelConfig``'s keyword arguments. Llama-style
names are read first, then each family's own: GPT-J (``n_embd``, ``n_layer``, ``n_head``,
``n_inner``, ``n_positions``), Falcon (``n_head_kv`` / ``num_kv_heads``, ``multi_query``,
``parallel_attn``, ``new_decoder_architecture``, ``num_ln_in_parallel_attn``,
``ffn_hidden_size``), GPT-NeoX (``use_parallel_residual``), OPT (``ffn_dim``), MoE
(``num_experts`` / ``n_routed_experts``, ``moe_intermediate_size``, ``n_shared_experts``,
``first_k_dense_replace``) and MLA (``kv_lora_rank``, ``q_lora_rank``, ``qk_nope_head_dim``,
``qk_rope_head_dim``, ``v_head_dim``).

Invariants: a field the dict omits takes Hugging Face transformers' default for its
``model_type`` (a 4 h MLP for GPT-J and Falcon, q/k/v biases for Qwen2, GPT-NeoX, OPT and Phi,
tied embeddings for OPT and Falcon), never a guess; the block shape (``gated_mlp``,
``parallel_attn``, ``norms_per_layer``) follows ``model_type`` (:func:`_block_shape`) unless
the dict names it in sim's own words, so ``dataclasses.asdict`` of a ``ModelConfig`` reads back
to the same model; a missing required field is a ``ValueError`` naming it. Validation of the
values is ``ModelConfig``'s (this module imports nothing of the package).
"""

from __future__ import annotations


def model_fields(config: dict, name: str | None = None) -> dict:
    """``ModelConfig``'s keyword arguments from a Hugging Face ``config.json``-style dict (see
    the module docstring); ``name``, else the dict's ``name`` or ``_name_or_path``, else
    ``"custom"``."""
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")

    def get(*keys):
        for k in keys:
            if config.get(k) not in (None, ""):
                return config[k]
        return None

    hidden = get("hidden_size", "n_embd", "n_embed")
    fields = {"num_hidden_layers": get("num_hidden_layers", "n_layer"),
              "hidden_size": hidden,
              "num_attention_heads": get("num_attention_heads", "n_head"),
              "intermediate_size": get("intermediate_size", "ffn_dim", "n_inner",
                                       "ffn_hidden_size"),
              "vocab_size": get("vocab_size")}
    model_type = str(config.get("model_type") or "").lower()
    if fields["intermediate_size"] is None and hidden is not None and \
            model_type in _FFN_4X_BY_DEFAULT:
        fields["intermediate_size"] = 4 * hidden  # n_inner / ffn_hidden_size null: 4 h
    missing = [k for k, v in fields.items() if v is None]
    if missing:
        raise ValueError(f"config is missing required field(s): {', '.join(missing)}")
    experts = config.get("num_local_experts") or config.get("num_experts") or \
        config.get("n_routed_experts") or 0
    intermediate = fields["intermediate_size"]
    dense_intermediate = config.get("dense_intermediate_size") or 0
    if experts and config.get("moe_intermediate_size"):
        intermediate = config["moe_intermediate_size"]
        if config.get("first_k_dense_replace"):
            dense_intermediate = fields["intermediate_size"]
    shape = _block_shape(config, model_type)
    shape.update({k: config[k] for k in shape if config.get(k) is not None})  # sim's names
    bias = config.get("attention_qkv_bias", config.get("attention_bias"))
    if bias is None:
        bias = model_type in _QKV_BIAS_BY_DEFAULT
    if model_type == "opt" and config.get("enable_bias") is not None:
        bias = config["enable_bias"]
    if model_type in _FALCON_TYPES and config.get("bias") is not None:
        bias = config["bias"]
    tie = config.get("tie_word_embeddings")
    if tie is None:
        tie = model_type in _TIED_BY_DEFAULT
    mla = bool(config.get("kv_lora_rank"))
    return dict(
        name=name or config.get("name") or config.get("_name_or_path") or "custom",
        num_hidden_layers=fields["num_hidden_layers"],
        hidden_size=hidden,
        num_attention_heads=fields["num_attention_heads"],
        num_key_value_heads=_kv_heads(config, model_type, fields["num_attention_heads"]),
        intermediate_size=intermediate,
        vocab_size=fields["vocab_size"],
        head_dim=0 if mla else config.get("head_dim") or 0,
        tie_word_embeddings=as_bool(tie),
        num_local_experts=experts,
        num_experts_per_tok=config.get("num_experts_per_tok") or 0,
        attention_qkv_bias=as_bool(bias),
        max_position_embeddings=get("max_position_embeddings", "n_positions") or 0,
        **shape,
        n_shared_experts=(config.get("n_shared_experts") or 0) if experts else 0,
        first_k_dense_replace=(config.get("first_k_dense_replace") or 0) if experts else 0,
        dense_intermediate_size=dense_intermediate,
        q_lora_rank=(config.get("q_lora_rank") or 0) if mla else 0,
        kv_lora_rank=config.get("kv_lora_rank") or 0,
        qk_nope_head_dim=(config.get("qk_nope_head_dim") or 0) if mla else 0,
        qk_rope_head_dim=(config.get("qk_rope_head_dim") or 0) if mla else 0,
        v_head_dim=(config.get("v_head_dim") or 0) if mla else 0,
    )



# model_type families (Hugging Face transformers' defaults for fields their configs omit)
_FALCON_TYPES = ("falcon", "refinedweb", "refinedwebmodel", "rw")
_NON_GATED_TYPES = ("gptj", "gpt_neox", "opt", "phi") + _FALCON_TYPES
_FFN_4X_BY_DEFAULT = ("gptj",) + _FALCON_TYPES
_QKV_BIAS_BY_DEFAULT = ("qwen2", "gpt_neox", "opt", "phi")
_TIED_BY_DEFAULT = ("opt",) + _FALCON_TYPES  # PretrainedConfig's default, not overridden


def _falcon_new_architecture(config: dict, model_type: str) -> bool:
    """Falcon-40B/180B's decoder (``new_decoder_architecture``; the 40B's original
    ``RefinedWeb`` configs leave it out and mean it, as transformers' converter reads them)."""
    return as_bool(config.get("new_decoder_architecture", model_type == "refinedweb"))


def _kv_heads(config: dict, model_type: str, heads: int) -> int:
    """KV heads; Falcon: ``num_kv_heads`` with the new decoder architecture, else 1 if
    ``multi_query`` (Falcon-7B's config says 71 but the model has one), else all heads."""
    if model_type in _FALCON_TYPES:
        if _falcon_new_architecture(config, model_type):
            return config.get("num_kv_heads") or config.get("n_head_kv") or heads
        return 1 if as_bool(config.get("multi_query", True)) else heads
    return config.get("num_key_value_heads") or heads


def _block_shape(config: dict, model_type: str) -> dict:
    """``gated_mlp``, ``parallel_attn`` and ``norms_per_layer`` of a ``config.json``:
    GPT-J and Phi: parallel, one norm; GPT-NeoX: parallel (``use_parallel_residual``, default
    true), two norms; Falcon: ``parallel_attn`` (default true) with one norm, or two with
    ``new_decoder_architecture`` (``num_ln_in_parallel_attn``, default 2); OPT: sequential.
    All of these have non-gated MLPs; every other ``model_type`` is read as Llama-style."""
    gated = model_type not in _NON_GATED_TYPES
    parallel, norms = False, 2
    if model_type in ("gptj", "phi"):
        parallel, norms = True, 1
    elif model_type == "gpt_neox":
        parallel = as_bool(config.get("use_parallel_residual", True))
    elif model_type in _FALCON_TYPES:
        if _falcon_new_architecture(config, model_type):
            parallel, norms = True, config.get("num_ln_in_parallel_attn") or 2
        else:
            parallel = as_bool(config.get("parallel_attn", True))
            norms = 1 if parallel else 2
    return {"gated_mlp": gated, "parallel_attn": parallel, "norms_per_layer": norms}


def as_bool(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)
