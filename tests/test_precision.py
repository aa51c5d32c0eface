"""Weight and KV precision as run settings: one place (SimConfig) sizes the pool and prices the
roofline; the CLI flags and TOML keys reach it."""

import json

import pandas as pd
import pytest

import sim
from sim import SimConfig, memory_budget, get_gpu
from sim.cli import main
from sim.engine.core.batch import make_batch


def test_fp8_kv_doubles_the_blocks_of_fp16():
    for kw in ({}, {"model": "llama-3.1-8b"}, {"model": "llama-2-70b", "gpu": "a100",
                                               "tensor_parallel": 2}):
        fp16 = SimConfig(**kw).resolved_kv_blocks()
        fp8 = SimConfig(kv_dtype="fp8", **kw).resolved_kv_blocks()
        if kw:  # the memory budget: twice the tokens in the same bytes (floors may add one)
            assert fp8 in (2 * fp16, 2 * fp16 + 1)
        else:  # no model or GPU given: the default scenario's budget, as sim run's
            assert fp16 == SimConfig(model="llama-3.1-8b").resolved_kv_blocks()
            user = sim.ConstantCost(0.01)  # a user cost model alone: the cheat sheet's pool
            assert SimConfig(cost_model=user).resolved_kv_blocks() == sim.KV_BLOCKS_AVAILABLE
            assert fp8 == 2 * SimConfig(model="llama-3.1-8b").resolved_kv_blocks() + 1
    assert SimConfig(kv_dtype="BF16").kv_dtype == "bf16"
    assert SimConfig(model="llama-3.1-8b", kv_dtype="bf16").resolved_kv_blocks() == \
        SimConfig(model="llama-3.1-8b").resolved_kv_blocks()


def test_70b_does_not_fit_one_80gb_gpu_at_fp16_and_runs_quantized():
    cfg = SimConfig(model="llama-3.1-70b", gpu="h100")
    with pytest.raises(ValueError, match=r"fp16 weights: does not fit.*Quantize the weights to 8 "
                                         r"bits.*tensor_parallel=2"):
        cfg.resolved_kv_blocks()
    fp8 = SimConfig(model="llama-3.1-70b", gpu="h100", weight_dtype="fp8")
    int4 = SimConfig(model="llama-3.1-70b", gpu="h100", weight_dtype="int4")
    b8, b4 = fp8.resolved_kv_blocks(), int4.resolved_kv_blocks()
    budget = memory_budget("llama-3.1-70b", get_gpu("h100").memory_gb, weight_dtype="fp8")
    assert b8 == budget.kv_blocks and 0 < b8 < b4
    df = pd.DataFrame({"arrival_time": [0.0, 0.1], "num_prompt_tokens": [500, 800],
                       "num_output_tokens": [50, 20]})
    r8, r4 = sim.run(df, fp8), sim.run(df, int4)
    assert (r8.requests.status == "finished").all() and r8.kv_blocks == b8
    assert r4.kv_blocks == b4


def test_precision_reaches_the_default_cost_model():
    batch = make_batch(0, (), 0, 32, 32 * 1000)  # a decode step: weight reads dominate
    t = {w: SimConfig(weight_dtype=w).resolved_cost_model()(batch)
         for w in ("fp16", "bf16", "fp8", "int8", "int4")}
    assert t["bf16"] == t["fp16"]
    assert t["int4"] < t["fp8"] < t["fp16"] and t["int8"] < t["fp16"]
    kv8 = SimConfig(kv_dtype="fp8").resolved_cost_model()
    long_ctx = make_batch(0, (), 0, 64, 64 * 30_000)  # attention reads dominate
    assert kv8(long_ctx) < SimConfig().resolved_cost_model()(long_ctx)
    # a user's cost model is used as given
    cost = sim.ConstantCost(0.01)
    assert SimConfig(weight_dtype="fp8", cost_model=cost).resolved_cost_model() is cost


def test_bad_precision_names_the_field():
    with pytest.raises(ValueError, match=r"weight_dtype must be one of .*'int4'.*got 'fp5'"):
        SimConfig(weight_dtype="fp5")
    with pytest.raises(ValueError, match=r"kv_dtype must be one of .*got 'int4'"):
        SimConfig(kv_dtype="int4")
    with pytest.raises(ValueError, match="kv_dtype"):
        SimConfig(kv_dtype=1)


def test_cli_flags_and_toml_keys(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["run", "-n", "20", "--kv-dtype", "fp8", "--weight-dtype", "fp8",
                 "--no-plots", "-q", "-o", str(out)]) == 0
    doc = json.loads((out / "summary.json").read_text())
    assert doc["settings"]["kv_dtype"] == "fp8" and doc["settings"]["weight_dtype"] == "fp8"
    assert doc["summary"]["kv_blocks"] == SimConfig(kv_dtype="fp8",
                                                    weight_dtype="fp8").resolved_kv_blocks()
    assert "weights=fp8" in doc["settings"]["cost_model"]
    toml = tmp_path / "e.toml"
    toml.write_text('weight_dtype = "fp2"\n')
    assert main(["run", str(toml), "-n", "5", "-o", str(out)]) == 2
    assert f"{toml}: weight_dtype must be one of" in capsys.readouterr().err
    assert main(["run", "--model", "llama-3.1-70b", "-n", "5", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "Quantize" in err and err.count("\n") == 1
