"""The per-request shift per layer of the model (``EngineOverheads.per_request_layer_s``):
its closed form in a run, its bad values, the fit's form choice (experiments/fit_overheads.py
step 1) on the fit rows, and that the stored fit says which form it chose."""

import json
import sys
from importlib import resources
from pathlib import Path

import pandas as pd
import pytest

from sim import SimConfig, run
from sim.costs.overheads import EngineOverheads, fitted_overheads
from sim.costs.simple import ConstantCost
from sim.specs.models import get_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import fit_overheads as fo  # noqa: E402


def _one(model, ov):
    df = pd.DataFrame({"arrival_time": [0.0], "num_prompt_tokens": [64],
                       "num_output_tokens": [4]})
    return run(df, SimConfig(scheduler="vllm", model=model, cost_model=ConstantCost(0.01),
                             tensor_parallel=4, engine_overheads=ov))


@pytest.mark.parametrize("model", ["llama-3.1-8b", "Llama-3.1-70B"])
def test_a_request_pays_the_flat_part_plus_the_per_layer_part(model):
    layers = get_model(model).num_hidden_layers  # 32 and 80 (their HF configs)
    assert layers == {"llama-3.1-8b": 32, "Llama-3.1-70B": 80}[model]
    ov = EngineOverheads(per_request_s=0.002, per_request_layer_s=0.0005)
    assert ov.request_s(layers) == pytest.approx(0.002 + 0.0005 * layers)
    r = _one(model, ov)
    s = r.summary()
    assert r.requests["ttft"].iloc[0] == pytest.approx(0.01 + 0.002 + 0.0005 * layers)
    assert s["engine_overhead_per_request_total_s"] == pytest.approx(0.002 + 0.0005 * layers)
    assert s["engine_overhead_per_request_layer_s"] == 0.0005


def test_without_the_per_layer_part_the_summary_is_as_before():
    s = _one("llama-3.1-8b", EngineOverheads(per_request_s=0.002)).summary()
    assert "engine_overhead_per_request_layer_s" not in s
    assert "engine_overhead_per_request_total_s" not in s


@pytest.mark.parametrize("value", [-1e-3, float("inf"), "0.1", True])
def test_bad_per_layer_value_names_the_field(value):
    with pytest.raises(ValueError, match="per_request_layer_s"):
        EngineOverheads(per_request_layer_s=value)


def _frame(rows):
    return pd.DataFrame([{"run_id": f"closed-loop-{i}", "engine": "sglang", "split": "fit",
                          "metric": "ttft_p50", "model": m, "measured": meas,
                          "predicted": pred}
                         for i, (m, meas, pred) in enumerate(rows)])


def test_the_fit_keeps_the_form_that_fits_the_fit_rows():
    """Shortfalls exactly 1 ms per layer (32 and 80 layers) pick the per-layer form at 1 ms;
    the same flat 50 ms shortfall on both picks the flat form."""
    layered = _frame([("llama-3.1-8b", 40.0, 8.0), ("Llama-3.1-70B", 100.0, 20.0)])
    assert fo.per_request_layer(layered, "sglang") == pytest.approx(1e-3)
    ov = fo.shift(layered, "sglang")
    assert ov.per_request_s == 0 and ov.per_request_layer_s == pytest.approx(1e-3)
    flat = _frame([("llama-3.1-8b", 58.0, 8.0), ("Llama-3.1-70B", 70.0, 20.0)])
    ov = fo.shift(flat, "sglang")
    assert ov.per_request_layer_s == 0 and ov.per_request_s == pytest.approx(0.05)


def test_the_stored_fit_says_which_form_it_chose():
    stored = json.loads(resources.files("sim").joinpath("data/engine_overheads.json")
                        .read_text())
    forms = {f["engine"]: f for f in stored["shift_forms"]}
    for engine in ("sglang", "vllm"):
        f, ov = forms[engine], fitted_overheads(engine)
        better = ("per_request_layer_s" if f["fit_ttft_p50_per_layer"] < f["fit_ttft_p50_flat"]
                  else "per_request_s")
        assert f["chosen"] == better
        assert (ov.per_request_layer_s > 0) == (better == "per_request_layer_s")
