"""The fixed time of an iteration holding prefill work (``EngineOverheads.per_prefill_iter_s``):
its closed form in a step (once per iteration, not per prefill; before the overlap rule), in a
run (a request's TTFT rises by it once per prefill iteration; a batch of prefills pays it
once), its bad values, the summary's record, and the compiled price (tests/test_roofline_price.py
holds the bit-for-bit property)."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from sim import SimConfig, run
from sim.costs.overheads import EngineOverheads, OverheadCost, fitted_overheads
from sim.costs.roofline import RooflineCost
from sim.costs.roofline_price import batch_pricer
from sim.costs.simple import ConstantCost
from sim.engine.core.batch import make_batch

P = 0.080  # 80 ms: the size experiments/ttft_residual.py finds on B200


def _batch(decodes=0, prefills=()):
    return SimpleNamespace(num_decode_tokens=decodes, prefills=list(prefills),
                           num_prefill_tokens=sum(p for p, _ in prefills),
                           decode_context_tokens=100 * decodes, num_spec_tokens=0,
                           decode_lengths=None, decode_ids=None, prefill_ids=None)


def test_once_per_iteration_with_prefills_never_on_pure_decodes():
    cost = OverheadCost(ConstantCost(0.010), EngineOverheads(per_prefill_iter_s=P))
    assert cost(_batch(decodes=40)) == 0.010
    assert cost(_batch(prefills=[(500, 0)])) == 0.010 + P
    assert cost(_batch(decodes=40, prefills=[(500, 0), (20, 300), (7, 0)])) == 0.010 + P


def test_added_before_the_step_rule_an_overlapped_cpu_does_not_hide_it():
    sync = OverheadCost(ConstantCost(0.010), EngineOverheads(per_prefill_iter_s=P,
                                                              per_seq_s=1e-3))
    over = OverheadCost(ConstantCost(0.010), EngineOverheads(per_prefill_iter_s=P,
                                                              per_seq_s=1e-3, overlap=True))
    b = _batch(decodes=9, prefills=[(64, 0)])  # CPU 10 ms
    assert sync(b) == pytest.approx(0.010 + P + 0.010)
    assert over(b) == pytest.approx(max(0.010 + P, 0.010))
    assert over(_batch(decodes=200)) == pytest.approx(0.200)  # decodes: CPU the longer


@pytest.mark.parametrize("value", [-1e-3, float("nan"), float("inf"), True, "80ms"])
def test_bad_values_name_the_field(value):
    with pytest.raises(ValueError, match="per_prefill_iter_s"):
        EngineOverheads(per_prefill_iter_s=value)


def _run(n, ov, scheduler="vllm"):
    df = pd.DataFrame({"arrival_time": np.zeros(n), "num_prompt_tokens": 64,
                       "num_output_tokens": 4})
    return run(df, SimConfig(scheduler=scheduler, cost_model=ConstantCost(0.01),
                             engine_overheads=ov))


@pytest.mark.parametrize("scheduler", ["vllm", "sglang"])
def test_a_batch_of_prefills_pays_it_once_and_its_decodes_wait_for_it(scheduler):
    alone = _run(8, None, scheduler).requests
    with_p = _run(8, EngineOverheads(per_prefill_iter_s=P), scheduler).requests
    # all eight prompts fit one prefill iteration: each first token P later, not 8 P
    assert (with_p["ttft"] - alone["ttft"]).to_numpy() == pytest.approx(np.full(8, P))
    # no later iteration holds prefill work: the decodes after it as before
    assert ((with_p["e2e"] - with_p["ttft"]).to_numpy()
            == pytest.approx((alone["e2e"] - alone["ttft"]).to_numpy()))


def test_a_request_behind_another_prefill_waits_for_both():
    df = pd.DataFrame({"arrival_time": [0.0, 0.001], "num_prompt_tokens": 64,
                       "num_output_tokens": 50})
    cfg = dict(scheduler="vllm", cost_model=ConstantCost(0.01))
    alone = run(df, SimConfig(**cfg)).requests
    with_p = run(df, SimConfig(**cfg, engine_overheads=EngineOverheads(
        per_prefill_iter_s=P))).requests
    # the second arrives while the first's prefill iteration runs: it waits for that one's P,
    # then pays its own
    assert with_p["ttft"].iloc[0] == pytest.approx(alone["ttft"].iloc[0] + P)
    assert with_p["ttft"].iloc[1] == pytest.approx(alone["ttft"].iloc[1] + 2 * P)


def test_the_summary_records_it_only_when_set():
    s = _run(2, EngineOverheads(per_prefill_iter_s=P)).summary()
    assert s["engine_overhead_per_prefill_iter_s"] == P
    assert "engine_overhead_per_prefill_iter_s" not in _run(
        2, EngineOverheads(per_request_s=0.01)).summary()


def test_the_compiled_price_adds_it_the_same_way():
    cost = RooflineCost("llama-3.1-8b", "h100")
    price = batch_pricer(OverheadCost(cost, EngineOverheads(per_prefill_iter_s=P)))
    for prefills, dec, ctx in [((), 12, 9000), (((700, 0),), 0, 0), (((700, 0), (30, 99)), 5,
                                                                      4000)]:
        b = make_batch(0, prefills, sum(n for n, _ in prefills), dec, ctx, None, None, None, 0)
        want = cost(b) + (P if prefills else 0.0)
        assert price.price(prefills, b.num_prefill_tokens, dec, ctx, 0) == want


def test_the_fitted_terms_load_it():
    for engine in ("sglang", "vllm"):
        assert fitted_overheads(engine).per_prefill_iter_s >= 0.0


def test_the_stored_fit_kept_the_grid_point_with_the_best_fit_score():
    """experiments/fit_overheads.py step 3: the stored term is the grid's best by the fit rows'
    score it stored (ties: the smaller), per engine; held-out rows never scored. An engine
    whose shift is per layer (vLLM's) keeps 0: its grid is that point alone."""
    import json
    import sys
    from importlib import resources
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import fit_overheads as fo
    stored = json.loads(resources.files("sim").joinpath("data/engine_overheads.json")
                        .read_text())
    for engine, t in stored["engines"].items():
        scores = [r for r in stored["prefill_split"] if r["engine"] == engine]
        grid = fo.PREFILL_GRID if not t["per_request_layer_s"] else (0.0,)
        assert sorted(r["per_prefill_iter_s"] for r in scores) == list(grid)
        best = min(scores, key=lambda r: (round(r["fit_score_all_metrics"], 12),
                                          r["per_prefill_iter_s"]))
        assert t["per_prefill_iter_s"] == best["per_prefill_iter_s"]
        assert fitted_overheads(engine).per_prefill_iter_s == t["per_prefill_iter_s"]


def test_the_cli_summary_names_it_only_when_set():
    from sim.cli.output import format_summary
    s = _run(2, EngineOverheads(per_prefill_iter_s=P)).summary()
    assert "80 ms per prefill iteration" in format_summary(s)
    s = _run(2, EngineOverheads(per_seq_s=1e-4)).summary()
    assert "per prefill iteration" not in format_summary(s)
