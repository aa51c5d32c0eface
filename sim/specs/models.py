"""Model architectures: a frozen dataclass, presets and parameter counts.

Presets are read from ``sim/data/models.csv`` (copied from the team's reference table, which
transcribes each model's Hugging Face ``config.json``; sources are in the file's ``source``
column and in ``sim/data/NOTICE.md``). Parameter counts are *computed* from the architecture:

    embeddings (vocab x hidden, plus an untied LM head)
    + per layer: Q, K, V, O projections (+ q/k/v biases), E x 3 x hidden x intermediate (gated
      MLP; E = number of experts, 1 for a dense model), the MoE router, two RMSNorms
    + the final norm.
"""

from __future__ import annotations

import csv
import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from ..checks import positive_int


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A decoder-only transformer, in Hugging Face ``config.json`` vocabulary."""

    name: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    tie_word_embeddings: bool = False
    num_local_experts: int = 0  # 0: dense
    num_experts_per_tok: int = 0
    attention_qkv_bias: bool = False
    max_position_embeddings: int = 0  # 0: unknown

    def __post_init__(self):
        for f in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                  "num_key_value_heads", "intermediate_size", "vocab_size"):
            object.__setattr__(self, f, positive_int(f, getattr(self, f)))
        for f in ("head_dim", "num_local_experts", "num_experts_per_tok", "max_position_embeddings"):
            object.__setattr__(self, f, positive_int(f, getattr(self, f), allow_zero=True))
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

    # -- derived sizes -------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_local_experts > 0

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def attention_params_per_layer(self) -> int:
        h = self.hidden_size
        params = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        if self.attention_qkv_bias:
            params += self.q_size + 2 * self.kv_size
        return params

    def mlp_params_per_expert(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    def _layer_params(self, experts: int) -> int:
        router = self.hidden_size * self.num_local_experts if self.is_moe else 0
        norms = 2 * self.hidden_size
        return (self.attention_params_per_layer() + experts * self.mlp_params_per_expert()
                + router + norms)

    def _embedding_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        return emb if self.tie_word_embeddings else 2 * emb

    def total_params(self) -> int:
        """All parameters (every expert of a MoE model)."""
        experts = self.num_local_experts or 1
        return (self._embedding_params() + self.num_hidden_layers * self._layer_params(experts)
                + self.hidden_size)

    def active_params(self) -> int:
        """Parameters touched per token (top-k experts of a MoE model)."""
        experts = self.num_experts_per_tok or 1
        return (self._embedding_params() + self.num_hidden_layers * self._layer_params(experts)
                + self.hidden_size)

    @classmethod
    def from_hf_config(cls, config: dict, name: str | None = None) -> "ModelConfig":
        """Build from a Hugging Face ``config.json``-style dict."""
        if not isinstance(config, dict):
            raise TypeError(f"config must be a dict, got {type(config).__name__}")
        required = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                    "vocab_size")
        missing = [k for k in required if config.get(k) in (None, "")]
        if missing:
            raise ValueError(f"config is missing required field(s): {', '.join(missing)}")
        experts = config.get("num_local_experts") or config.get("num_experts") or 0
        intermediate = config["intermediate_size"]
        if experts and config.get("moe_intermediate_size"):
            intermediate = config["moe_intermediate_size"]
        bias = config.get("attention_qkv_bias", config.get("attention_bias"))
        if bias is None:
            bias = config.get("model_type") == "qwen2"
        return cls(
            name=name or config.get("name") or config.get("_name_or_path") or "custom",
            num_hidden_layers=config["num_hidden_layers"],
            hidden_size=config["hidden_size"],
            num_attention_heads=config["num_attention_heads"],
            num_key_value_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
            intermediate_size=intermediate,
            vocab_size=config["vocab_size"],
            head_dim=config.get("head_dim") or 0,
            tie_word_embeddings=_as_bool(config.get("tie_word_embeddings", False)),
            num_local_experts=experts,
            num_experts_per_tok=config.get("num_experts_per_tok") or 0,
            attention_qkv_bias=_as_bool(bias),
            max_position_embeddings=config.get("max_position_embeddings") or 0,
        )


def _as_bool(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


@lru_cache(maxsize=1)
def _preset_rows() -> dict:
    text = resources.files("sim").joinpath("data/models.csv").read_text()
    rows = {}
    for row in csv.DictReader(text.splitlines()):
        fields = {k: row[k] for k in (
            "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
            "head_dim", "intermediate_size", "vocab_size", "num_local_experts",
            "num_experts_per_tok", "max_position_embeddings")}
        cfg = ModelConfig(
            name=row["model"].lower(),
            tie_word_embeddings=_as_bool(row["tie_word_embeddings"]),
            attention_qkv_bias=_as_bool(row["attention_qkv_bias"]),
            **{k: int(v) for k, v in fields.items()},
        )
        rows[cfg.name] = (cfg, row)
    return rows


def model_presets() -> list[str]:
    """Names accepted by :func:`get_model` (e.g. ``"llama-3.1-8b"``)."""
    return sorted(_preset_rows())


def reported_params(name: str) -> float:
    """The commonly reported parameter count of a preset (model cards), in parameters."""
    return float(_preset_rows()[get_model(name).name][1]["reported_params_billion"]) * 1e9


def get_model(config) -> ModelConfig:
    """Resolve a preset name, a Hugging Face id, a ``ModelConfig``, another dataclass or a dict."""
    if isinstance(config, ModelConfig):
        return config
    if isinstance(config, str):
        key = config.strip().lower()
        presets = _preset_rows()
        if key in presets:
            return presets[key][0]
        for cfg, row in presets.values():
            if row["hf_id"].split(" ")[0].lower() == key:
                return cfg
        raise ValueError(f"model {config!r} is not a preset; choose one of {model_presets()}")
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return ModelConfig.from_hf_config(dataclasses.asdict(config))
    if isinstance(config, dict):
        return ModelConfig.from_hf_config(config)
    raise TypeError(f"model config must be a preset name, ModelConfig, dataclass or dict, "
                    f"got {type(config).__name__}")
