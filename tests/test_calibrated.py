"""sim/costs/calibrated.py: CalibratedCost on a small synthetic profile built here.

tests/test_calibrate.py covers the profile that ``calibrate`` measures (its fit, the file round
trip, the CLI, the shipped profile's labels); this module checks the interpolation and the
terms against closed forms, with tables written by hand.
"""

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.costs.calibrated import (DEFAULT_WEIGHTS, PROFILE_FORMAT, TERMS, CalibratedCost,
                                  _bilinear, _loglog_interp, shipped_cpu_profile)
from sim.engine.core.batch import Batch

# closed forms of the synthetic tables
LIN = lambda n: 2e-5 * n ** 0.9  # noqa: E731  linear layers vs tokens
LM = lambda s: 1e-5 * s ** 0.5  # noqa: E731  lm head vs sequences
DEC = lambda b, L: 1e-7 * b ** 0.8 * L ** 1.2 / 64  # noqa: E731  decode attention (batch, context)
PRE = lambda c, p: 1e-6 * c ** 1.1 * (1 + p / 100)  # noqa: E731  prefill (chunk, cached prefix)

LIN_X = [1, 4, 16, 64, 256, 1024]
LM_X = [1, 2, 8, 32, 128]
DEC_X, DEC_Y = [1, 2, 4, 8, 16, 64], [16, 64, 256, 1024, 4096]
PRE_X, PRE_Y = [8, 32, 128, 512, 2048], [0, 128, 512, 2048]


def make_profile(*, block_size=8, decode_feature="max", weights=None, device="synthetic"):
    p = {
        "format": PROFILE_FORMAT,
        "device": device,
        "model": {"name": "toy"},
        "block_size": block_size,
        "decode_feature": decode_feature,
        "fit": {
            "linear": {"kind": "table1d", "x": LIN_X, "y": [LIN(x) for x in LIN_X]},
            "lm_head": {"kind": "table1d", "x": LM_X, "y": [LM(x) for x in LM_X]},
            "decode_attention": {"kind": "table2d", "x": DEC_X, "y": DEC_Y,
                                 "z": [[DEC(b, L) for L in DEC_Y] for b in DEC_X],
                                 "y_transform": "log"},
            "prefill_attention": {"kind": "table2d", "x": PRE_X, "y": PRE_Y,
                                  "z": [[PRE(c, p) for p in PRE_Y] for c in PRE_X],
                                  "y_transform": "linear"},
        },
    }
    if weights is not None:
        p["weights"] = weights
    return p


@pytest.fixture
def profile():
    return make_profile()


def col(name):
    return TERMS.index(name)


# -- interpolation -----------------------------------------------------------------------------
positive = st.floats(min_value=0.05, max_value=1e5, allow_nan=False, allow_infinity=False)


@given(x=positive, a=st.floats(1e-7, 1e-2), k=st.floats(-1.0, 2.5))
def test_loglog_interp_recovers_any_power_law_inside_and_outside_the_grid(x, a, k):
    xs = np.array([1.0, 3.0, 10.0, 100.0, 1000.0])
    assert _loglog_interp(x, xs, a * xs ** k) == pytest.approx(a * x ** k, rel=1e-9)


def test_loglog_interp_passes_through_the_nodes_and_is_piecewise():
    xs = np.array([1.0, 2.0, 4.0, 8.0])
    ys = np.array([1.0, 4.0, 5.0, 40.0])  # not one power law: three different segments
    assert np.allclose(_loglog_interp(xs, xs, ys), ys, rtol=1e-12)
    # geometric midpoint of a segment: geometric mean of its ends
    assert _loglog_interp(math.sqrt(2 * 4), xs, ys) == pytest.approx(math.sqrt(4 * 5))
    # extrapolation follows the end segments' slopes (x^2 below, x^3 above)
    assert _loglog_interp(0.5, xs, ys) == pytest.approx(0.25)
    assert _loglog_interp(16.0, xs, ys) == pytest.approx(320.0)
    # vectorised
    assert _loglog_interp([1.0, 8.0], xs, ys).shape == (2,)


@settings(max_examples=60)
@given(b=st.floats(0.5, 256), L=st.floats(2, 20_000))
def test_bilinear_log_table_is_exact_for_a_power_law_in_both_axes(b, L):
    table = make_profile()["fit"]["decode_attention"]
    assert _bilinear(b, L, table) == pytest.approx(DEC(b, L), rel=1e-9)


@settings(max_examples=60)
@given(c=st.floats(1, 8192), p=st.floats(0, 10_000))
def test_bilinear_linear_table_is_exact_for_power_law_times_affine(c, p):
    """y_transform="linear": time affine in the cached prefix, power law in the chunk - exact off
    the grid lines and beyond the last one (test_calibrate checks it only on a kept line)."""
    table = make_profile()["fit"]["prefill_attention"]
    assert _bilinear(c, p, table) == pytest.approx(PRE(c, p), rel=1e-9)


def test_bilinear_linear_table_clamps_negative_extrapolation_at_zero():
    table = {"x": [1, 2], "y": [0, 10], "z": [[10.0, 1.0], [10.0, 1.0]], "y_transform": "linear"}
    assert _bilinear(1.5, 5.0, table) == pytest.approx(5.5)
    assert _bilinear(1.5, 100.0, table) == 0.0  # 10 - 0.9 * 100 < 0


# -- the cost model ---------------------------------------------------------------------------
def test_profile_must_carry_the_format(profile):
    for bad in ({}, {**profile, "format": "llm-serving-sim calibration profile v0"}):
        with pytest.raises(ValueError, match="not a calibration profile"):
            CalibratedCost(bad)


def test_terms_closed_form(profile):
    cost = CalibratedCost(profile)
    prefills, lengths = [(64, 100), (10, 0)], [30, 200, 9]
    t = cost.terms(prefills, lengths)
    assert t.shape == (len(TERMS),)
    assert t[col("linear")] == pytest.approx(LIN(64 + 10 + 3))  # tokens computed
    assert t[col("lm_head")] == pytest.approx(LM(5))  # sequences
    assert t[col("decode_attention")] == pytest.approx(DEC(3, 200))  # longest context ("max")
    assert t[col("prefill_attention")] == pytest.approx(PRE(64, 100) + PRE(10, 0))
    assert t[col("base_s")] == 1.0
    assert t[col("per_seq_s")] == 5
    # block_size 8: ceil(30/8) + ceil(200/8) + ceil(9/8) + ceil(164/8) + ceil(10/8)
    assert t[col("per_block_s")] == 4 + 25 + 2 + 21 + 2


def test_terms_of_prefill_only_and_decode_only_batches(profile):
    cost = CalibratedCost(profile)
    t = cost.terms([(16, 0)], [])
    assert t[col("decode_attention")] == 0.0 and t[col("per_seq_s")] == 1
    assert t[col("per_block_s")] == 2
    t = cost.terms([], [8] * 4)
    assert t[col("prefill_attention")] == 0.0 and t[col("per_seq_s")] == 4
    assert t[col("per_block_s")] == 4 and t[col("linear")] == pytest.approx(LIN(4))


def test_block_size_defaults_to_16():
    p = make_profile()
    del p["block_size"]
    assert CalibratedCost(p).terms([], [17])[col("per_block_s")] == 2
    assert CalibratedCost(make_profile(block_size=4)).terms([], [17])[col("per_block_s")] == 5


def test_decode_feature_max_or_mean():
    lengths = [16, 4096]
    t_max = CalibratedCost(make_profile(decode_feature="max")).terms([], lengths)
    t_mean = CalibratedCost(make_profile(decode_feature="mean")).terms([], lengths)
    assert t_max[col("decode_attention")] == pytest.approx(DEC(2, 4096))
    assert t_mean[col("decode_attention")] == pytest.approx(DEC(2, (16 + 4096) / 2))
    p = make_profile()
    del p["decode_feature"]  # the padded NumPy kernel's feature is the default
    assert CalibratedCost(p).terms([], lengths)[col("decode_attention")] == pytest.approx(
        DEC(2, 4096))


def test_default_weights_sum_the_four_tables(profile):
    cost = CalibratedCost(profile)
    assert list(cost.weights) == [DEFAULT_WEIGHTS[k] for k in TERMS]
    expected = LIN(64 + 2) + LM(3) + DEC(2, 200) + PRE(64, 100)
    assert cost.predict([(64, 100)], [30, 200]) == pytest.approx(expected, rel=1e-9)


def test_custom_weights_dot_terms():
    weights = {"linear": 2.0, "lm_head": 0.5, "decode_attention": 1.5, "prefill_attention": 0.0,
               "base_s": 1e-4, "per_seq_s": 1e-5, "per_block_s": 1e-6}
    cost = CalibratedCost(make_profile(weights=weights))
    assert list(cost.weights) == [weights[k] for k in TERMS]
    expected = (2 * LIN(64 + 2) + 0.5 * LM(3) + 1.5 * DEC(2, 200) + 1e-4 + 3e-5
                + 1e-6 * (4 + 25 + 21))
    assert cost.predict([(64, 100)], [30, 200]) == pytest.approx(expected, rel=1e-9)
    partial = CalibratedCost(make_profile(weights={"base_s": 1e-3}))  # others from the defaults
    assert partial.predict([(64, 0)], []) == pytest.approx(
        LIN(64) + LM(1) + PRE(64, 0) + 1e-3, rel=1e-9)


def test_repeated_queries_give_the_same_answer(profile):
    cost = CalibratedCost(profile)
    first = [cost.predict([(n, 0)], [n] * 3) for n in (1, 7, 300, 7, 1)]
    again = [cost.predict([(n, 0)], [n] * 3) for n in (1, 7, 300, 7, 1)]
    assert first == again and first[1] == first[3] and first[0] == first[4]


def test_call_prices_a_batch_from_its_decode_lengths(profile):
    cost = CalibratedCost(profile)
    lengths = np.array([30, 200], dtype=np.int64)
    b = Batch(5, [(64, 100)], 64, 2, 230, prefill_ids=[7], decode_ids=(1, 2),
              decode_lengths=lengths)
    assert cost(b) == cost.predict([(64, 100)], [30, 200])
    assert np.array_equal(cost.batch_terms(b), cost.terms([(64, 100)], [30, 200]))
    # a prefill-only batch needs no per-decode detail
    assert cost(Batch(0, [(16, 0)], 16, 0, 0)) == cost.predict([(16, 0)], [])


def test_call_without_decode_detail_says_how_to_get_it(profile):
    b = Batch(0, [], 0, 2, 40)  # what an engine gives a model without the flag
    with pytest.raises(AttributeError, match="needs_decode_lengths"):
        CalibratedCost(profile)(b)


def test_needs_decode_lengths_and_the_engine_provides_them(profile):
    assert CalibratedCost.needs_decode_lengths is True
    seen = []

    class Recording(CalibratedCost):
        def __call__(self, batch):
            seen.append(batch)
            return super().__call__(batch)

    rng = np.random.default_rng(7)
    n = 60
    df = pd.DataFrame({"arrival_time": np.sort(rng.uniform(0, 0.05, n)),
                       "num_prompt_tokens": rng.integers(8, 300, n),
                       "num_output_tokens": rng.integers(2, 40, n)})
    res = sim.run(df, cost_model=Recording(profile), kv_blocks=256, block_size=8,
                  max_batch_size=16)
    assert (res.requests["status"] == "finished").all()
    assert len(seen) == len(res.iterations)
    decoding = [b for b in seen if b.num_decode_tokens]
    assert decoding  # the run had decode iterations
    for b in decoding:
        assert len(b.decode_lengths) == len(b.decode_ids) == b.num_decode_tokens
        assert int(b.decode_lengths.sum()) == b.decode_context_tokens
        assert (b.decode_lengths >= 1).all()
    # the iteration durations are the model's prices of those batches
    assert np.allclose(res.iterations["duration"], [CalibratedCost(profile)(b) for b in seen],
                       rtol=1e-12)


# -- files --------------------------------------------------------------------------------------
def test_from_file_round_trips_a_synthetic_profile(profile, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    for given_as in (path, str(path)):
        cost = CalibratedCost.from_file(given_as)
        assert cost.predict([(64, 100)], [30]) == CalibratedCost(profile).predict([(64, 100)], [30])
    assert repr(cost) == "CalibratedCost('synthetic', model='toy')"


@pytest.mark.parametrize("content, message", [
    ("{not json", "is not JSON"),
    ("", "is not JSON"),
    (json.dumps({"format": "some other tool v1"}), "not a calibration profile .*some other tool"),
])
def test_from_file_errors_name_the_problem(tmp_path, content, message):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        CalibratedCost.from_file(path)


def test_from_file_missing_names_the_path(tmp_path):
    missing = tmp_path / "nowhere" / "p.json"
    with pytest.raises(ValueError, match=f"profile '{missing}' does not exist"):
        CalibratedCost.from_file(missing)


@pytest.fixture(scope="module")
def shipped():
    return CalibratedCost.from_file(shipped_cpu_profile())


def test_shipped_cpu_profile_tables_are_well_formed(shipped):
    cost = shipped
    fit = cost.profile["fit"]
    for name in ("linear", "lm_head"):
        x, y = np.asarray(fit[name]["x"]), np.asarray(fit[name]["y"])
        assert len(x) == len(y) >= 2 and (np.diff(x) > 0).all() and (y > 0).all()
    for name in ("decode_attention", "prefill_attention"):
        t = fit[name]
        z = np.asarray(t["z"])
        assert z.shape == (len(t["x"]), len(t["y"])) and (z > 0).all()
        assert (np.diff(t["x"]) > 0).all() and (np.diff(t["y"]) > 0).all()
        assert t["y_transform"] in ("log", "linear")
    assert set(cost.profile["weights"]) == set(TERMS)
    assert cost.profile["block_size"] == sim.KV_BLOCK_SIZE
    assert "cpu" in repr(cost)


@settings(max_examples=50, deadline=None)
@given(prefills=st.lists(st.tuples(st.integers(1, 2048), st.integers(0, 4096)), max_size=4),
       decodes=st.lists(st.integers(1, 8192), max_size=64))
def test_shipped_cpu_profile_prices_any_batch_positive_and_finite(shipped, prefills, decodes):
    if not prefills and not decodes:
        decodes = [1]
    t = shipped.predict(prefills, decodes)
    assert math.isfinite(t) and t > 0



# -- why a profile may not be trusted ---------------------------------------------------------
GATE_PASSED = {"passed": True, "failures": [], "accepted": False}


def test_warning_is_none_for_a_gated_profile_with_nonnegative_weights():
    cost = CalibratedCost(dict(make_profile(weights={"base_s": 1e-4}), quality=GATE_PASSED))
    assert cost.quality == GATE_PASSED and cost.warning() is None


def test_warning_names_negative_weights_and_a_missing_gate():
    cost = CalibratedCost(make_profile(weights={"base_s": -0.00343}))
    msg = cost.warning()
    assert "weight base_s = -0.00343 < 0" in msg and "before the calibration quality gate" in msg
    assert cost.quality is None
    assert cost.predict([], [1]) < 0  # what the warning is about: a price below zero


@pytest.mark.parametrize("accepted, word", [(False, "not accepted"), (True, "accepted with")])
def test_warning_reports_a_failed_gate(accepted, word):
    q = {"passed": False, "failures": ["in-engine median error 35.0% > 10%"],
         "accepted": accepted}
    msg = CalibratedCost(dict(make_profile(), quality=q)).warning()
    assert "failed the calibration quality gate" in msg and word in msg
    assert "in-engine median error 35.0% > 10%" in msg


def test_shipped_profile_warning_lists_its_negative_weights(shipped):
    negative = [k for k, w in zip(TERMS, shipped.weights) if w < 0]
    msg = shipped.warning()
    assert (msg is None) == (not negative and shipped.quality is not None
                             and shipped.quality["passed"])
    for k in negative:
        assert f"weight {k} =" in msg


def test_a_profile_that_is_not_an_object_is_a_clear_error():
    with pytest.raises(ValueError, match="JSON object"):
        CalibratedCost([1, 2])


def test_every_shipped_profile_has_nonnegative_terms_and_a_passed_gate():
    """A shipped profile prices every batch >= 0 by construction: every weight >= 0 (the CPU
    profile's intercept, fitted before the non-negative fit, was clipped to 0: the adjustment is
    recorded in the profile with its reason) and its gate verdict passed, so no warning."""
    from importlib import resources
    shipped = [f for f in resources.files("sim").joinpath("data/profiles").iterdir()
               if f.name.endswith(".json")]
    assert shipped
    for f in shipped:
        cost = CalibratedCost(json.loads(f.read_text()))
        assert (cost.weights >= 0).all(), (f.name, dict(zip(TERMS, cost.weights)))
        assert cost.quality["passed"] and cost.warning() is None
        for adj in cost.profile.get("adjustments", []):
            assert adj["was"] < 0 == adj["now"] and adj["why"]
    # a decode of one token costs at least its kernels (no negative fixed term)
    cpu = CalibratedCost(json.loads(shipped_cpu_profile().read_text()))
    kernels = cpu.terms([], [1])[:4] @ cpu.weights[:4]
    assert cpu.predict([], [1]) >= kernels > 0


_PRICES_UNDER_A_KERNEL = """
import json, numpy as np, sim
from sim.costs.calibrated import CalibratedCost, shipped_cpu_profile
cost = CalibratedCost.from_file(shipped_cpu_profile())
r = np.random.default_rng(0)
prices = [cost.predict([(int(r.integers(1, 4000)), int(r.integers(0, 2000)))],
                       r.integers(1, 8000, int(r.integers(1, 200))).tolist()) for _ in range(300)]
emit = [sim.SpeculativeConfig(num_speculative_tokens=6, draft_cost_ratio=0.1,
                              acceptance_lengths=list(p / p.sum())).mean_emission()
        for p in r.random((300, 7))]
print(json.dumps({"prices": [p.hex() for p in prices], "emit": [e.hex() for e in emit]}))
"""


def test_calibrated_prices_do_not_depend_on_the_blas_kernel(under_blas_kernels):
    """(issue 32, item 3) A calibrated profile's price (``terms @ weights``) and a speculative
    mean emission (``np.dot`` of acceptance lengths) were BLAS dot products: OpenBLAS's
    SkylakeX kernel sums 7 products in another order than its Haswell one (a quarter of random
    7-vectors differ in the last digit). Summed in a fixed order
    (``sim.numerics``), they are the same bit for bit under both."""
    first, second = under_blas_kernels(_PRICES_UNDER_A_KERNEL, ("Haswell", "SkylakeX"))
    assert first == second
