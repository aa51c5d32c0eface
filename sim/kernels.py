"""Attention kernels and a per-sequence KV cache, written against an array module (NumPy/CuPy).

- :func:`scaled_dot_product_attention` - the reference: ``softmax(q k^T * scale [+ causal mask]) v``.
- :func:`tiled_softmax_dot` - ``softmax(Ks @ q) @ Vs`` one tile of keys at a time with the online
  softmax update (running max ``m``, running sum ``s``, rescaled accumulator), as FlashAttention
  does; equal to the full softmax and finite for scores in the thousands.
- :class:`KVCache` - K/V of one sequence, all layers, written at ``[length, length + t)``.
"""

from __future__ import annotations

import math

import numpy as np

from ._validate import positive_int


def softmax(x, axis=-1, xp=np):
    """Numerically stable softmax along ``axis``."""
    z = x - x.max(axis=axis, keepdims=True)
    e = xp.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def scaled_dot_product_attention(q, k, v, causal=False, scale=None, xp=None):
    """Reference attention over the last two axes: q ``(..., Lq, d)``, k ``(..., Lk, d)``,
    v ``(..., Lk, dv)``; returns ``(..., Lq, dv)``.

    ``scale`` defaults to ``1/sqrt(d)``. ``causal=True`` aligns queries to the *end* of the keys
    (query ``i`` sees keys ``<= i + Lk - Lq``), which is prefill of a chunk over a cached prefix.
    """
    xp = xp or _array_module(q)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the last dim, got {q.shape} and {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have as many keys, got {k.shape} and {v.shape}")
    lq, lk = q.shape[-2], k.shape[-2]
    if causal and lq > lk:
        raise ValueError(f"causal attention needs at least as many keys as queries, got {lq} > {lk}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ xp.swapaxes(k, -1, -2)) * scale
    if causal:
        keep = xp.arange(lk)[None, :] <= xp.arange(lq)[:, None] + (lk - lq)
        scores = xp.where(keep, scores, -xp.inf)
    return softmax(scores, axis=-1, xp=xp) @ v


def tiled_softmax_dot(q, Ks, Vs, tile=4):
    """``softmax(Ks @ q) @ Vs`` (no scaling), one tile of ``tile`` keys at a time.

    q ``(d,)``, Ks ``(N, d)``, Vs ``(N, dv)``. The cheat sheet's online-softmax update, per tile:
    ``new_m = max(m, *scores)``; ``exp_old = 0 if m == -inf else exp(m - new_m)``;
    ``s = s * exp_old + sum(exp(sc - new_m))``; ``acc = acc * exp_old + exp(sc - new_m) @ V``.
    """
    if isinstance(tile, bool) or not isinstance(tile, (int, np.integer)):
        raise TypeError(f"tile must be an integer, got {tile!r}")
    if tile < 1:
        raise ValueError(f"tile must be >= 1, got {tile}")
    q, Ks, Vs = np.asarray(q), np.asarray(Ks), np.asarray(Vs)
    if Ks.ndim != 2 or Vs.ndim != 2 or q.ndim != 1:
        raise ValueError(f"expected q (d,), Ks (N, d), Vs (N, dv); got {q.shape}, {Ks.shape}, "
                         f"{Vs.shape}")
    if Ks.shape[0] != Vs.shape[0] or Ks.shape[1] != q.shape[0]:
        raise ValueError(f"shapes do not match: q {q.shape}, Ks {Ks.shape}, Vs {Vs.shape}")
    if Ks.shape[0] == 0:
        raise ValueError("Ks must hold at least one key")
    dtype = np.result_type(q, Ks, Vs, np.float64 if q.dtype.kind != "f" else q.dtype)
    m = -np.inf
    s = dtype.type(0.0)
    acc = np.zeros(Vs.shape[1], dtype=dtype)
    for start in range(0, Ks.shape[0], tile):
        sc = Ks[start:start + tile] @ q
        new_m = max(m, float(sc.max()))
        exp_old = 0.0 if m == -np.inf else math.exp(m - new_m)
        p = np.exp(sc - new_m)
        s = s * exp_old + p.sum()
        acc = acc * exp_old + p @ Vs[start:start + tile]
        m = new_m
    return acc / s


def _array_module(x):
    mod = type(x).__module__.split(".")[0]
    if mod == "cupy":  # imported only when the caller already holds a CuPy array
        import cupy
        return cupy
    return np


class KVCache:
    """K and V of one sequence for every layer, preallocated to ``max_len`` tokens.

    A step writes each layer with :meth:`update` (positions ``[length, length + t)``), then
    calls :meth:`advance(t)` once; :meth:`read` returns what is committed (up to ``length``).
    Layout per layer: ``(max_len, n_heads_kv, d_head)``.
    """

    def __init__(self, n_layers, max_len, n_heads_kv, d_head, dtype="float32", xp=np):
        self.n_layers = positive_int("n_layers", n_layers)
        self.max_len = positive_int("max_len", max_len)
        self.n_heads_kv = positive_int("n_heads_kv", n_heads_kv)
        self.d_head = positive_int("d_head", d_head)
        self.xp = xp
        shape = (self.n_layers, self.max_len, self.n_heads_kv, self.d_head)
        self.k = xp.zeros(shape, dtype=dtype)
        self.v = xp.zeros(shape, dtype=dtype)
        self.length = 0

    def _check_layer(self, layer):
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer must be in 0..{self.n_layers - 1}, got {layer}")

    def update(self, layer, k, v):
        """Write ``t`` new keys/values ``(t, n_heads_kv, d_head)``; return K, V up to length+t."""
        self._check_layer(layer)
        if k.shape != v.shape or k.shape[1:] != (self.n_heads_kv, self.d_head):
            raise ValueError(f"k and v must be (t, {self.n_heads_kv}, {self.d_head}), got "
                             f"{k.shape} and {v.shape}")
        end = self.length + k.shape[0]
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: writing {k.shape[0]} token(s) at position "
                             f"{self.length} exceeds max_len {self.max_len}")
        self.k[layer, self.length:end] = k
        self.v[layer, self.length:end] = v
        return self.k[layer, :end], self.v[layer, :end]

    def read(self, layer):
        """Committed K, V of ``layer``: ``(length, n_heads_kv, d_head)`` each."""
        self._check_layer(layer)
        return self.k[layer, :self.length], self.v[layer, :self.length]

    def advance(self, t=1):
        """Commit ``t`` tokens written by :meth:`update` in every layer."""
        t = positive_int("t", t)
        if self.length + t > self.max_len:
            raise ValueError(f"KV cache overflow: advancing {t} from {self.length} exceeds "
                             f"max_len {self.max_len}")
        self.length += t

    def __len__(self):
        return self.length
