"""RooflineCost.least_prefill_time: a floor under any schedule's prefill time (the planner's
prefill bound, sim/tools/plan_bounds.py), checked against the price of random schedules, and
the monotone layers' time it rests on, on every GPU in the table."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from sim.costs.roofline import RooflineCost
from sim.engine.core.batch import Batch
from sim.specs.gpus import gpu_presets

MODELS = [("llama-3.1-8b", 1, "fp16"), ("llama-3.1-70b", 4, "fp8"), ("mixtral-8x7b", 2, "fp16"),
          ("deepseek-v3", 8, "fp8"), ("qwen3-30b-a3b", 2, "fp16")]


def _cost(model, gpu, tp, dtype):
    try:
        return RooflineCost(model, gpu, tensor_parallel=tp, weight_dtype=dtype)
    except ValueError:  # (no scale-up link for this TP, or the weights do not fit it)
        return None


@pytest.mark.parametrize("gpu", gpu_presets())
def test_the_layers_time_never_falls_as_tokens_grow(gpu):
    """The floor's grid argument needs ``c(T)`` non-decreasing: tile rounding may make the
    layers' time a staircase, never a step down (1..20,000 tokens, each model that runs)."""
    priced = 0
    for model, tp, dtype in MODELS:
        cost = _cost(model, gpu, tp, dtype)
        if cost is None:
            continue
        times = np.array(cost._layers_times(np.arange(1, 20001)))
        assert (np.diff(times) >= 0).all(), (model, gpu)
        priced += 1
    assert priced >= 1


@st.composite
def schedules(draw):
    """Prompts cut into chunks, the chunks spread over iterations in prompt order."""
    prompts = draw(st.lists(st.integers(1, 6000), min_size=1, max_size=6))
    iterations = []
    for length in prompts:
        done = 0
        while done < length:
            new = draw(st.integers(1, length - done))
            where = draw(st.integers(0, len(iterations)))  # a later iteration or a new one
            if where == len(iterations):
                iterations.append([])
            iterations[where].append((new, done))
            done += new
    return prompts, iterations


@pytest.mark.parametrize("model, gpu, tp, dtype", [
    ("llama-3.1-8b", "h100", 1, "fp16"), ("llama-3.1-8b", "l40s", 1, "fp8"),
    ("deepseek-v3", "h200", 8, "fp8"), ("mixtral-8x7b", "mi300x", 2, "fp16"),
    ("llama-3.1-70b", "h100", 4, "fp8")])
@settings(max_examples=40, deadline=None)
@given(schedule=schedules())
def test_no_schedule_prefills_faster_than_the_floor(model, gpu, tp, dtype, schedule):
    """However the prompts are chunked and batched (a chunk's ``cached`` is its prompt's
    tokens before it; chunk order within an iteration is free), the iterations' prices add
    up to at least the floor."""
    prompts, iterations = schedule
    cost = RooflineCost(model, gpu, tensor_parallel=tp, weight_dtype=dtype)
    spent = sum(cost(Batch(0, chunks, sum(n for n, _ in chunks), 0, 0))
                for chunks in iterations)
    assert cost.least_prefill_time(prompts) <= spent


def test_the_floor_is_close_for_one_large_prompt():
    """Not a vacuous floor: one 8,192-token prompt in one iteration costs within 1.3x of it.
    And the shortest prompts are not the cheapest tokens (the planner's old prefill bound
    assumed so): 410 prefills of 40 tokens cost more than 4 of 4,096, 16,384 tokens."""
    cost = RooflineCost("llama-3.1-8b", "h100", tensor_parallel=4, weight_dtype="fp8")
    floor = cost.least_prefill_time([8192])
    assert floor <= cost(Batch(0, ((8192, 0),), 8192, 0, 0)) < 1.3 * floor
    assert cost(Batch(0, ((4096, 0),) * 4, 16384, 0, 0)) < cost(
        Batch(0, ((40, 0),) * 410, 16400, 0, 0))
