"""Model architectures: a frozen dataclass, presets and parameter counts (a Hugging Face
``config.json`` is read by :mod:`sim.specs.hf_config`).

Presets are read from ``sim/data/models.csv`` (transcribed from each model's Hugging Face
``config.json``; sources are in the file's ``source`` column and in ``sim/data/NOTICE.md``).
Parameter counts are *computed* from the architecture:

    embeddings (vocab x hidden, plus an untied LM head)
    + per layer: attention (Q, K, V, O projections (+ q/k/v biases); MLA: the low-rank Q and
      KV projections, their two norms and the up-projections), the MLP (gated: 3 x hidden x
      width, gate/up/down; non-gated: 2 x hidden x width, fc1/fc2) x (routed + shared experts;
      1 for a dense layer), the MoE router, ``norms_per_layer`` norms of ``hidden`` weights
    + the final norm.

Not counted (< 0.1 % of any preset's total): biases other than q/k/v, LayerNorm biases, the
LM-head bias, Qwen3's per-head q/k norms, OPT's learned position embeddings. Nor is
DeepSeek-V3's multi-token-prediction module (11.5 B; not part of the 671 B main model).

Block shapes (``gated_mlp``, ``parallel_attn``, ``norms_per_layer``):

    sequential (Llama, OPT):   x = x + attn(norm1(x));  x = x + mlp(norm2(x))
    parallel (GPT-J, Falcon, GPT-NeoX, Phi-2):  x = x + attn(n1(x)) + mlp(n2(x)),
        n1 = n2 (one norm) for GPT-J, Falcon-7B and Phi-2; two norms for GPT-NeoX and
        Falcon-40B/180B (``new_decoder_architecture``)
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from ..checks import did_you_mean, positive_int
from . import layers
from .hf_config import as_bool, is_config_path, model_fields, read_hf_config

EXPERT_DTYPES = ("", "fp8", "int4", "fp4", "nvfp4", "mxfp4")  # a checkpoint's experts' own


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A decoder-only transformer, in Hugging Face ``config.json`` vocabulary.

    ``intermediate_size`` is the MLP width of a dense model or of one routed expert (HF
    ``moe_intermediate_size`` when the config has it). DeepSeek-style MoE: ``n_shared_experts``
    always-on experts of that width, and the first ``first_k_dense_replace`` layers dense with
    ``dense_intermediate_size`` (0: ``intermediate_size``). Multi-head latent attention (MLA,
    DeepSeek-V2/V3) when ``kv_lora_rank`` > 0: the KV cache holds one latent of
    ``kv_lora_rank + qk_rope_head_dim`` values per token and layer; ``head_dim`` is then the
    query/key head size ``qk_nope_head_dim + qk_rope_head_dim``.
    """

    name: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    head_dim: int = 0  # 0: hidden_size // num_attention_heads (MLA: qk_nope + qk_rope)
    tie_word_embeddings: bool = False
    num_local_experts: int = 0  # 0: dense
    num_experts_per_tok: int = 0
    attention_qkv_bias: bool = False
    max_position_embeddings: int = 0  # 0: unknown
    gated_mlp: bool = True  # False: fc1 -> act -> fc2 (GPT-J, Falcon, GPT-NeoX, OPT, Phi-2)
    parallel_attn: bool = False  # attention and MLP both read the layer input
    norms_per_layer: int = 2  # 1: attention and MLP share one norm (needs parallel_attn)
    n_shared_experts: int = 0
    first_k_dense_replace: int = 0
    dense_intermediate_size: int = 0
    q_lora_rank: int = 0  # MLA; 0: a full-rank q_proj
    kv_lora_rank: int = 0  # MLA when > 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # layer types (sim.specs.layers): a local kind and which layers are full
    sliding_window: int = 0  # sliding-window attention over this many tokens
    attention_chunk_size: int = 0  # chunked local attention (Llama 4)
    full_attention_interval: int = 0  # every N-th layer full; 0: all layers of the local kind
    linear_num_key_heads: int = 0  # linear attention (Gated DeltaNet, Qwen3-Next)
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    attn_output_gate: bool = False  # q_proj also projects a sigmoid gate of the output
    interleave_moe_layer_step: int = 0  # 0, 1: every layer MoE; N: every N-th (Llama 4)
    # the checkpoint's routed experts in their own precision (gpt-oss: mxfp4, the rest bf16);
    # "": as the other weights. Used when a run asks for it (expert_weight_dtype "checkpoint")
    expert_dtype: str = ""

    def __post_init__(self):
        for f in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                  "num_key_value_heads", "intermediate_size", "vocab_size", "norms_per_layer"):
            object.__setattr__(self, f, positive_int(f, getattr(self, f)))
        for f in ("head_dim", "num_local_experts", "num_experts_per_tok", "max_position_embeddings",
                  "n_shared_experts", "first_k_dense_replace", "dense_intermediate_size",
                  "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                  "v_head_dim", "sliding_window", "attention_chunk_size",
                  "full_attention_interval", "linear_num_key_heads", "linear_num_value_heads",
                  "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
                  "interleave_moe_layer_step"):
            object.__setattr__(self, f, positive_int(f, getattr(self, f), allow_zero=True))
        if self.kv_lora_rank:
            self._check_mla()
        if self.head_dim == 0:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(
                    f"head_dim is required: hidden_size {self.hidden_size} is not divisible by "
                    f"num_attention_heads {self.num_attention_heads}")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads {self.num_key_value_heads} must divide "
                f"num_attention_heads {self.num_attention_heads}")
        if self.num_local_experts and not 0 < self.num_experts_per_tok <= self.num_local_experts:
            raise ValueError(
                f"num_experts_per_tok must be in 1..num_local_experts={self.num_local_experts}, "
                f"got {self.num_experts_per_tok}")
        if not self.num_local_experts and (self.n_shared_experts or self.first_k_dense_replace):
            raise ValueError("n_shared_experts and first_k_dense_replace need num_local_experts "
                             f"> 0, got {self.n_shared_experts} and {self.first_k_dense_replace}")
        if self.first_k_dense_replace > self.num_hidden_layers:
            raise ValueError(f"first_k_dense_replace must be at most num_hidden_layers="
                             f"{self.num_hidden_layers}, got {self.first_k_dense_replace}")
        if self.norms_per_layer > 2 or self.norms_per_layer == 1 and not self.parallel_attn:
            raise ValueError(f"norms_per_layer must be 2, or 1 with parallel_attn, got "
                             f"{self.norms_per_layer} (parallel_attn={self.parallel_attn})")
        if self.expert_dtype not in EXPERT_DTYPES or self.expert_dtype and not \
                self.num_local_experts:
            raise ValueError(f"expert_dtype must be one of {EXPERT_DTYPES} (a MoE model's), got "
                             f"{self.expert_dtype!r}")
        layers.check_layers(self)

    def _check_mla(self):
        if not self.qk_rope_head_dim or not self.v_head_dim:
            raise ValueError(f"an MLA model (kv_lora_rank {self.kv_lora_rank}) needs "
                             f"qk_rope_head_dim and v_head_dim > 0, got {self.qk_rope_head_dim} "
                             f"and {self.v_head_dim}")
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.head_dim not in (0, qk):
            raise ValueError(f"head_dim of an MLA model must be qk_nope_head_dim + "
                             f"qk_rope_head_dim = {qk}, got {self.head_dim}")
        object.__setattr__(self, "head_dim", qk)

    # -- derived sizes -------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_local_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """K (or V) width of one token (MHA/GQA; an MLA model caches :attr:`kv_latent_size`)."""
        return self.num_key_value_heads * self.head_dim

    @property
    def attn_out_size(self) -> int:
        """Width of the attention output that O projects (MLA: heads x v_head_dim)."""
        return self.num_attention_heads * (self.v_head_dim if self.is_mla else self.head_dim)

    @property
    def kv_latent_size(self) -> int:
        """Values an MLA layer caches per token: ``kv_lora_rank + qk_rope_head_dim``."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def dense_width(self) -> int:
        """MLP width of the ``first_k_dense_replace`` dense layers of a MoE model."""
        return self.dense_intermediate_size or self.intermediate_size

    @property
    def num_moe_layers(self) -> int:
        """MoE layers: after the ``first_k_dense_replace`` dense ones, every layer, or with
        ``interleave_moe_layer_step`` N > 1 every N-th (layer i when (i + 1) % N == 0)."""
        if not self.is_moe:
            return 0
        n = self.interleave_moe_layer_step
        first = self.first_k_dense_replace
        if n <= 1:
            return self.num_hidden_layers - first
        return sum(1 for i in range(first, self.num_hidden_layers) if (i + 1) % n == 0)

    @property
    def num_dense_layers(self) -> int:
        """Layers of a MoE model with a dense MLP of :attr:`dense_width` (0 for a dense model,
        whose layers are all of ``intermediate_size``)."""
        return self.num_hidden_layers - self.num_moe_layers if self.is_moe else 0

    def layer_types(self) -> tuple:
        """Each layer's kind (:mod:`sim.specs.layers`: full, sliding, chunked, linear)."""
        return layers.layer_types(self)

    def layer_counts(self) -> dict:
        """``{kind: layers}`` of each kind present (:func:`sim.specs.layers.layer_counts`)."""
        return layers.layer_counts(self)

    @property
    def has_local_layers(self) -> bool:
        """Some layers attend over a window or chunk, or linearly (not every layer full)."""
        return layers.local_kind(self) is not None

    def kv_cache_values_per_token(self, tensor_parallel: int = 1) -> int:
        """Values one token adds to the KV cache of ONE GPU, over all layers.

        MHA/GQA: ``2 (K, V) x layers x kv_heads x head_dim``, the KV heads sharded over
        ``tensor_parallel`` GPUs or replicated when fewer (vLLM's ``max(1, kv_heads // tp)``).
        MLA: ``layers x (kv_lora_rank + qk_rope_head_dim)``: one latent, no separate K and V,
        replicated on every GPU of the group (vLLM and SGLang keep the whole latent per GPU).
        Linear-attention layers hold no per-token cache (:meth:`kv_cache_values`); sliding and
        chunked layers count here until their window fills."""
        tp = positive_int("tensor_parallel", tensor_parallel)
        if self.is_mla:
            return self.num_hidden_layers * self.kv_latent_size
        n = self.num_hidden_layers - self.layer_counts().get(layers.LINEAR, 0) \
            if self.has_local_layers else self.num_hidden_layers
        return n * self.kv_values_per_token_per_layer(tp)

    def kv_values_per_token_per_layer(self, tensor_parallel: int = 1) -> int:
        """Values one token adds to ONE attention layer's KV cache on one GPU (K and V of
        its KV heads, ``2 x kv_heads x head_dim``; MLA: the latent)."""
        if self.is_mla:
            return self.kv_latent_size
        return 2 * max(1, self.num_key_value_heads // tensor_parallel) * self.head_dim

    def kv_cache_values(self, seq_len: int, tensor_parallel: int = 1) -> int:
        """Values ONE sequence of ``seq_len`` tokens holds on one GPU, over all layers: full
        layers ``seq_len`` tokens each, sliding/chunked ones what their window keeps
        (:func:`sim.specs.layers.local_tokens`), linear ones their fixed state (0 tokens: 0)."""
        tp = positive_int("tensor_parallel", tensor_parallel)
        seq_len = positive_int("seq_len", seq_len, allow_zero=True)
        if not self.has_local_layers:
            return seq_len * self.kv_cache_values_per_token(tp)
        counts = self.layer_counts()
        per = self.kv_values_per_token_per_layer(tp)
        values = counts.get(layers.FULL, 0) * seq_len * per
        local = counts.get(layers.SLIDING, 0) + counts.get(layers.CHUNKED, 0)
        values += local * layers.local_tokens(self, seq_len) * per
        if seq_len:
            values += counts.get(layers.LINEAR, 0) * layers.linear_state_values(self, tp)
        return values

    def attention_params_per_layer(self) -> int:
        h = self.hidden_size
        if self.is_mla:
            heads = self.num_attention_heads
            q = (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.q_size
                 if self.q_lora_rank else h * self.q_size)  # (+ q_a_layernorm)
            kv = (h * self.kv_latent_size + self.kv_lora_rank  # kv_a_proj_with_mqa, its norm
                  + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim))
            return q + kv + self.attn_out_size * h
        params = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        if self.attn_output_gate:  # q_proj's second half: the gate
            params += h * self.q_size
        if self.attention_qkv_bias:
            params += self.q_size + 2 * self.kv_size
        return params

    def mlp_params(self, width: int) -> int:
        """Weights of one MLP (or expert) of ``width``: 3 h w gated, 2 h w non-gated."""
        return (3 if self.gated_mlp else 2) * self.hidden_size * width

    def mlp_params_per_expert(self) -> int:
        return self.mlp_params(self.intermediate_size)

    def _layer_params(self, experts: int) -> int:
        """A layer's MLP (MoE: experts, shared experts, router) and norms."""
        router = self.hidden_size * self.num_local_experts if self.is_moe else 0
        norms = self.norms_per_layer * self.hidden_size
        return ((experts + self.n_shared_experts) * self.mlp_params_per_expert()
                + router + norms)

    def _dense_layer_params(self) -> int:
        return self.mlp_params(self.dense_width) + self.norms_per_layer * self.hidden_size

    def _attention_params(self) -> int:
        """Every layer's attention (a linear-attention layer's own weights, sim.specs.layers)."""
        linear = self.layer_counts().get(layers.LINEAR, 0) if self.has_local_layers else 0
        return ((self.num_hidden_layers - linear) * self.attention_params_per_layer()
                + (linear * layers.linear_attention_params(self) if linear else 0))

    def _embedding_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        return emb if self.tie_word_embeddings else 2 * emb

    def _params(self, experts: int) -> int:
        dense = self.num_dense_layers
        return (self._embedding_params() + self._attention_params()
                + dense * self._dense_layer_params()
                + (self.num_hidden_layers - dense) * self._layer_params(experts)
                + self.hidden_size)

    def total_params(self) -> int:
        """All parameters (every expert of a MoE model)."""
        return self._params(self.num_local_experts or 1)

    def active_params(self) -> int:
        """Parameters touched per token (top-k and shared experts of a MoE model; both
        embedding matrices, as the existing presets count)."""
        return self._params(self.num_experts_per_tok or 1)

    @classmethod
    def from_hf_config(cls, config: dict, name: str | None = None) -> "ModelConfig":
        """Build from a Hugging Face ``config.json``-style dict: the fields
        :func:`sim.specs.hf_config.model_fields` reads (each family's names for them,
        transformers' defaults for the ones it omits); ``dataclasses.asdict`` of a
        ``ModelConfig`` reads back to the same model."""
        return cls(**model_fields(config, name))

    @classmethod
    def from_hf(cls, path_or_dict, name: str | None = None) -> "ModelConfig":
        """Build from a Hugging Face ``config.json`` as shipped: a file path or its dict (a
        multimodal config's ``text_config`` read as the model; see :mod:`sim.specs.hf_config`).
        A field it cannot price is a one-line ``ValueError`` naming it."""
        config, default_name = read_hf_config(path_or_dict)
        try:
            return cls(**model_fields(config, name or config.get("name") or default_name))
        except (ValueError, TypeError) as e:  # (a wrong type too: the file is named)
            if not isinstance(path_or_dict, (str, Path)):
                raise
            raise type(e)(f"model config {str(path_or_dict)!r}: {e}") from None


@lru_cache(maxsize=1)
def _preset_rows() -> dict:
    text = resources.files("sim").joinpath("data/models.csv").read_text()
    # every column named like a field; an empty cell takes the field's default
    kinds = {f.name: as_bool if type(f.default) is bool else str if type(f.default) is str
             else int for f in dataclasses.fields(ModelConfig) if f.name != "name"}
    rows = {}
    for row in csv.DictReader(text.splitlines()):
        cfg = ModelConfig(name=row["model"].lower(),
                          **{k: kind(row[k]) for k, kind in kinds.items() if row.get(k)})
        rows[cfg.name] = (cfg, row)
    return rows


def model_presets() -> list[str]:
    """Names accepted by :func:`get_model` (e.g. ``"llama-3.1-8b"``)."""
    return sorted(_preset_rows())


def reported_params(name: str) -> float:
    """The commonly reported parameter count of a preset (model cards), in parameters."""
    return float(_preset_rows()[get_model(name).name][1]["reported_params_billion"]) * 1e9


def reported_active_params(name: str) -> float | None:
    """The reported parameters activated per token of a MoE preset (None when not given)."""
    value = _preset_rows()[get_model(name).name][1].get("reported_active_params_billion")
    return float(value) * 1e9 if value else None


def get_model(config) -> ModelConfig:
    """Resolve a preset name, a Hugging Face id, a ``config.json`` path (a ``.json`` name or a
    file), a ``ModelConfig``, another dataclass or a dict."""
    if isinstance(config, ModelConfig):
        return config
    if is_config_path(config):
        return ModelConfig.from_hf(config)
    if isinstance(config, str):
        key = config.strip().lower()
        presets = _preset_rows()
        if key in presets:
            return presets[key][0]
        for cfg, row in presets.values():
            if row["hf_id"].split(" ")[0].lower() == key:
                return cfg
        if key and Path(config).is_dir():  # ('' is the working directory, not a folder given)
            raise ValueError(f"model {config!r} is a folder, not a preset: give the path of "
                             f"its config.json")
        raise ValueError(f"model {config!r} is not a preset{did_you_mean(config, model_presets())}"
                         f"; choose one of {model_presets()}")
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return ModelConfig.from_hf_config(dataclasses.asdict(config))
    if isinstance(config, dict):
        return ModelConfig.from_hf(config)
    raise TypeError(f"model config must be a preset name, ModelConfig, dataclass or dict, "
                    f"got {type(config).__name__}")
