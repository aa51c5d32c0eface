"""Reading a Hugging Face ``config.json``: the fields of a :class:`~sim.specs.models.ModelConfig`
from the names each model family uses for them.

:func:`model_fields` maps a config dict to ``ModelConfig``'s keyword arguments. Llama-style
names are read first, then each family's own: GPT-J (``n_embd``, ``n_layer``, ``n_head``,
``n_inner``, ``n_positions``), Falcon (``n_head_kv`` / ``num_kv_heads``, ``multi_query``,
``parallel_attn``, ``new_decoder_architecture``, ``num_ln_in_parallel_attn``,
``ffn_hidden_size``), GPT-NeoX (``use_parallel_residual``), OPT (``ffn_dim``), MoE
(``num_experts`` / ``n_routed_experts``, ``moe_intermediate_size``, ``n_shared_experts``,
``first_k_dense_replace``) and MLA (``kv_lora_rank``, ``q_lora_rank``, ``qk_nope_head_dim``,
``qk_rope_head_dim``, ``v_head_dim``), and the layer types of :mod:`sim.specs.layers`:
``layer_types`` (gpt-oss, Qwen3-Next, recent Gemma 3), ``sliding_window`` with Gemma's
``sliding_window_pattern`` (Gemma 3: 6, Gemma 2: 2 by default) or on every layer (Mistral; a
``use_sliding_window`` false turns it off, as Qwen2's configs say), Llama 4's
``attention_chunk_size`` with ``no_rope_layers`` (default: every 4th layer global),
``interleave_moe_layer_step``, ``intermediate_size_mlp`` and its shared expert, Qwen3-Next's
``linear_*`` Gated DeltaNet fields, ``full_attention_interval``,
``shared_expert_intermediate_size`` and ``attn_output_gate``. A multimodal config's
``text_config`` is the model (its fields over the top level's). A ``quantization_config`` is
read only for an MXFP4 checkpoint, whose routed experts alone are MXFP4 (gpt-oss; its
``modules_to_not_convert``: attention, router, embeddings, LM head): ``expert_dtype`` "mxfp4",
the precision a run's ``expert_weight_dtype="checkpoint"`` takes; every other weight precision
is the run's ``weight_dtype``.

Invariants: a field the dict omits takes Hugging Face transformers' default for its
``model_type`` (a 4 h MLP for GPT-J and Falcon, q/k/v biases for Qwen2, GPT-NeoX, OPT and Phi,
tied embeddings for OPT and Falcon), never a guess; the block shape (``gated_mlp``,
``parallel_attn``, ``norms_per_layer``) follows ``model_type`` (:func:`_block_shape`) unless
the dict names it in sim's own words, so ``dataclasses.asdict`` of a ``ModelConfig`` reads back
to the same model; a missing required field is a ``ValueError`` naming it. Validation of the
values is ``ModelConfig``'s (this module imports nothing of the package). What sim cannot price
(an encoder-decoder, a state-space or Jamba-style model, an unknown layer kind, dense layers at
listed positions) is a one-line ``ValueError`` naming the field; any other ``model_type`` whose
fields it understands is read as a Llama-style decoder.
"""

from __future__ import annotations

import json
from pathlib import Path

# fields whose presence (truthy) sim cannot price: field -> what it means
_UNPRICED = {"is_encoder_decoder": "an encoder-decoder model",
             "layers_block_type": "a hybrid state-space (Jamba-style) model",
             "ssm_cfg": "a state-space (Mamba) model",
             "mamba_d_state": "a state-space (Mamba) model",
             "mlp_only_layers": "dense layers at listed positions"}
_LAYER_KINDS = {"full_attention": "full", "sliding_attention": "sliding",
                "chunked_attention": "chunked", "linear_attention": "linear"}
# transformers' defaults for fields a model_type's shipped configs omit
_TYPE_DEFAULTS = {"gemma3_text": {"vocab_size": 262208, "sliding_window": 4096,
                                  "sliding_window_pattern": 6, "tie_word_embeddings": True,
                                  "max_position_embeddings": 131072},
                  "gemma2": {"sliding_window_pattern": 2},
                  "llama4_text": {"vocab_size": 202048},
                  "qwen3_next": {"attn_output_gate": True, "full_attention_interval": 4}}


def is_config_path(value) -> bool:
    """Whether ``value`` names a ``config.json`` file: a ``Path``, or a string ending in
    ``.json`` or naming an existing file."""
    if isinstance(value, Path):
        return True
    return isinstance(value, str) and (value.strip().lower().endswith(".json")
                                       or Path(value).is_file())


def read_hf_config(path_or_dict) -> tuple:
    """``(config dict, default name)`` of a ``config.json`` path or dict; a multimodal config's
    ``text_config`` over its top level. The name: the dict's ``_name_or_path``'s last part, else
    the folder's name of a ``config.json``, the file's stem of another name, else None."""
    name = None
    if isinstance(path_or_dict, (str, Path)):
        path = Path(path_or_dict)
        if path.is_dir():
            inside = " (give the config.json in it)" if (path / "config.json").is_file() else ""
            raise ValueError(f"model config {str(path)!r}: a folder, not a JSON file{inside}")
        if not path.is_file():
            raise ValueError(f"model config {str(path)!r}: no such file")
        try:
            config = json.loads(path.read_text())
        except (ValueError, OSError) as e:
            raise ValueError(f"model config {str(path)!r}: not a JSON file ({e})") from None
        if not isinstance(config, dict):
            raise ValueError(f"model config {str(path)!r}: not a JSON object")
        # the folder of a config.json (Hugging Face's layout: MODEL/config.json), else the
        # file's own name (llama-8b.json: llama-8b)
        name = (path.resolve().parent.name if path.name == "config.json" else path.stem) or None
    elif isinstance(path_or_dict, dict):
        config = path_or_dict
    else:
        raise TypeError(f"config must be a path or a dict, got {type(path_or_dict).__name__}")
    text = config.get("text_config")
    if isinstance(text, dict):
        config = {**{k: v for k, v in config.items() if k != "text_config"}, **text}
    given = config.get("_name_or_path") or config.get("name")
    return config, (str(given).rstrip("/").split("/")[-1] if given else name)


def model_fields(config: dict, name: str | None = None) -> dict:
    """``ModelConfig``'s keyword arguments from a Hugging Face ``config.json``-style dict (see
    the module docstring); ``name``, else the dict's ``name`` or ``_name_or_path``, else
    ``"custom"``."""
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")

    model_type = str(config.get("model_type") or "").lower()
    for k, what in _UNPRICED.items():
        if config.get(k):
            raise ValueError(f"config field {k} ({what}) cannot be priced by sim")
    if "mamba" in model_type or model_type in ("rwkv", "xlstm"):
        raise ValueError(f"config field model_type {model_type!r} (a recurrent model) cannot "
                         "be priced by sim")
    config = {**_TYPE_DEFAULTS.get(model_type, {}), **config}

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
    kinds = _layer_fields(config, model_type, fields["num_hidden_layers"])
    shared = (config.get("n_shared_experts") or 0) if experts else 0
    if experts and config.get("shared_expert_intermediate_size"):
        shared = _shared_experts(config["shared_expert_intermediate_size"], intermediate)
    elif experts and model_type == "llama4_text":
        shared = 1  # Llama4TextMoe: one shared expert of the routed width
    if experts and config.get("intermediate_size_mlp"):
        dense_intermediate = config["intermediate_size_mlp"]  # Llama 4's dense layers
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
        n_shared_experts=shared,
        first_k_dense_replace=(config.get("first_k_dense_replace") or 0) if experts else 0,
        dense_intermediate_size=dense_intermediate,
        q_lora_rank=(config.get("q_lora_rank") or 0) if mla else 0,
        kv_lora_rank=config.get("kv_lora_rank") or 0,
        qk_nope_head_dim=(config.get("qk_nope_head_dim") or 0) if mla else 0,
        qk_rope_head_dim=(config.get("qk_rope_head_dim") or 0) if mla else 0,
        v_head_dim=(config.get("v_head_dim") or 0) if mla else 0,
        attn_output_gate=as_bool(config.get("attn_output_gate", False)),
        interleave_moe_layer_step=(config.get("interleave_moe_layer_step") or 0)
        if experts else 0,
        expert_dtype=(config.get("expert_dtype") or _checkpoint_experts(config)) if experts
        else "",
        **kinds,
    )


def _checkpoint_experts(config: dict) -> str:
    """The routed experts' own precision from a ``quantization_config``: "mxfp4" for
    ``quant_method`` "mxfp4", which transformers applies to the experts alone (its
    ``Mxfp4HfQuantizer`` swaps in ``Mxfp4GptOssExperts``; attention, router, embeddings and LM
    head stay bf16, gpt-oss's ``modules_to_not_convert``), unless that list names the experts;
    "" for none or another method (its precision is the run's ``weight_dtype``)."""
    q = config.get("quantization_config")
    if not isinstance(q, dict) or str(q.get("quant_method", "")).lower() != "mxfp4":
        return ""
    kept = " ".join(str(m) for m in q.get("modules_to_not_convert") or ())
    return "" if "experts" in kept else "mxfp4"


def _shared_experts(width, expert_width) -> int:
    """Shared experts of a ``shared_expert_intermediate_size`` (Qwen-MoE: one expert that wide,
    priced as that many experts of the routed width)."""
    if not expert_width or width % expert_width:
        raise ValueError(f"config field shared_expert_intermediate_size {width} must be a "
                         f"multiple of the expert width {expert_width}")
    return width // expert_width


def _layer_fields(config: dict, model_type: str, num_layers) -> dict:
    """The layer-type fields of :mod:`sim.specs.layers` (see the module docstring)."""
    out = {}
    types = config.get("layer_types")
    interval = None
    if types:
        if not isinstance(types, list) or len(types) != num_layers:
            raise ValueError(f"config field layer_types must list num_hidden_layers="
                             f"{num_layers} layer kinds, got {types!r}"[:200])
        unknown = sorted(set(types) - set(_LAYER_KINDS))
        if unknown:
            raise ValueError(f"config field layer_types: kind(s) {unknown} cannot be priced "
                             f"(known: {list(_LAYER_KINDS)})")
        local = sorted(set(types) - {"full_attention"})
        if len(local) > 1:
            raise ValueError(f"config field layer_types: more than one local kind {local}")
        interval = _interval([t == "full_attention" for t in types], "layer_types")
        if not local:
            return out  # every layer full: a window in the config is unused
        kind = _LAYER_KINDS[local[0]]
    elif config.get("attention_chunk_size"):
        kind = "chunked"
        rope = config.get("no_rope_layers")
        if rope:  # Llama 4: the NoPE layers are the global ones
            interval = _interval([not r for r in rope], "no_rope_layers")
        elif config.get("full_attention_interval") is None and model_type == "llama4_text":
            interval = 4  # Llama4TextConfig's default no_rope_layers: every 4th layer
    elif config.get("linear_num_value_heads"):
        kind = "linear"
    elif config.get("sliding_window") and config.get("use_sliding_window", True):
        kind = "sliding"
        if config.get("use_sliding_window") and config.get("max_window_layers") is not None:
            if config["max_window_layers"] >= (num_layers or 0):
                return out  # Qwen2: layers from max_window_layers on slide: none
            raise ValueError("config field max_window_layers: sliding windows on some layers "
                             "by position (Qwen2's) cannot be priced")
        interval = config.get("sliding_window_pattern")
    else:
        return out
    if interval is None:
        interval = config.get("full_attention_interval") or 0
    out["full_attention_interval"] = interval
    if kind == "sliding":
        out["sliding_window"] = config.get("sliding_window") or 0
        if not out["sliding_window"]:
            raise ValueError("config field sliding_window is required by sliding_attention "
                             "layers")
    elif kind == "chunked":
        out["attention_chunk_size"] = config.get("attention_chunk_size") or 0
        if not out["attention_chunk_size"]:
            raise ValueError("config field attention_chunk_size is required by "
                             "chunked_attention layers")
    else:
        for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                  "linear_value_head_dim"):
            if not config.get(k):
                raise ValueError(f"config field {k} is required by linear_attention layers")
            out[k] = config[k]
        out["linear_conv_kernel_dim"] = config.get("linear_conv_kernel_dim") or 0
    return out


def _interval(full: list, field: str) -> int:
    """Every N-th layer full (True), N; 0 when none; an error naming ``field`` otherwise."""
    where = [i for i, f in enumerate(full) if f]
    if not where:
        return 0
    n = len(full) // len(where)
    if where != [i for i in range(len(full)) if (i + 1) % n == 0]:
        raise ValueError(f"config field {field}: full-attention layers {where[:8]}... are not "
                         "every N-th layer, which is all sim prices")
    return n



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
