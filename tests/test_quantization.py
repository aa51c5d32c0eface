import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra.numpy import arrays

from sim import dequantize, quantize

finite = st.floats(-1e4, 1e4, allow_nan=False, width=64)


@given(arrays(np.float64, st.tuples(st.integers(1, 6), st.integers(1, 8)), elements=finite),
       st.sampled_from([2, 4, 8, 16]))
def test_per_tensor_error_at_most_half_scale(x, bits):
    q, scale = quantize(x, bits=bits)
    assert scale == pytest.approx(np.abs(x).max() / (2 ** (bits - 1) - 1))
    assert np.all(np.abs(dequantize(q, scale) - x) <= scale / 2 + 1e-9 * max(1, np.abs(x).max()))
    assert np.abs(q).max() <= 2 ** (bits - 1) - 1


@given(arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(1, 7)), elements=finite),
       st.sampled_from([0, 1, -1]))
def test_per_channel(x, axis):
    q, scale = quantize(x, bits=8, axis=axis)
    other = tuple(i for i in range(2) if i != axis % 2)
    np.testing.assert_allclose(scale, np.abs(x).max(axis=other, keepdims=True) / 127)
    assert np.all(np.abs(dequantize(q, scale) - x) <= scale / 2 + 1e-9 * (1 + np.abs(x)))


def test_per_group():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 12))
    x[1, 4:8] = 0.0  # an all-zero group
    q, scale = quantize(x, bits=4, group_size=4)
    assert scale.shape == (3, 3)
    np.testing.assert_allclose(scale, np.abs(x.reshape(3, 3, 4)).max(-1) / 7)
    assert scale[1, 1] == 0
    err = np.abs(dequantize(q, scale) - x)
    assert np.all(err <= np.repeat(scale, 4, axis=-1) / 2 + 1e-12)


def test_all_zero_input_does_not_divide_by_zero():
    with np.errstate(all="raise"):
        q, scale = quantize(np.zeros((4, 4)))
        assert scale == 0 and not q.any()
        assert not dequantize(q, scale).any()
        q, scale = quantize(np.zeros((2, 3)), axis=0)
        assert not scale.any()


def test_per_channel_beats_per_tensor_on_outlier_channel():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 8))
    x[:, 0] *= 1000  # one outlier channel
    qt, st_ = quantize(x)
    qc, sc = quantize(x, axis=1)
    assert np.abs(dequantize(qc, sc) - x)[:, 1:].mean() < np.abs(dequantize(qt, st_) - x)[:, 1:].mean() / 100


def test_bad_inputs():
    with pytest.raises(ValueError, match="bits"):
        quantize(np.ones(3), bits=1)
    with pytest.raises(ValueError, match="group_size"):
        quantize(np.ones((2, 5)), group_size=2)
    with pytest.raises(ValueError, match="axis"):
        quantize(np.ones((2, 5)), axis=3)
    with pytest.raises(ValueError, match="finite"):
        quantize(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="does not match"):
        dequantize(np.ones((2, 6), dtype=np.int8), np.ones((3, 4)))
