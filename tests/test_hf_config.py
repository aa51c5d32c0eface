"""sim/specs/hf_config.py: Hugging Face ``config.json`` dicts (as published on the Hub) read
to the presets they describe, each family's names and defaults, and a preset's own dict
read back to it."""

import dataclasses

import pytest

from sim import ModelConfig, get_model, model_presets


def test_hf_config_dict_and_dataclass_and_hf_id():
    cfg = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}
    m = get_model(cfg)
    assert m.total_params() == get_model("llama-3.1-8b").total_params()
    assert m.head_dim == 128

    @dataclasses.dataclass
    class MyCfg:
        num_hidden_layers: int = 32
        hidden_size: int = 4096
        num_attention_heads: int = 32
        num_key_value_heads: int = 8
        intermediate_size: int = 14336
        vocab_size: int = 128256

    assert get_model(MyCfg()).total_params() == m.total_params()
    assert get_model("meta-llama/Llama-3.1-8B") is get_model("llama-3.1-8b")


def test_qwen_model_type_implies_qkv_bias():
    cfg = {"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584,
           "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
           "vocab_size": 152064}
    assert get_model(cfg).total_params() == get_model("qwen2.5-7b").total_params()


# Hugging Face config.json files, trimmed to the fields that matter (values as published on the
# Hub; sources in sim/data/models.csv and sim/data/NOTICE.md)
GPT_J_6B = {"model_type": "gptj", "n_embd": 4096, "n_layer": 28, "n_head": 16, "n_inner": None,
            "n_positions": 2048, "rotary_dim": 64, "vocab_size": 50400,
            "tie_word_embeddings": False, "activation_function": "gelu_new"}
FALCON_7B = {"model_type": "falcon", "hidden_size": 4544, "num_hidden_layers": 32,
             "num_attention_heads": 71, "num_kv_heads": 71, "multi_query": True,
             "parallel_attn": True, "new_decoder_architecture": False, "bias": False,
             "vocab_size": 65024, "max_position_embeddings": 2048}
FALCON_7B_RW = {"model_type": "RefinedWebModel", "hidden_size": 4544, "n_layer": 32,
                "n_head": 71, "multi_query": True, "parallel_attn": True, "bias": False,
                "vocab_size": 65024}
FALCON_40B_RW = {"model_type": "RefinedWeb", "hidden_size": 8192, "n_layer": 60, "n_head": 128,
                 "n_head_kv": 8, "parallel_attn": True, "bias": False, "vocab_size": 65024}
FALCON_180B = {"model_type": "falcon", "hidden_size": 14848, "num_hidden_layers": 80,
               "num_attention_heads": 232, "num_kv_heads": 8, "multi_query": True,
               "new_decoder_architecture": True, "parallel_attn": True, "bias": False,
               "vocab_size": 65024, "max_position_embeddings": 2048}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
               "moe_intermediate_size": 2048, "num_hidden_layers": 61,
               "first_k_dense_replace": 3, "moe_layer_freq": 1, "num_attention_heads": 128,
               "num_key_value_heads": 128, "n_routed_experts": 256, "n_shared_experts": 1,
               "num_experts_per_tok": 8, "q_lora_rank": 1536, "kv_lora_rank": 512,
               "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "vocab_size": 129280, "max_position_embeddings": 163840,
               "tie_word_embeddings": False, "attention_bias": False}
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                 "moe_intermediate_size": 768, "num_hidden_layers": 48,
                 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                 "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936,
                 "max_position_embeddings": 40960, "tie_word_embeddings": False,
                 "attention_bias": False}


@pytest.mark.parametrize("config, preset", [
    (GPT_J_6B, "gpt-j-6b"), (FALCON_7B, "falcon-7b"), (FALCON_7B_RW, "falcon-7b"),
    (FALCON_40B_RW, "falcon-40b"), (FALCON_180B, "falcon-180b"), (DEEPSEEK_V3, "deepseek-v3"),
    (QWEN3_30B_A3B, "qwen3-30b-a3b")], ids=["gpt-j", "falcon-7b", "falcon-7b-rw",
                                             "falcon-40b-rw", "falcon-180b", "deepseek-v3",
                                             "qwen3-30b-a3b"])
def test_hf_configs_read_to_the_presets(config, preset):
    m = ModelConfig.from_hf_config(config)
    p = get_model(preset)
    same = ("max_position_embeddings",) if "max_position_embeddings" not in config and \
        "n_positions" not in config else ()
    assert dataclasses.replace(m, name=p.name, **{f: getattr(p, f) for f in same}) == p


def test_hf_config_block_shapes_of_the_gpt2_lineage():
    j = get_model(GPT_J_6B)
    assert (j.gated_mlp, j.parallel_attn, j.norms_per_layer) == (False, True, 1)
    assert j.intermediate_size == 4 * 4096 and j.head_dim == 256 and not j.attention_qkv_bias
    f7 = get_model(FALCON_7B)  # multi_query: one KV head whatever num_kv_heads says
    assert (f7.num_key_value_heads, f7.norms_per_layer, f7.tie_word_embeddings) == (1, 1, True)
    f40 = get_model(FALCON_40B_RW)  # the 40B's RefinedWeb config means the new architecture
    assert (f40.num_key_value_heads, f40.parallel_attn, f40.norms_per_layer) == (8, True, 2)
    sequential = get_model({**FALCON_7B, "parallel_attn": False})
    assert (sequential.parallel_attn, sequential.norms_per_layer) == (False, 2)
    neox = get_model({"model_type": "gpt_neox", "hidden_size": 6144, "intermediate_size": 24576,
                      "num_attention_heads": 64, "num_hidden_layers": 44, "vocab_size": 50432,
                      "use_parallel_residual": True, "tie_word_embeddings": False})
    assert (neox.gated_mlp, neox.parallel_attn, neox.norms_per_layer) == (False, True, 2)
    assert neox.attention_qkv_bias  # GPT-NeoX's attention_bias defaults to true
    h = 6144  # GPT-NeoX-20B: untied, q/k/v biases, 4h MLP, two norms
    assert neox.total_params() == 2 * 50432 * h + 44 * (4 * h * h + 3 * h + 2 * h * 4 * h
                                                        + 2 * h) + h
    phi2 = get_model({"model_type": "phi", "hidden_size": 2560, "intermediate_size": 10240,
                      "num_hidden_layers": 32, "num_attention_heads": 32,
                      "num_key_value_heads": 32, "vocab_size": 51200,
                      "tie_word_embeddings": False})
    assert (phi2.gated_mlp, phi2.parallel_attn, phi2.norms_per_layer) == (False, True, 1)
    h = 2560
    assert phi2.total_params() == 2 * 51200 * h + 32 * (4 * h * h + 3 * h + 2 * h * 4 * h
                                                        + h) + h
    # facebook/opt-6.7b as vendored by casys-kaist/LLMServingSim: sequential, non-gated, tied
    opt = get_model({"model_type": "opt", "ffn_dim": 16384, "hidden_size": 4096,
                     "max_position_embeddings": 2048, "num_attention_heads": 32,
                     "num_hidden_layers": 32, "vocab_size": 50272})
    assert (opt.gated_mlp, opt.parallel_attn, opt.tie_word_embeddings) == (False, False, True)
    assert opt.total_params() == pytest.approx(6.7e9, rel=0.01)


def test_hf_config_mla_and_deepseek_moe_fields():
    m = get_model(DEEPSEEK_V3)
    assert m.is_mla and m.is_moe
    assert (m.head_dim, m.kv_latent_size, m.attn_out_size) == (192, 576, 128 * 128)
    assert (m.intermediate_size, m.dense_width, m.n_shared_experts,
            m.first_k_dense_replace, m.num_moe_layers) == (2048, 18432, 1, 3, 58)
    lite = get_model({**DEEPSEEK_V3, "q_lora_rank": None})  # V2-Lite: a full-rank q_proj
    assert lite.q_lora_rank == 0
    assert lite.attention_params_per_layer() - m.attention_params_per_layer() == \
        7168 * 128 * 192 - (7168 * 1536 + 1536 + 1536 * 128 * 192)


@pytest.mark.parametrize("name", model_presets())
def test_a_preset_reads_back_from_its_dict(name):
    m = get_model(name)
    assert get_model(dataclasses.asdict(m)) == m
