import pytest

from sim import ModelConfig, get_model, kv_cache_bytes, model_presets
from sim.specs.models import reported_active_params, reported_params


# Falcon-40B's model card says "40B"; its config.json gives 41.30 B (+3.3 %), and no finer
# published total was found (see PUBLISHED below)
ROUNDED_NAME = {"falcon-40b": 0.035}


@pytest.mark.parametrize("name", model_presets())
def test_param_count_matches_published_size_within_2_percent(name):
    m = get_model(name)
    assert m.total_params() == pytest.approx(reported_params(name),
                                             rel=ROUNDED_NAME.get(name, 0.02))
    if reported_active_params(name):
        assert m.active_params() == pytest.approx(reported_active_params(name), rel=0.02)


# (preset, published total, published active per token, where it is published)
PUBLISHED = [
    ("gpt-j-6b", 6_053_381_344, None, "EleutherAI/gpt-j-6b model card: n_parameters"),
    ("falcon-7b", 7e9, None, "tiiuae/falcon-7b model card: '7B parameters'"),
    ("falcon-40b", 40e9, None, "tiiuae/falcon-40b model card: '40B parameters'"),
    ("falcon-180b", 180e9, None, "tiiuae/falcon-180B model card: '180B parameters'"),
    ("deepseek-v3", 671e9, 37e9, "DeepSeek-V3 Technical Report (arXiv:2412.19437): 671B total, "
                                 "37B activated for each token"),
    ("qwen3-8b", 8.2e9, None, "Qwen/Qwen3-8B model card: 8.2B"),
    ("qwen3-32b", 32.8e9, None, "Qwen/Qwen3-32B model card: 32.8B"),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, "Qwen/Qwen3-30B-A3B model card: 30.5B in total and 3.3B "
                                     "activated"),
    ("qwen3-235b-a22b", 235e9, 22e9, "Qwen/Qwen3-235B-A22B model card: 235B in total and 22B "
                                     "activated"),
]


@pytest.mark.parametrize("name, total, active, source", PUBLISHED,
                         ids=[p[0] for p in PUBLISHED])
def test_new_presets_match_their_published_counts(name, total, active, source):
    m = get_model(name)
    assert m.total_params() == pytest.approx(total, rel=ROUNDED_NAME.get(name, 0.02)), source
    assert reported_params(name) == pytest.approx(total)  # models.csv records the same figure
    if active:
        assert m.active_params() == pytest.approx(active, rel=0.02), source
        assert reported_active_params(name) == pytest.approx(active)
    else:
        assert m.active_params() == m.total_params()


def test_non_embedding_counts_match_the_qwen3_model_cards():
    # model cards: "Non-Embedding" 6.95B (8B), 31.2B (32B), 29.9B (30B-A3B); both untied matrices
    for name, non_embedding in (("qwen3-8b", 6.95e9), ("qwen3-32b", 31.2e9),
                                ("qwen3-30b-a3b", 29.9e9)):
        m = get_model(name)
        embeddings = 2 * m.vocab_size * m.hidden_size
        assert round((m.total_params() - embeddings) / 1e9, 2 if name == "qwen3-8b" else 1) \
            == non_embedding / 1e9


@pytest.mark.parametrize("name", model_presets())
def test_counts_and_kv_bytes_match_the_table_computed_by_hand(name):
    """models.csv's total_params / active_params / kv_cache_bytes_per_token_fp16 columns were
    computed separately (closed forms per family), not by ModelConfig."""
    from sim.specs.models import _preset_rows
    m, row = _preset_rows()[name]
    assert m.total_params() == int(row["total_params"])
    assert m.active_params() == int(row["active_params"])
    assert kv_cache_bytes(1, model=m) == int(row["kv_cache_bytes_per_token_fp16"])


def test_gpt_j_and_falcon_counts_by_hand():
    # GPT-J: untied, 28 x (4 h^2 attention + 2 h 4h fc_in/fc_out + one LayerNorm)
    h, v = 4096, 50400
    assert get_model("gpt-j-6b").total_params() == 2 * v * h + 28 * (4 * h * h + 2 * h * 4 * h
                                                                      + h) + h
    # Falcon-7B: tied, one KV head of 64 (multi-query), non-gated 4h MLP, one shared norm
    h, v = 4544, 65024
    qkv = h * (71 * 64 + 2 * 64)
    assert get_model("falcon-7b").total_params() == v * h + 32 * (qkv + h * h + 2 * h * 4 * h
                                                                   + h) + h


def test_deepseek_v3_count_by_hand():
    """MLA + 3 dense layers + 58 MoE layers of 256 routed and 1 shared expert."""
    h, heads, v = 7168, 128, 129280
    attention = (h * 1536 + 1536 + 1536 * heads * 192  # q_a, q_a_layernorm, q_b
                 + h * (512 + 64) + 512 + 512 * heads * (128 + 128)  # kv_a, its norm, kv_b
                 + heads * 128 * h)  # o_proj
    assert attention == 187_105_280 + 1536 + 512  # a public FLOPs-counter test: 187105280
    expert = 3 * h * 2048
    dense_layer = attention + 3 * h * 18432 + 2 * h
    moe_layer = attention + (256 + 1) * expert + 256 * h + 2 * h
    m = get_model("deepseek-v3")
    assert m.total_params() == 2 * v * h + 3 * dense_layer + 58 * moe_layer + h
    assert m.active_params() == (2 * v * h + 3 * dense_layer + h
                                 + 58 * (moe_layer - (256 - 8) * expert))
    # without the input embedding: the 36.6B of DeepSeek's README_WEIGHTS.md (Activation
    # Parameters, including the output head)
    assert round((m.active_params() - v * h) / 1e9, 1) == 36.6


def test_required_presets_exist():
    for name in ("llama-3.1-8b", "llama-3.1-70b", "llama-2-7b", "mistral-7b", "mixtral-8x7b",
                 "qwen2.5-7b"):
        assert name in model_presets()


def test_llama2_7b_param_count_by_hand():
    # 2 x vocab x h (untied) + 32 x (4 h^2 + 3 h I + 2 h) + h
    h, i, v = 4096, 11008, 32000
    assert get_model("llama-2-7b").total_params() == 2 * v * h + 32 * (4 * h * h + 3 * h * i + 2 * h) + h


def test_mixtral_active_params_use_top2_experts():
    m = get_model("mixtral-8x7b")
    assert m.active_params() == pytest.approx(12.9e9, rel=0.01)
    assert m.total_params() == pytest.approx(46.7e9, rel=0.01)


def test_bad_configs_raise_naming_the_field():
    with pytest.raises(ValueError, match="not a preset"):
        get_model("gpt-17")
    with pytest.raises(ValueError, match="missing required field.*hidden_size"):
        get_model({"num_hidden_layers": 2})
    with pytest.raises(ValueError, match="num_hidden_layers"):
        ModelConfig("x", 0, 64, 4, 4, 128, 100)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        ModelConfig("x", 2, 64, 4, 3, 128, 100)
    with pytest.raises(TypeError):
        get_model(3.5)


def test_bad_architecture_fields_raise_naming_the_field():
    with pytest.raises(ValueError, match="norms_per_layer"):
        ModelConfig("x", 2, 64, 4, 4, 128, 100, norms_per_layer=1)  # one norm needs parallel
    with pytest.raises(ValueError, match="norms_per_layer"):
        ModelConfig("x", 2, 64, 4, 4, 128, 100, norms_per_layer=3, parallel_attn=True)
    with pytest.raises(ValueError, match="qk_rope_head_dim"):
        ModelConfig("x", 2, 64, 4, 4, 128, 100, kv_lora_rank=16)
    with pytest.raises(ValueError, match="head_dim of an MLA model"):
        ModelConfig("x", 2, 64, 4, 4, 128, 100, kv_lora_rank=16, qk_nope_head_dim=8,
                    qk_rope_head_dim=4, v_head_dim=8, head_dim=16)
    with pytest.raises(ValueError, match="n_shared_experts"):
        ModelConfig("x", 2, 64, 4, 4, 128, 100, n_shared_experts=1)
    with pytest.raises(ValueError, match="first_k_dense_replace"):
        ModelConfig("x", 2, 64, 4, 4, 128, 100, num_local_experts=4, num_experts_per_tok=2,
                    first_k_dense_replace=3)


@pytest.mark.parametrize("field, value, said", [
    ("hidden_size", "4096", "hidden_size must be an integer, got '4096'"),
    ("intermediate_size", 1.5, "intermediate_size must be an integer, got 1.5"),
    ("num_hidden_layers", -2, "num_hidden_layers must be > 0, got -2"),
])
def test_from_hf_names_the_file_for_a_wrong_type_as_for_a_wrong_value(field, value, said,
                                                                       tmp_path):
    """A wrong type (a TypeError) once lost the file's name that a wrong value keeps."""
    import json
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512,
           "vocab_size": 1000, field: value}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises((TypeError, ValueError)) as e:
        ModelConfig.from_hf(str(path))
    assert str(e.value) == f"model config {str(path)!r}: {said}"
