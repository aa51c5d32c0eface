"""``ModelConfig.from_hf`` and ``--model path/to/config.json``: a Hugging Face ``config.json`` as
shipped (values as published on the Hub; sources in sim/data/NOTICE.md), an unknown
``model_type`` whose fields sim understands, and one-line errors naming the field."""

import json

import pytest

from sim import ModelConfig, get_model
from sim.cli import main

# openai/gpt-oss-20b config.json (the fields that shape the model; as published on the Hub)
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "experts_per_token": 4,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "quantization_config": {"quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05, "rope_theta": 150000, "sliding_window": 128,
    "tie_word_embeddings": False, "vocab_size": 201088}


def _write(tmp_path, cfg, folder="gpt-oss-20b"):
    path = tmp_path / folder / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    return path


def test_from_hf_reads_a_file_and_names_the_model_by_its_folder(tmp_path):
    path = _write(tmp_path, GPT_OSS_20B)
    m = ModelConfig.from_hf(path)
    assert m.name == "gpt-oss-20b"
    assert m == ModelConfig.from_hf(str(path)) == get_model(str(path))
    assert m.layer_counts() == {"full_attention": 12, "sliding_attention": 12}
    # 20.91 B parameters (the gpt-oss model card, arXiv:2508.10925 Table 1)
    assert abs(m.total_params() / 20.91e9 - 1) < 0.01


def test_sim_run_with_a_config_json(tmp_path, capsys):
    path = _write(tmp_path, GPT_OSS_20B)
    out = tmp_path / "out"
    assert main(["run", "--model", str(path), "-w", "azure-code", "-n", "30", "-q",
                 "-o", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["summary"]["num_requests"] == 30
    cfg = tmp_path / "c.toml"  # the TOML key too
    cfg.write_text(f'model = "{path.as_posix()}"\nworkload = "azure-code"\nnum_requests = 10\n'
                   f'output = "{(tmp_path / "out2").as_posix()}"\n')
    assert main(["run", str(cfg), "-q"]) == 0


def test_an_unknown_model_type_with_understood_fields_just_works(tmp_path, capsys):
    cfg = {"model_type": "brand_new_llm", "architectures": ["BrandNewForCausalLM"],
           "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
           "some_future_field": {"x": 1}}
    path = _write(tmp_path, cfg, "brand-new")
    assert get_model(path).total_params() == get_model("llama-3.1-8b").total_params()
    assert main(["run", "--model", str(path), "-w", "azure-code", "-n", "5", "-q",
                 "-o", str(tmp_path / "o")]) == 0


@pytest.mark.parametrize("change, field", [
    ({"vocab_size": None}, "vocab_size"),
    ({"num_hidden_layers": None}, "num_hidden_layers"),
    ({"is_encoder_decoder": True}, "is_encoder_decoder"),
    ({"layer_types": ["mamba"] + ["full_attention"] * 23}, "layer_types"),
    ({"layer_types": ["sliding_attention"] * 3 + ["full_attention"] * 21}, "layer_types"),
    ({"sliding_window": None}, "sliding_window"),
])
def test_what_it_cannot_price_is_a_one_line_error_naming_the_field(tmp_path, capsys, change,
                                                                    field):
    cfg = {k: v for k, v in {**GPT_OSS_20B, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=field):
        ModelConfig.from_hf(cfg)
    path = _write(tmp_path, cfg)
    assert main(["run", "--model", str(path), "-w", "azure-code", "-n", "5",
                 "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert field in err and "\n" not in err and "Traceback" not in err
    assert str(path) in err  # the file it came from, not only the field


def test_a_missing_or_bad_file_is_an_error(tmp_path, capsys):
    with pytest.raises(ValueError, match="no such file"):
        get_model(str(tmp_path / "none.json"))
    bad = tmp_path / "bad" / "config.json"
    bad.parent.mkdir()
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON file"):
        ModelConfig.from_hf(bad)
    with pytest.raises(ValueError, match="a folder, not a JSON file .give the config.json"):
        ModelConfig.from_hf(bad.parent)
    with pytest.raises(ValueError, match="is a folder, not a preset: give the path of its"):
        get_model(str(bad.parent))
    with pytest.raises(ValueError, match="model '' is not a preset"):  # not the working dir
        get_model("")


def test_a_multimodal_configs_text_config_is_the_model():
    # google/gemma-3-27b-it config.json: the text model in text_config, Gemma 3's defaults
    # (vocab 262,208; every 6th layer global) for the fields it omits
    cfg = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
           "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
                           "model_type": "gemma3_text", "num_attention_heads": 32,
                           "num_hidden_layers": 62, "num_key_value_heads": 16,
                           "sliding_window": 1024},
           "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}}
    m = ModelConfig.from_hf(cfg, name="gemma-3-27b")
    assert m.vocab_size == 262208 and m.sliding_window == 1024
    assert m.layer_counts() == {"full_attention": 10, "sliding_attention": 52}
    assert m == get_model("gemma-3-27b")


def test_the_model_is_named_by_its_folder_or_by_its_file(tmp_path):
    cfg = {k: v for k, v in GPT_OSS_20B.items() if k not in ("_name_or_path", "name")}
    assert ModelConfig.from_hf(_write(tmp_path, cfg, folder="my-oss")).name == "my-oss"
    other = tmp_path / "my-oss" / "oss-variant.json"
    other.write_text(json.dumps(cfg))
    assert ModelConfig.from_hf(other).name == "oss-variant"  # not the folder's 'my-oss'
