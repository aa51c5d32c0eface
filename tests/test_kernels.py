import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from sim import KVCache, scaled_dot_product_attention, tiled_softmax_dot, tiled_softmax_dot_batched


def _full(q, K, V):
    s = K @ q
    p = np.exp(s - s.max())
    return (p / p.sum()) @ V


@settings(max_examples=60)
@given(st.integers(1, 40), st.integers(1, 9), st.integers(1, 8), st.integers(1, 5),
       st.integers(0, 2**31))
def test_tiled_softmax_dot_equals_full_softmax(n, tile, d, dv, seed):
    rng = np.random.default_rng(seed)
    q, K, V = rng.normal(size=d), rng.normal(size=(n, d)), rng.normal(size=(n, dv))
    np.testing.assert_allclose(tiled_softmax_dot(q, K, V, tile=tile), _full(q, K, V), rtol=1e-6,
                               atol=1e-12)


def test_tiled_softmax_dot_finite_for_huge_scores_and_lengths_off_the_tile():
    rng = np.random.default_rng(0)
    for n in (1, 3, 4, 5, 17):
        K = rng.normal(size=(n, 4)) * 1000  # scores in the thousands
        q = rng.normal(size=4) * 3
        V = rng.normal(size=(n, 2))
        out = tiled_softmax_dot(q, K, V, tile=4)
        assert np.all(np.isfinite(out))
        np.testing.assert_allclose(out, _full(q, K, V), rtol=1e-6, atol=1e-12)
    # a naive (unstable) softmax would overflow here
    with np.errstate(over="ignore", invalid="ignore"):
        s = K @ q
        assert not np.all(np.isfinite(np.exp(s) / np.exp(s).sum())) or np.abs(s).max() < 700


def test_tiled_softmax_dot_bad_tile_and_shapes():
    q, K, V = np.ones(2), np.ones((3, 2)), np.ones((3, 1))
    with pytest.raises(ValueError, match="tile"):
        tiled_softmax_dot(q, K, V, tile=0)
    with pytest.raises(TypeError, match="tile"):
        tiled_softmax_dot(q, K, V, tile=1.5)
    with pytest.raises(ValueError, match="shapes"):
        tiled_softmax_dot(q, K, np.ones((2, 1)))
    with pytest.raises(ValueError, match="at least one key"):
        tiled_softmax_dot(q, np.ones((0, 2)), np.ones((0, 1)))


def _loop_attention(q, k, v, causal, scale):
    lq, lk = q.shape[0], k.shape[0]
    out = np.zeros((lq, v.shape[1]))
    for i in range(lq):
        limit = i + lk - lq + 1 if causal else lk
        s = k[:limit] @ q[i] * scale
        p = np.exp(s - s.max())
        out[i] = p / p.sum() @ v[:limit]
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lq,lk", [(1, 1), (3, 7), (5, 5)])
def test_sdpa_matches_per_query_loop(causal, lq, lk, rng):
    q, k, v = rng.normal(size=(lq, 8)), rng.normal(size=(lk, 8)), rng.normal(size=(lk, 3))
    np.testing.assert_allclose(scaled_dot_product_attention(q, k, v, causal=causal),
                               _loop_attention(q, k, v, causal, 1 / np.sqrt(8)), rtol=1e-10)
    np.testing.assert_allclose(scaled_dot_product_attention(q, k, v, causal=causal, scale=0.3),
                               _loop_attention(q, k, v, causal, 0.3), rtol=1e-10)


def test_sdpa_bad_shapes():
    with pytest.raises(ValueError):
        scaled_dot_product_attention(np.ones((2, 3)), np.ones((2, 4)), np.ones((2, 4)))
    with pytest.raises(ValueError, match="causal"):
        scaled_dot_product_attention(np.ones((3, 4)), np.ones((2, 4)), np.ones((2, 4)), causal=True)


def _toy_model(rng, layers, heads, d):
    return [dict(wq=rng.normal(size=(heads * d, heads * d)) / 4,
                 wk=rng.normal(size=(heads * d, heads * d)) / 4,
                 wv=rng.normal(size=(heads * d, heads * d)) / 4) for _ in range(layers)]


def _layer_full(x, w, heads, d):
    t = x.shape[0]
    q = (x @ w["wq"]).reshape(t, heads, d).transpose(1, 0, 2)
    k = (x @ w["wk"]).reshape(t, heads, d).transpose(1, 0, 2)
    v = (x @ w["wv"]).reshape(t, heads, d).transpose(1, 0, 2)
    return x + scaled_dot_product_attention(q, k, v, causal=True).transpose(1, 0, 2).reshape(t, -1)


def test_decode_loop_through_kv_cache_equals_full_recomputation(rng):
    layers, heads, d, prompt, steps = 3, 2, 4, 5, 6
    model = _toy_model(rng, layers, heads, d)
    tokens = rng.normal(size=(prompt + steps, heads * d))
    cache = KVCache(layers, prompt + steps, heads, d, dtype="float64")

    def step(x):  # x: (t, hidden) new tokens
        t = x.shape[0]
        for li, w in enumerate(model):
            q = (x @ w["wq"]).reshape(t, heads, d)
            k_all, v_all = cache.update(li, (x @ w["wk"]).reshape(t, heads, d),
                                        (x @ w["wv"]).reshape(t, heads, d))
            att = scaled_dot_product_attention(q.transpose(1, 0, 2), k_all.transpose(1, 0, 2),
                                               v_all.transpose(1, 0, 2), causal=True)
            x = x + att.transpose(1, 0, 2).reshape(t, -1)
        cache.advance(t)
        return x

    outs = [step(tokens[:prompt])]
    for i in range(prompt, prompt + steps):
        outs.append(step(tokens[i:i + 1]))
    cached = np.concatenate(outs)
    full = tokens
    for w in model:
        full = _layer_full(full, w, heads, d)
    np.testing.assert_allclose(cached, full, rtol=1e-10, atol=1e-12)
    assert len(cache) == prompt + steps
    k, v = cache.read(0)
    assert k.shape == (prompt + steps, heads, d)


def test_kv_cache_overflow_and_read_semantics():
    c = KVCache(2, 4, 1, 2)
    k = np.ones((3, 1, 2))
    kk, vv = c.update(0, k, k)
    assert kk.shape[0] == 3 and c.read(0)[0].shape[0] == 0  # not committed yet
    c.advance(3)
    assert c.read(1)[0].shape[0] == 3
    with pytest.raises(ValueError, match="max_len"):
        c.update(0, k, k)
    with pytest.raises(ValueError, match="max_len"):
        c.advance(2)
    with pytest.raises(IndexError, match="layer"):
        c.read(5)
    with pytest.raises(ValueError):
        c.update(0, np.ones((1, 2, 2)), np.ones((1, 2, 2)))
    with pytest.raises(ValueError, match="max_len"):
        KVCache(1, 0, 1, 1)


@settings(max_examples=30)
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 23), st.integers(1, 7),
       st.integers(0, 2**31))
def test_batched_tiled_softmax_dot_equals_per_row(batch, heads, n, tile, seed):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(batch, heads, 8)) * 50  # large scores too
    K, V = rng.normal(size=(batch, heads, n, 8)), rng.normal(size=(batch, heads, n, 3))
    out = tiled_softmax_dot_batched(q, K, V, tile=tile)
    for b in range(batch):
        for h in range(heads):
            np.testing.assert_allclose(out[b, h], _full(q[b, h], K[b, h], V[b, h]), rtol=1e-6,
                                       atol=1e-12)
    assert np.isfinite(out).all()


def test_batched_tiled_bad_input():
    with pytest.raises(ValueError, match="tile"):
        tiled_softmax_dot_batched(np.ones((2, 3)), np.ones((2, 4, 3)), np.ones((2, 4, 1)), tile=0)
    with pytest.raises(ValueError, match="shapes"):
        tiled_softmax_dot_batched(np.ones((2, 3)), np.ones((3, 4, 3)), np.ones((3, 4, 1)))
