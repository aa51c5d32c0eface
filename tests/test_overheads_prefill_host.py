"""The host's time per layer of an iteration holding prefill work
(``EngineOverheads.prefill_host_layer_s``): a prefill iteration takes at least ``layers x`` it,
the GPU's time hidden behind it until the longer (``max``, after ``per_prefill_iter_s``,
before the CPU step rule); pure decodes never pay it. Its closed form, a run's first tokens
(the flat slope with the prompt and one floor per batch of prefills), the model's layers from
the run's config, bad values, the summary's record, the compiled price and the stored fit."""

import json
import pickle
import sys
from importlib import resources
from pathlib import Path
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

H = 1e-3  # 1 ms a layer


def _batch(decodes=0, prefills=()):
    return SimpleNamespace(num_decode_tokens=decodes, prefills=list(prefills),
                           num_prefill_tokens=sum(p for p, _ in prefills),
                           decode_context_tokens=100 * decodes, num_spec_tokens=0,
                           decode_lengths=None, decode_ids=None, prefill_ids=None)


def test_a_prefill_iteration_takes_the_longer_of_the_gpu_and_the_host():
    cost = OverheadCost(ConstantCost(0.010), EngineOverheads(prefill_host_layer_s=H), 32)
    assert cost.prefill_host_s == pytest.approx(0.032)
    assert cost(_batch(decodes=40)) == 0.010  # a pure decode: a CUDA graph, no floor
    assert cost(_batch(prefills=[(500, 0)])) == pytest.approx(0.032)
    assert cost(_batch(decodes=40, prefills=[(500, 0), (20, 300)])) == pytest.approx(0.032)
    slow = OverheadCost(ConstantCost(0.050), EngineOverheads(prefill_host_layer_s=H), 32)
    assert slow(_batch(prefills=[(500, 0)])) == 0.050  # the GPU the longer: it alone


def test_after_the_fixed_prefill_time_before_the_cpu_step():
    ov = EngineOverheads(prefill_host_layer_s=H, per_prefill_iter_s=0.005, per_seq_s=1e-3)
    cost = OverheadCost(ConstantCost(0.010), ov, 32)
    b = _batch(decodes=9, prefills=[(64, 0)])  # CPU 10 ms, synchronous
    assert cost(b) == pytest.approx(max(0.010 + 0.005, 0.032) + 0.010)
    big = OverheadCost(ConstantCost(0.030), ov, 32)
    assert big(b) == pytest.approx(0.030 + 0.005 + 0.010)  # GPU + fixed time past the host


def test_it_needs_the_layers_and_refuses_bad_values():
    with pytest.raises(ValueError, match="prefill_host_layer_s needs the model's layers"):
        OverheadCost(ConstantCost(0.01), EngineOverheads(prefill_host_layer_s=H))
    for layers in (0, -3, 2.5, True, "32"):
        with pytest.raises(ValueError, match="layers must be an int >= 1"):
            OverheadCost(ConstantCost(0.01), EngineOverheads(prefill_host_layer_s=H), layers)
    for value in (-1e-3, float("nan"), float("inf"), True, "1ms"):
        with pytest.raises(ValueError, match="prefill_host_layer_s"):
            EngineOverheads(prefill_host_layer_s=value)
    # without the term the layers are not needed and change nothing
    plain = OverheadCost(ConstantCost(0.01), EngineOverheads(per_seq_s=1e-4))
    assert plain.prefill_host_s == 0.0 and plain(_batch(prefills=[(9, 0)])) == 0.01 + 1e-4


def _ttfts(prompts, ov, model="llama-3.1-8b", cost=None, scheduler="sglang", tp=1):
    df = pd.DataFrame({"arrival_time": np.arange(len(prompts)) * 10.0,
                       "num_prompt_tokens": prompts, "num_output_tokens": 4})
    cfg = SimConfig(scheduler=scheduler, model=model, gpu="h100", tensor_parallel=tp,
                    cost_model=cost if cost is not None else ConstantCost(0.01),
                    engine_overheads=ov)
    return run(df, cfg)


@pytest.mark.parametrize("scheduler", ["vllm", "sglang"])
def test_a_lone_request_waits_for_the_host_once_and_its_decodes_do_not(scheduler):
    alone = _ttfts([64], None, scheduler=scheduler).requests
    res = _ttfts([64], EngineOverheads(prefill_host_layer_s=H), scheduler=scheduler)
    # llama-3.1-8b: 32 layers, 32 ms of launches where the GPU needs 10 ms
    assert res.requests["ttft"].iloc[0] - alone["ttft"].iloc[0] == pytest.approx(0.022)
    assert (res.requests["e2e"] - res.requests["ttft"]).iloc[0] == pytest.approx(
        (alone["e2e"] - alone["ttft"]).iloc[0])
    assert res.summary()["engine_overhead_prefill_host_s"] == pytest.approx(0.032)


def test_the_layers_are_the_run_models():
    res = _ttfts([64], EngineOverheads(prefill_host_layer_s=H), model="llama-3.1-70b",
                 tp=4)
    assert res.requests["ttft"].iloc[0] == pytest.approx(0.080)  # 80 layers


def test_the_first_token_is_flat_in_the_prompt_while_the_host_is_the_longer():
    cost = RooflineCost("llama-3.1-8b", "h100")
    prompts = [256, 1024, 2048]
    bare = _ttfts(prompts, None, cost=cost).requests["ttft"].to_numpy()
    host = _ttfts(prompts, EngineOverheads(prefill_host_layer_s=2e-3), cost=cost)
    t = host.requests["ttft"].to_numpy()
    assert bare[2] > bare[0] * 2  # the roofline's slope with the prompt
    assert t == pytest.approx(np.full(3, 0.064))  # 32 layers x 2 ms hide every one of them
    assert (t > bare).all()


def test_a_batch_of_prefills_pays_the_floor_once():
    df = pd.DataFrame({"arrival_time": np.zeros(8), "num_prompt_tokens": 64,
                       "num_output_tokens": 4})
    cfg = dict(scheduler="sglang", cost_model=ConstantCost(0.01))
    alone = run(df, SimConfig(**cfg)).requests["ttft"].to_numpy()
    t = run(df, SimConfig(**cfg, engine_overheads=EngineOverheads(
        prefill_host_layer_s=H))).requests["ttft"].to_numpy()
    assert t - alone == pytest.approx(np.full(8, 0.022))  # one iteration: 32 ms, not 8 x


def test_the_summary_records_it_only_when_set():
    s = _ttfts([64], EngineOverheads(prefill_host_layer_s=H)).summary()
    assert s["engine_overhead_prefill_host_layer_s"] == H
    assert "engine_overhead_prefill_host_layer_s" not in _ttfts(
        [64], EngineOverheads(per_request_s=0.01)).summary()


def test_the_compiled_price_applies_it_the_same_way():
    cost = RooflineCost("llama-3.1-70b", "h100", tensor_parallel=4)
    wrapped = OverheadCost(cost, EngineOverheads(prefill_host_layer_s=0.5e-3,
                                                 per_seq_s=1e-4), 80)
    price = batch_pricer(wrapped)
    assert price is not None and price.prefill_host_s == wrapped.prefill_host_s
    seen = set()
    for prefills, dec, ctx in [((), 12, 9000), (((70, 0),), 0, 0), (((700, 0), (30, 99)), 5,
                                                                     4000),
                               (((16000, 0),), 0, 0)]:
        b = make_batch(0, prefills, sum(n for n, _ in prefills), dec, ctx, None, None, None, 0)
        got = price.price(prefills, b.num_prefill_tokens, dec, ctx, 0)
        assert got == wrapped(b)
        seen.add(bool(prefills) and got - 1e-4 * (dec + len(prefills)) == pytest.approx(0.040))
    assert seen == {True, False}  # the floor bound some batches and not others


def test_pickled_it_keeps_the_layers():
    cost = OverheadCost(ConstantCost(0.01), EngineOverheads(prefill_host_layer_s=H), 32)
    back = pickle.loads(pickle.dumps(cost))
    assert back.layers == 32 and back(_batch(prefills=[(5, 0)])) == cost(_batch(prefills=[(5, 0)]))


def test_the_stored_fit_kept_the_grid_point_with_the_best_fit_score():
    """experiments/fit_overheads.py step 2b, in each form (per layer, per kernel launch): the
    form's point is the smallest grid point no larger one beats by MIN_GAIN; the kept form is
    the per-launch one only where its point beats the per-layer one's by MIN_GAIN."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import fit_overheads as fo
    stored = json.loads(resources.files("sim").joinpath("data/engine_overheads.json")
                        .read_text())
    for engine, t in stored["engines"].items():
        best = {}
        for field, grid in fo.HOST_GRIDS.items():
            scores = [r for r in stored["prefill_host"] if r["engine"] == engine
                      and r["form"] == field]
            assert sorted(r[field] for r in scores) == list(grid)
            for r in sorted(scores, key=lambda r: r[field]):
                if field not in best or r["fit_score_all_metrics"] < \
                        best[field]["fit_score_all_metrics"] - fo.MIN_GAIN:
                    best[field] = r
        layer, launch = best["prefill_host_layer_s"], best["prefill_host_launch_s"]
        kept, other = (("prefill_host_launch_s", "prefill_host_layer_s")
                       if launch["fit_score_all_metrics"] < layer["fit_score_all_metrics"]
                       - fo.MIN_GAIN else ("prefill_host_layer_s", "prefill_host_launch_s"))
        assert t[kept] == best[kept][kept] and t[other] == 0.0
        assert t["per_request_s"] == best[kept]["per_request_s"] or t.get("per_prefill_iter_s")
        ov = fitted_overheads(engine)
        assert (ov.prefill_host_layer_s, ov.prefill_host_launch_s) == (
            t["prefill_host_layer_s"], t["prefill_host_launch_s"])


def test_the_cli_summary_names_it_only_when_set():
    from sim.cli.output import format_summary
    s = _ttfts([64], EngineOverheads(prefill_host_layer_s=H)).summary()
    assert "a prefill iteration at least 32 ms (the host's launches, 1 ms a layer)" \
        in format_summary(s)
    assert "host's launches" not in format_summary(
        _ttfts([64], EngineOverheads(per_seq_s=1e-4)).summary())
