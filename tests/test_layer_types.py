"""The 2025-26 presets (sim/data/models.csv; sources in its columns and sim/data/NOTICE.md) and
their layer types (sim/specs/layers.py): published parameter totals, KV bytes per token per
layer type against hand computations, KV use that stops growing past a window, linear
attention's fixed state, and the roofline over windows."""

import numpy as np
import pytest

from sim import get_model
from sim.costs.roofline import RooflineCost
from sim.engine.core.batch import Batch
from sim.specs.memory import kv_cache_bytes, memory_budget, sequence_kv_bytes

# (preset, published total parameters, where it is published)
PUBLISHED = [
    ("gpt-oss-20b", 20.91e9, "gpt-oss model card (arXiv:2508.10925) Table 1: 20.91B"),
    ("gpt-oss-120b", 116.83e9, "gpt-oss model card (arXiv:2508.10925) Table 1: 116.83B"),
    ("gemma-3-27b", 1.416e9 + 25.6e9, "Gemma 3 Technical Report (arXiv:2503.19786) Table 1: "
                                      "1,416M embedding + 25,600M non-embedding"),
    ("llama-4-scout", 109e9, "Llama-4-Scout-17B-16E model card: 109B total"),
    ("llama-4-maverick", 400e9, "Llama-4-Maverick-17B-128E model card: 400B total"),
    ("qwen3-next-80b-a3b", 80e9, "Qwen3-Next-80B-A3B model card: 80B in total"),
    ("kimi-k2", 1.04e12, "Kimi K2 technical report (arXiv:2507.20534): 1.04 trillion total"),
    ("glm-4.5", 355e9, "GLM-4.5 model card: 355 billion total parameters"),
]


@pytest.mark.parametrize("name, total, source", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_each_new_preset_is_within_2_percent_of_its_published_total(name, total, source):
    assert get_model(name).total_params() == pytest.approx(total, rel=0.02), source


def test_active_counts_in_each_vendors_convention():
    # gpt-oss counts the unembedding but not the embedding: 3.61B / 5.13B active (Table 1)
    for name, active in (("gpt-oss-20b", 3.61e9), ("gpt-oss-120b", 5.13e9)):
        m = get_model(name)
        assert m.active_params() - m.vocab_size * m.hidden_size == pytest.approx(active, rel=0.01)
    # Llama 4: 17B activated (both embedding matrices, as sim counts)
    for name in ("llama-4-scout", "llama-4-maverick"):
        assert get_model(name).active_params() == pytest.approx(17e9, rel=0.02)
    # Kimi K2: 32B activated without the input embedding; GLM-4.5: 32B without either
    k = get_model("kimi-k2")
    assert k.active_params() - k.vocab_size * k.hidden_size == pytest.approx(32e9, rel=0.02)
    g = get_model("glm-4.5")
    assert g.active_params() - 2 * g.vocab_size * g.hidden_size == pytest.approx(32e9, rel=0.02)


# per-token KV bytes (fp16) of ONE layer of each attention kind: 2 (K, V) x KV heads x head_dim
# x 2 bytes (MLA: the latent, kv_lora_rank + qk_rope_head_dim, x 2 bytes)
PER_LAYER = {"gpt-oss-20b": 2 * 8 * 64 * 2, "gemma-3-27b": 2 * 16 * 128 * 2,
             "llama-4-scout": 2 * 8 * 128 * 2, "qwen3-next-80b-a3b": 2 * 2 * 256 * 2,
             "kimi-k2": (512 + 64) * 2, "glm-4.5": 2 * 8 * 128 * 2}
LAYERS = {"gpt-oss-20b": {"full_attention": 12, "sliding_attention": 12},
          "gemma-3-27b": {"full_attention": 10, "sliding_attention": 52},
          "llama-4-scout": {"full_attention": 12, "chunked_attention": 36},
          "qwen3-next-80b-a3b": {"full_attention": 12, "linear_attention": 36},
          "kimi-k2": {"full_attention": 61}, "glm-4.5": {"full_attention": 92}}
WINDOW = {"gpt-oss-20b": 128, "gemma-3-27b": 1024, "llama-4-scout": 8192}


@pytest.mark.parametrize("name", sorted(PER_LAYER))
def test_kv_bytes_per_token_per_layer_type_equal_a_hand_computation(name):
    m = get_model(name)
    assert m.layer_counts() == LAYERS[name]
    assert m.kv_values_per_token_per_layer() * 2 == PER_LAYER[name]
    attention_layers = sum(n for k, n in LAYERS[name].items() if k != "linear_attention")
    assert kv_cache_bytes(1, model=m) == attention_layers * PER_LAYER[name]
    L = 20_000
    full = LAYERS[name]["full_attention"] * L * PER_LAYER[name]
    local = sum(n for k, n in LAYERS[name].items() if k in ("sliding_attention",
                                                            "chunked_attention"))
    held = min(L, WINDOW.get(name, L)) if "sliding_attention" in LAYERS[name] else \
        (L - 1) % 8192 + 1
    state = 0
    if name == "qwen3-next-80b-a3b":  # 32 value heads x 128 x 128 + conv 3 x (2 x 2048 + 4096)
        state = 36 * (32 * 128 * 128 + 3 * (2 * 2048 + 4096)) * 2
    assert sequence_kv_bytes(L, m) == full + local * held * PER_LAYER[name] + state


def test_kv_use_stops_growing_past_the_window():
    # every layer sliding (Mistral-7B v0.1's config): constant past the window
    mistral = {"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096,
               "num_attention_heads": 32, "num_key_value_heads": 8,
               "intermediate_size": 14336, "vocab_size": 32000, "sliding_window": 4096}
    m = get_model(mistral)
    assert m.layer_counts() == {"sliding_attention": 32}
    at = [sequence_kv_bytes(n, m) for n in (1000, 4096, 5000, 100_000)]
    assert at[0] < at[1] == at[2] == at[3] == 32 * 4096 * 2 * 8 * 128 * 2
    # gpt-oss: past 128 tokens only the full layers grow
    g = get_model("gpt-oss-20b")
    assert sequence_kv_bytes(10_001, g) - sequence_kv_bytes(10_000, g) == 12 * 2048
    assert sequence_kv_bytes(101, g) - sequence_kv_bytes(100, g) == 24 * 2048
    # linear attention: the state is the same at any length
    q = get_model("qwen3-next-80b-a3b")
    state = [sequence_kv_bytes(n, q) - n * kv_cache_bytes(1, model=q) for n in (1, 10, 10_000)]
    assert state[0] == state[1] == state[2] > 0


def test_the_budget_fits_more_sequences_of_a_windowed_model():
    b = memory_budget("gpt-oss-20b", 85.52, tensor_parallel=1)
    per_seq = sequence_kv_bytes(32_000, "gpt-oss-20b", block_size=16)
    assert b.max_batch_size(32_000) == b.kv_bytes_per_gpu // per_seq
    assert b.max_batch_size(32_000) > b.kv_blocks // (32_000 // 16)  # the full-layer count
    dense = memory_budget("llama-3.1-8b", 85.52)
    assert dense.max_batch_size(4096) == dense.kv_blocks // 256  # unchanged for full layers


def test_roofline_local_layers_attend_over_the_window_only():
    c = RooflineCost("gemma-3-27b", "h100")
    assert c.needs_decode_lengths and c.pure_decode_cost is None

    def decode(n, length):
        return Batch(0, (), 0, n, n * length, decode_lengths=np.full(n, length))
    # past the window the local layers cost the same: the step grows by the full layers' term
    grow = c(decode(8, 5000)) - c(decode(8, 3000))
    assert grow == pytest.approx(8 * 2000 * c._decode_s_per_ctx)
    assert c.extra_layers_time(decode(8, 5000)) == c.extra_layers_time(decode(8, 3000))
    # by hand: 52 local layers x 8 decodes x 1,024 tokens x one layer's per-token cost
    per_layer = c._decode_s_per_ctx / 10
    assert c.extra_layers_time(decode(8, 5000)) == pytest.approx(52 * 8 * 1024 * per_layer)
    # a full-attention model is priced as before (no extra layers)
    assert not RooflineCost("llama-3.1-8b", "h100")._extra_layers


def test_window_pairs_closed_form():
    c = RooflineCost("gpt-oss-20b", "h100")
    w = 128
    for new, cached in ((50, 0), (100, 100), (500, 1000), (1, 127)):
        exact = sum(min(cached + i, w) for i in range(1, new + 1))
        assert c._window_pairs(new, cached) == pytest.approx(exact, rel=0.02, abs=new)


def test_chunked_pairs_closed_form():
    c = RooflineCost("llama-4-scout", "h100")
    chunk = 8192
    for new, cached in ((1000, 0), (3000, 7000), (20_000, 100), (512, 16_384)):
        exact = sum((cached + i - 1) % chunk + 1 for i in range(1, new + 1))
        assert c._window_pairs(new, cached) == pytest.approx(exact, rel=0.01)


def test_linear_attention_state_is_priced_per_sequence():
    c = RooflineCost("qwen3-next-80b-a3b", "h200", tensor_parallel=4)
    one = c.extra_layers_time(Batch(0, (), 0, 1, 100, decode_lengths=np.array([100])))
    long = c.extra_layers_time(Batch(0, (), 0, 1, 90_000, decode_lengths=np.array([90_000])))
    assert one == long > 0  # the state does not grow with the context


# config.json dicts as shipped (the fields that shape each model)
HF = {
    "llama-4-scout": {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
                      "text_config": {"model_type": "llama4_text", "hidden_size": 5120,
                                      "num_hidden_layers": 48, "num_attention_heads": 40,
                                      "num_key_value_heads": 8, "head_dim": 128,
                                      "intermediate_size": 8192, "intermediate_size_mlp": 16384,
                                      "num_local_experts": 16, "num_experts_per_tok": 1,
                                      "interleave_moe_layer_step": 1, "vocab_size": 202048,
                                      "attention_chunk_size": 8192,
                                      "no_rope_layers": [int((i + 1) % 4 != 0)
                                                         for i in range(48)],
                                      "max_position_embeddings": 10485760,
                                      "tie_word_embeddings": False}},
    "qwen3-next-80b-a3b": {"model_type": "qwen3_next", "hidden_size": 2048,
                           "num_hidden_layers": 48, "num_attention_heads": 16,
                           "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 5120,
                           "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                           "num_experts": 512, "num_experts_per_tok": 10,
                           "decoder_sparse_step": 1, "mlp_only_layers": [],
                           "full_attention_interval": 4, "linear_num_key_heads": 16,
                           "linear_num_value_heads": 32, "linear_key_head_dim": 128,
                           "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
                           "vocab_size": 151936, "max_position_embeddings": 262144,
                           "tie_word_embeddings": False},
    "glm-4.5": {"model_type": "glm4_moe", "hidden_size": 5120, "num_hidden_layers": 92,
                "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
                "intermediate_size": 12288, "moe_intermediate_size": 1536,
                "n_routed_experts": 160, "n_shared_experts": 1, "num_experts_per_tok": 8,
                "first_k_dense_replace": 3, "attention_bias": True, "vocab_size": 151552,
                "max_position_embeddings": 131072, "tie_word_embeddings": False,
                "num_nextn_predict_layers": 1},
}


@pytest.mark.parametrize("name", sorted(HF))
def test_shipped_configs_read_to_the_presets(name):
    m = get_model(HF[name])
    p = get_model(name)
    assert m.total_params() == p.total_params() and m.layer_counts() == p.layer_counts()
    assert sequence_kv_bytes(10_000, m) == sequence_kv_bytes(10_000, p)


def test_a_windowed_model_runs_end_to_end(tmp_path):
    from sim.cli import main
    import json
    assert main(["run", "--model", "gpt-oss-20b", "-w", "azure-conv", "-n", "40", "-q",
                 "-o", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())["summary"]
    assert s["num_requests"] == 40 and s.get("num_rejected", 0) == 0
