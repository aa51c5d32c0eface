"""The prefill host floor counted in kernel launches (``EngineOverheads.prefill_host_launch_s``
x one prefill forward's launches of the run's model, :mod:`sim.specs.prefill_launches`): its
closed form, the run's model / tensor parallel / precision choosing the count, both floors
adding, bad values, the summary and CLI record, and the compiled price."""

import pickle

import numpy as np
import pandas as pd
import pytest

from sim import SimConfig, run
from sim.costs.overheads import EngineOverheads, OverheadCost
from sim.costs.roofline import RooflineCost
from sim.costs.roofline_price import batch_pricer
from sim.costs.simple import ConstantCost
from sim.engine.core.batch import make_batch
from sim.specs.models import get_model
from sim.specs.prefill_launches import prefill_launches

C = 50e-6  # 50 us a launch


def _prefill(n=64):
    return make_batch(0, ((n, 0),), n, 0, 0, None, None, None, 0)


def _decode():
    return make_batch(0, (), 0, 12, 1200, None, None, None, 0)


def test_a_prefill_iteration_takes_at_least_its_launches():
    cost = OverheadCost(ConstantCost(0.010), EngineOverheads(prefill_host_launch_s=C),
                        launches=1000)
    assert cost.prefill_host_s == pytest.approx(0.050)
    assert cost(_prefill()) == pytest.approx(0.050) and cost(_decode()) == 0.010
    both = OverheadCost(ConstantCost(0.010), EngineOverheads(
        prefill_host_launch_s=C, prefill_host_layer_s=1e-3), 32, 1000)
    assert both.prefill_host_s == pytest.approx(0.032 + 0.050)  # the two floors add


def test_it_needs_the_launches_and_refuses_bad_values():
    with pytest.raises(ValueError, match="prefill_host_launch_s needs the model's prefill"):
        OverheadCost(ConstantCost(0.01), EngineOverheads(prefill_host_launch_s=C), 32)
    for n in (0, -1, 3.0, True):
        with pytest.raises(ValueError, match="launches must be an int >= 1"):
            OverheadCost(ConstantCost(0.01), EngineOverheads(prefill_host_launch_s=C),
                         launches=n)
    for value in (-1e-6, float("nan"), "50us", False):
        with pytest.raises(ValueError, match="prefill_host_launch_s"):
            EngineOverheads(prefill_host_launch_s=value)


def _run(ov, model="llama-3.1-8b", tp=1, dtype="fp16", cost=None):
    df = pd.DataFrame({"arrival_time": [0.0], "num_prompt_tokens": [64],
                       "num_output_tokens": [4]})
    return run(df, SimConfig(scheduler="sglang", model=model, gpu="h100", tensor_parallel=tp,
                             weight_dtype=dtype, engine_overheads=ov,
                             cost_model=cost if cost is not None else ConstantCost(0.001)))


@pytest.mark.parametrize("model,tp,dtype", [("llama-3.1-8b", 1, "fp16"),
                                            ("llama-3.1-70b", 4, "fp16"),
                                            ("llama-3.1-70b", 4, "fp8")])
def test_the_count_is_the_run_models_at_its_tp_and_precision(model, tp, dtype):
    res = _run(EngineOverheads(prefill_host_launch_s=C), model, tp, dtype)
    n = prefill_launches(get_model(model), tp, dtype)
    s = res.summary()
    assert s["engine_overhead_prefill_launches"] == n
    assert s["engine_overhead_prefill_host_s"] == pytest.approx(n * C)
    assert res.requests["ttft"].iloc[0] == pytest.approx(n * C)  # the host far longer


def test_the_summary_and_cli_record_it_only_when_set():
    from sim.cli.output import format_summary
    s = _run(EngineOverheads(prefill_host_launch_s=C)).summary()
    assert "engine_overhead_prefill_host_layer_s" not in s
    assert "(the host's launches, 328 kernels x 50 us)" in format_summary(s)
    s2 = _run(EngineOverheads(per_seq_s=1e-4)).summary()
    assert "engine_overhead_prefill_launches" not in s2
    assert "host's launches" not in format_summary(s2)


def test_the_compiled_price_applies_it_the_same_way():
    cost = RooflineCost("llama-3.1-70b", "h100", tensor_parallel=4)
    n = prefill_launches(get_model("llama-3.1-70b"), 4)
    wrapped = OverheadCost(cost, EngineOverheads(prefill_host_launch_s=C, per_seq_s=1e-4),
                           launches=n)
    price = batch_pricer(wrapped)
    assert price is not None and price.prefill_host_s == wrapped.prefill_host_s
    bound = []
    for prefills, dec, ctx in [((), 12, 9000), (((70, 0),), 0, 0), (((16000, 0),), 0, 0)]:
        b = make_batch(0, prefills, sum(p for p, _ in prefills), dec, ctx, None, None, None, 0)
        got = price.price(prefills, b.num_prefill_tokens, dec, ctx, 0)
        assert got == wrapped(b)
        bound.append(got - 1e-4 * (dec + len(prefills)) == pytest.approx(n * C))
    assert bound == [False, True, False]  # decode: none; short prompt: the host; long: GPU


def test_pickled_it_keeps_the_launches():
    cost = OverheadCost(ConstantCost(0.01), EngineOverheads(prefill_host_launch_s=C),
                        launches=900)
    back = pickle.loads(pickle.dumps(cost))
    assert back.launches == 900 and np.isclose(back(_prefill()), cost(_prefill()))
