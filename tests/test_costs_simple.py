"""sim/costs/simple.py: ConstantCost and LinearCost priced on hand-built batches."""

import dataclasses
import math

import pytest
from hypothesis import given, strategies as st

from sim.costs.simple import ConstantCost, LinearCost
from sim.engine.core.batch import Batch

FIELDS = ("base", "per_prefill_token", "per_decode_token", "per_context_token")


def batch(prefills=(), decodes=0, decode_context=0, iteration=0):
    """A batch from ``(new, cached)`` prefill pairs and ``decodes`` requests decoding over
    ``decode_context`` tokens in all."""
    prefills = tuple(prefills)
    return Batch(iteration, prefills, sum(new for new, _ in prefills), decodes, decode_context,
                 prefill_ids=tuple(range(len(prefills))))


MIXED = batch(prefills=[(100, 0), (30, 200)], decodes=4, decode_context=1000)


# -- ConstantCost ------------------------------------------------------------------------------
def test_constant_cost_ignores_the_batch():
    c = ConstantCost(0.025)
    assert c(MIXED) == 0.025
    assert c(batch(decodes=1, decode_context=5)) == 0.025
    assert c(batch(prefills=[(8192, 0)])) == 0.025


def test_constant_cost_accepts_an_int_and_is_frozen():
    c = ConstantCost(2)
    assert c(MIXED) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.seconds = 1.0
    assert not hasattr(c, "__dict__")  # slots


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, math.nan, math.inf, -math.inf])
def test_constant_cost_rejects_non_positive_or_non_finite(bad):
    with pytest.raises(ValueError, match="seconds"):
        ConstantCost(bad)


@pytest.mark.parametrize("bad", ["0.1", None, True, [0.1]])
def test_constant_cost_rejects_non_numbers(bad):
    with pytest.raises(TypeError, match="seconds must be a number"):
        ConstantCost(bad)


# -- LinearCost --------------------------------------------------------------------------------
def test_linear_cost_formula_on_a_mixed_batch():
    c = LinearCost(base=1e-3, per_prefill_token=2e-5, per_decode_token=3e-4)
    # 130 prefill tokens, 4 decodes
    assert c(MIXED) == pytest.approx(1e-3 + 2e-5 * 130 + 3e-4 * 4, rel=1e-12)


def test_linear_cost_each_term_alone():
    assert LinearCost(base=0.5)(MIXED) == 0.5
    assert LinearCost(per_prefill_token=1.0)(MIXED) == 130
    assert LinearCost(per_decode_token=1.0)(MIXED) == 4
    # context: the decodes' 1000 tokens + (100 + 0) + (30 + 200) of the prefills
    assert MIXED.context_tokens == 1330
    assert LinearCost(per_context_token=1.0)(MIXED) == 1330


def test_linear_cost_context_term_counts_cached_prefix_tokens():
    c = LinearCost(per_context_token=1e-6)
    cold = batch(prefills=[(64, 0)])
    warm = batch(prefills=[(64, 512)])
    assert c(cold) == pytest.approx(64e-6)
    assert c(warm) == pytest.approx((64 + 512) * 1e-6)
    # the prefill term sees only the new tokens
    assert LinearCost(per_prefill_token=1.0)(warm) == LinearCost(per_prefill_token=1.0)(cold)


def test_linear_cost_all_terms_together():
    c = LinearCost(base=1.0, per_prefill_token=10.0, per_decode_token=100.0,
                   per_context_token=1000.0)
    b = batch(prefills=[(2, 3)], decodes=1, decode_context=7)
    # 1 + 10*2 + 100*1 + 1000*(7 + 2 + 3)
    assert c(b) == 1 + 20 + 100 + 12000


def test_linear_cost_of_a_decode_only_batch_with_no_context_coefficient():
    c = LinearCost(base=1e-3, per_decode_token=1e-4)
    assert c(batch(decodes=10, decode_context=10_000)) == pytest.approx(1e-3 + 1e-3)


def test_linear_cost_is_frozen_with_slots():
    c = LinearCost(base=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.base = 2.0
    assert not hasattr(c, "__dict__")
    assert dataclasses.replace(c, per_decode_token=1.0)(MIXED) == 1.0 + 4


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("bad", [-1e-9, math.nan, math.inf])
def test_linear_cost_rejects_bad_coefficients_naming_the_field(field, bad):
    kwargs = {"base": 1.0, field: bad}
    with pytest.raises(ValueError, match=rf"^{field} must be a finite number >= 0"):
        LinearCost(**kwargs)


@pytest.mark.parametrize("field", FIELDS)
def test_linear_cost_rejects_non_numbers_naming_the_field(field):
    with pytest.raises(TypeError, match=rf"^{field} must be a number"):
        LinearCost(**{"base": 1.0, field: "1e-3"})
    with pytest.raises(TypeError, match=rf"^{field} must be a number"):
        LinearCost(**{"base": 1.0, field: False})


def test_linear_cost_needs_one_positive_coefficient():
    with pytest.raises(ValueError, match="at least one positive coefficient"):
        LinearCost()
    with pytest.raises(ValueError, match="at least one positive coefficient"):
        LinearCost(base=0.0, per_prefill_token=0, per_decode_token=0.0, per_context_token=0)


@pytest.mark.parametrize("field", FIELDS)
def test_any_single_positive_coefficient_is_enough(field):
    assert LinearCost(**{field: 1e-6})(MIXED) >= 0


def test_simple_costs_drive_the_engine_to_the_closed_form():
    """One request alone: prefill iteration + (n - 1) decode iterations."""
    import sim
    prompt, out = 40, 5
    lin = LinearCost(base=1e-3, per_prefill_token=1e-5, per_decode_token=2e-4)
    res = sim.run([{"arrival_time": 0.0, "num_prompt_tokens": prompt, "num_output_tokens": out}],
                  scheduler="continuous", cost_model=lin, kv_blocks=64)
    expected = (1e-3 + 1e-5 * prompt) + (out - 1) * (1e-3 + 2e-4)
    assert res.requests["e2e"].iloc[0] == pytest.approx(expected, rel=1e-12)
    res = sim.run([{"arrival_time": 0.0, "num_prompt_tokens": prompt, "num_output_tokens": out}],
                  scheduler="continuous", cost_model=ConstantCost(0.01), kv_blocks=64)
    assert res.requests["e2e"].iloc[0] == pytest.approx(out * 0.01, rel=1e-12)


# -- properties --------------------------------------------------------------------------------
coef = st.floats(min_value=0.0, max_value=1.0, allow_nan=False, allow_infinity=False)
count = st.integers(min_value=0, max_value=10_000)
prefill_pair = st.tuples(st.integers(1, 4096), st.integers(0, 8192))


@given(base=coef, per_prefill=coef, per_decode=coef, per_context=coef,
       prefills=st.lists(prefill_pair, max_size=6), decodes=st.integers(0, 64),
       decode_context=count, which=st.sampled_from(["new", "cached", "decodes", "context"]),
       extra=st.integers(1, 1000))
def test_linear_cost_is_monotone_in_each_token_count(base, per_prefill, per_decode, per_context,
                                                    prefills, decodes, decode_context, which,
                                                    extra):
    if not (base or per_prefill or per_decode or per_context):
        base = 1e-3
    c = LinearCost(base, per_prefill, per_decode, per_context)
    before = batch(prefills, decodes, decode_context)
    if which == "new":
        prefills = [(n + extra, k) for n, k in prefills] or [(extra, 0)]
    elif which == "cached":
        prefills = [(n, k + extra) for n, k in prefills] or [(1, extra)]
    elif which == "decodes":
        decodes += extra
    else:
        decode_context += extra
    after = batch(prefills, decodes, decode_context)
    assert c(after) >= c(before) >= base
    assert math.isfinite(c(after))


@given(base=coef, per_prefill=coef, per_decode=coef, per_context=coef,
       prefills=st.lists(prefill_pair, max_size=6), decodes=st.integers(0, 64),
       decode_context=count)
def test_linear_cost_equals_its_formula(base, per_prefill, per_decode, per_context, prefills,
                                        decodes, decode_context):
    if not (base or per_prefill or per_decode or per_context):
        base = 1e-3
    b = batch(prefills, decodes, decode_context)
    new = sum(n for n, _ in prefills)
    context = decode_context + sum(n + k for n, k in prefills)
    expected = base + per_prefill * new + per_decode * decodes + per_context * context
    assert LinearCost(base, per_prefill, per_decode, per_context)(b) == pytest.approx(
        expected, rel=1e-12, abs=1e-300)


@given(coeffs=st.tuples(*[st.sampled_from([0, 0.0, 1e-7, 3e-4, 0.004, 0.1, 7])] * 4),
       decodes=st.integers(1, 2000), context=st.integers(1, 10**8))
def test_pure_decode_cost_is_the_batch_price_bit_for_bit(coeffs, decodes, context):
    """The engine's fast-forward prices pure-decode iterations with ``pure_decode_cost``
    instead of the batch: the same float, for any coefficients (ints too) and sizes."""
    if not any(coeffs):
        return
    cost = LinearCost(*coeffs)
    price = cost.pure_decode_cost(decodes)(context)
    assert price == cost(batch(decodes=decodes, decode_context=context))
    assert type(price) is type(cost(batch(decodes=decodes, decode_context=context)))
    constant = ConstantCost(0.0123)
    assert constant.pure_decode_cost(decodes)(context) == constant(batch(decodes=decodes))


def test_decode_pricer_trusts_pure_decode_cost_only_where_it_prices_what_call_does():
    """``decode_pricer``: a cost model's own ``pure_decode_cost`` (class or instance), none
    for a subclass overriding ``__call__`` alone, nor for a plain function."""
    from sim.engine.core.batch import decode_pricer

    class Scaled(LinearCost):
        def __call__(self, b):
            return 2 * LinearCost.__call__(self, b)

    class ScaledBoth(Scaled):
        def pure_decode_cost(self, n):
            f = LinearCost.pure_decode_cost(self, n)
            return lambda ctx: 2 * f(ctx)

    class Renamed(LinearCost):  # changes nothing that prices
        name = "renamed"

    assert decode_pricer(LinearCost(0.01)) is not None
    assert decode_pricer(Renamed(0.01)) is not None
    assert decode_pricer(Scaled(0.01)) is None
    assert decode_pricer(ScaledBoth(0.01))(5)(100) == ScaledBoth(0.01)(batch(decodes=5,
                                                                              decode_context=100))

    def f(b):
        return 0.01
    assert decode_pricer(f) is None
    f.pure_decode_cost = lambda n: lambda ctx: 0.01
    assert decode_pricer(f) is f.pure_decode_cost
