"""One eager prefill forward's kernel launches (:mod:`sim.specs.prefill_launches`): the
per-model totals the counted components give (sim/data/prefill_launches.csv, SGLang's model
files), closed forms per component, the fp8 and tensor-parallel terms, and the invariants."""

import dataclasses
import csv
from importlib import resources

import pytest
from hypothesis import given, strategies as st

from sim.specs.models import get_model
from sim.specs.prefill_launches import components, prefill_launches


def test_each_component_is_sourced_and_used():
    text = resources.files("sim").joinpath("data/prefill_launches.csv").read_text()
    rows = list(csv.DictReader(x for x in text.splitlines() if not x.startswith("#")))
    assert {r["component"] for r in rows} == set(components())
    for r in rows:
        assert r["source"].startswith("models/") and r["ops"], r["component"]
        assert 0 <= int(r["gemms"]) <= int(r["launches"]), r["component"]


@pytest.mark.parametrize("name,tp,dtype,per_layer", [
    # the per-layer counts read from SGLang's model files (the csv's header; B200, TP 8)
    ("Llama-3.1-70B", 8, "bf16", {"all": 12}),            # 2 norms + 5 attention + 3 MLP + 2 AR
    ("DeepSeek-V3", 8, "fp8", {"dense": 24, "moe": 33}),  # MLA 15 with fp8, MoE 8 + shared 6
])
def test_the_counted_models_closed_forms(name, tp, dtype, per_layer):
    m = get_model(name)
    if "all" in per_layer:
        want = m.num_hidden_layers * per_layer["all"]
    else:
        want = (m.num_dense_layers * per_layer["dense"] + m.num_moe_layers * per_layer["moe"])
    assert prefill_launches(m, tp, dtype) == want + 8  # + embedding, final norm, logits


@pytest.mark.parametrize("name,counted", [
    # the helper's per-model totals from SGLang's files; the structure here misses what the
    # csv's header lists (q/k norms, shared-expert gates, reshape copies, fused RoPE+KV)
    ("Qwen3-235B-A22B", 1700), ("gpt-oss-120b", 548), ("Qwen3-Next-80B-A3B", 1892),
    ("Llama-4-Scout", 1232), ("Llama-4-Maverick", 872)])
def test_the_other_counted_models_within_their_stated_differences(name, counted):
    got = prefill_launches(get_model(name), 8, "fp4" if name.startswith("gpt") else "bf16")
    assert abs(got / counted - 1) < 0.18


def test_layer_kinds_rank_as_their_kernels():
    """An MLA or a Gated DeltaNet layer launches more kernels than a GQA one; the host's
    time per layer is not one number (the reason for the per-launch form)."""
    per_layer = {n: prefill_launches(get_model(n), 8) / get_model(n).num_hidden_layers
                 for n in ("Llama-3.1-70B", "DeepSeek-V3", "Qwen3-Next-80B-A3B")}
    assert per_layer["Llama-3.1-70B"] < 13 < 2 * 13 < per_layer["DeepSeek-V3"]
    assert per_layer["Qwen3-Next-80B-A3B"] > 2 * per_layer["Llama-3.1-70B"]


def test_tensor_parallel_adds_two_all_reduces_a_layer_and_fp8_one_quant_a_gemm():
    m = get_model("Llama-3.1-70B")
    assert prefill_launches(m, 8) - prefill_launches(m, 1) == 2 * 80
    assert prefill_launches(m, 8) == prefill_launches(m, 2)
    assert prefill_launches(m, 8, "fp8") - prefill_launches(m, 8) == 4 * 80  # qkv, o, gate_up, down


@given(layers=st.integers(1, 200), tp=st.sampled_from([1, 2, 8]))
def test_linear_in_the_layers(layers, tp):
    m = dataclasses.replace(get_model("Llama-3.1-8B"), num_hidden_layers=layers)
    one = dataclasses.replace(m, num_hidden_layers=1)
    assert prefill_launches(m, tp) == 8 + layers * (prefill_launches(one, tp) - 8)


@pytest.mark.parametrize("tp", [0, -1, 2.0, True, "8"])
def test_bad_tensor_parallel_names_it(tp):
    with pytest.raises(ValueError, match="tensor_parallel must be an int >= 1"):
        prefill_launches(get_model("Llama-3.1-8B"), tp)
