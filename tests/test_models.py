import dataclasses

import pytest

from sim import ModelConfig, get_model, model_presets
from sim.specs.models import reported_params


@pytest.mark.parametrize("name", model_presets())
def test_param_count_matches_published_size_within_2_percent(name):
    m = get_model(name)
    assert m.total_params() == pytest.approx(reported_params(name), rel=0.02)


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
