"""experiments/ttft_residual.py: the first token's unpriced time at concurrency 1 beside the
sourced candidates; the stored tables reproduced, the candidates at their closed forms, and
the finding the validation page states."""

import json
import sys
from importlib import resources
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import ttft_residual as tr  # noqa: E402


@pytest.fixture(scope="module")
def parts():
    res = tr.residuals()
    return {"residuals": res, "slopes": tr.slopes(res), "batching": tr.batching()}


def test_stored_tables_are_what_the_script_gives(parts):
    stored = json.loads(resources.files("sim").joinpath("data/ttft_residual.json").read_text())
    for name, table in parts.items():
        got = tr.vi._records(table)
        assert len(got) == len(stored[name])
        for a, b in zip(got, stored[name]):
            assert a.keys() == b.keys()
            for k in a:
                assert a[k] == (pytest.approx(b[k], abs=1e-9) if isinstance(b[k], float)
                                else b[k]), (name, k)


def test_candidates_at_their_sources_sizes(parts):
    """Request path: Triton's fit round trips (539, 543 us) and the fast tokenizer's fit row
    (1.1 s for 1M tokens) x the mean prompt; no step to wait for and no MTP at concurrency 1;
    the residual is measured minus the roofline."""
    r = parts["residuals"]
    assert r.request_path_ms.to_numpy() == pytest.approx(
        0.541 + 1.1e-3 * r.mean_prompt.to_numpy(), abs=1e-9)
    assert (r.first_step_wait_ms == 0).all() and (r.speculative_ms == 0).all()
    assert r.residual_ms.to_numpy() == pytest.approx((r.measured_ms - r.roofline_ms).to_numpy())
    ds = r[r.run_id == "sglang-cookbook:DeepSeek-R1:L368"].iloc[0]
    assert ds.layers == 61 and ds.measured_ms == 140.76  # the cookbook's block at line 368


def test_the_residual_is_the_models_and_not_a_per_request_cost(parts):
    r = parts["residuals"]
    b200 = r[r.gpu == "B200-HGX"]
    assert (b200.request_path_ms < 0.12 * b200.residual_ms).all()
    per_layer = r[r.split == "fit"].groupby("model").unexplained_per_layer_ms.median()
    assert per_layer.max() > 10 * per_layer.min()  # Qwen3-Next 2.4 ms, Llama-3.1-70B 0.2 ms
    for s in parts["slopes"].itertuples():  # the prefill: too steep, its fixed part missing
        assert s.roofline_rise_ms > 1.4 * s.measured_rise_ms
        assert s.measured_intercept_ms > s.roofline_intercept_ms + 50
    for g in parts["batching"].itertuples():  # 100 clients: the first token of one
        assert g.ttft_p50_hi_ms == pytest.approx(g.ttft_p50_lo_ms, rel=0.05)
