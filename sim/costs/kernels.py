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

from ..checks import positive_int


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


def tiled_softmax_dot_batched(q, Ks, Vs, tile=4, xp=None):
    """:func:`tiled_softmax_dot` vectorised over leading (batch, head) dimensions, NumPy or CuPy:
    q ``(..., d)``, Ks ``(..., N, d)``, Vs ``(..., N, dv)`` -> ``(..., dv)``; the same online
    softmax update, one tile of keys at a time for every row at once."""
    if isinstance(tile, bool) or not isinstance(tile, (int, np.integer)) or tile < 1:
        raise ValueError(f"tile must be an integer >= 1, got {tile!r}")
    xp = xp or _array_module(q)
    if Ks.shape[-2] == 0:
        raise ValueError("Ks must hold at least one key")
    if Ks.shape[:-2] != q.shape[:-1] or Vs.shape[:-1] != Ks.shape[:-1] or \
            Ks.shape[-1] != q.shape[-1]:
        raise ValueError(f"shapes do not match: q {q.shape}, Ks {Ks.shape}, Vs {Vs.shape}")
    lead = q.shape[:-1]
    m = xp.full(lead, -xp.inf)
    s = xp.zeros(lead)
    acc = xp.zeros(lead + (Vs.shape[-1],))
    for start in range(0, Ks.shape[-2], tile):
        sc = (Ks[..., start:start + tile, :] @ q[..., None])[..., 0]  # (..., t)
        new_m = xp.maximum(m, sc.max(axis=-1))
        exp_old = xp.where(m == -xp.inf, 0.0, xp.exp(m - new_m))
        p = xp.exp(sc - new_m[..., None])
        s = s * exp_old + p.sum(axis=-1)
        acc = acc * exp_old[..., None] + (p[..., None, :] @ Vs[..., start:start + tile, :])[..., 0, :]
        m = new_m
    return acc / s[..., None]


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


# -- vectorised kernels of one engine iteration (NumPy, or CuPy via ``xp``) ---------------------

def array_module(device="auto"):
    """``(xp, device_name)``: CuPy when ``device`` is "gpu"/"auto" and a GPU is usable, else NumPy."""
    if device not in ("auto", "gpu", "cpu"):
        raise ValueError(f"device must be 'auto', 'gpu' or 'cpu', got {device!r}")
    if device in ("auto", "gpu"):
        try:
            import cupy
            if cupy.cuda.is_available():
                props = cupy.cuda.runtime.getDeviceProperties(0)
                name = props["name"]
                return cupy, name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # noqa: BLE001 - CuPy missing, or installed without a driver
            pass
        if device == "gpu":
            raise RuntimeError("device='gpu' but no CUDA GPU is usable through CuPy")
    import platform
    return np, f"cpu ({platform.processor() or platform.machine()})"


def synchronize(xp):
    if xp is not np:
        xp.cuda.Device().synchronize()


def paged_decode_attention(q, k_pool, v_pool, block_tables, context_lens, scale=None, xp=np):
    """One query token per sequence over its paged KV cache (vectorised, padded to the longest).

    q ``(b, n_heads, d)``; pools ``(num_blocks, block_size, n_kv, d)``; block_tables
    ``(b, max_blocks)`` int; context_lens ``(b,)`` (keys ``[0, len)`` of each sequence).
    Grouped-query attention: head ``h`` reads KV head ``h // (n_heads // n_kv)``.
    """
    b, nh, d = q.shape
    nkv = k_pool.shape[2]
    g = nh // nkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    k = k_pool[block_tables].reshape(b, -1, nkv, d)  # (b, T, nkv, d)
    v = v_pool[block_tables].reshape(b, -1, nkv, d)
    qg = q.reshape(b, nkv, g, d)
    scores = (qg @ k.transpose(0, 2, 3, 1)) * scale  # (b, nkv, g, T)
    mask = xp.arange(k.shape[1])[None, :] < xp.asarray(context_lens)[:, None]
    scores = xp.where(mask[:, None, None, :], scores, -xp.inf)
    p = softmax(scores, axis=-1, xp=xp)
    return (p @ v.transpose(0, 2, 1, 3)).reshape(b, nh, d)


def prefill_chunk_attention(q, k, v, scale=None, xp=np):
    """Causal attention of a chunk of ``c`` new queries over ``L = cached + c`` keys.

    q ``(c, n_heads, d)``; k, v ``(L, n_kv, d)``; returns ``(c, n_heads, d)``.
    """
    c, nh, d = q.shape
    nkv = k.shape[1]
    g = nh // nkv
    qh = q.reshape(c, nkv, g, d).transpose(1, 2, 0, 3)  # (nkv, g, c, d)
    kh = k.transpose(1, 0, 2)[:, None]  # (nkv, 1, L, d)
    vh = v.transpose(1, 0, 2)[:, None]
    out = scaled_dot_product_attention(qh, kh, vh, causal=True, scale=scale, xp=xp)
    return out.transpose(2, 0, 1, 3).reshape(c, nh, d)


_CUDA_PAGED_DECODE = r"""
extern "C" __global__ void paged_decode_attention(
    const float* q, const float* k_pool, const float* v_pool, const int* block_tables,
    const int* context_lens, float* out, int n_heads, int n_kv, int d, int bs,
    int max_blocks, float scale) {
  // one thread block per (sequence, head); thread i holds dimension i. Online softmax over
  // keys one at a time: the same running max / running sum update as tiled_softmax_dot.
  // -inf from its bit pattern: NVRTC compiles without math.h, so INFINITY is not defined
  const float neg_inf = __int_as_float(0xff800000);
  int b = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
  int kvh = h / (n_heads / n_kv);
  extern __shared__ float red[];
  float qv = tid < d ? q[((long)b * n_heads + h) * d + tid] : 0.f;
  float m = neg_inf, s = 0.f, acc = 0.f;
  int L = context_lens[b];
  for (int t = 0; t < L; ++t) {
    int blk = block_tables[(long)b * max_blocks + t / bs];
    long base = (((long)blk * bs + (t % bs)) * n_kv + kvh) * d;
    red[tid] = tid < d ? qv * k_pool[base + tid] : 0.f;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
      if (tid < stride) red[tid] += red[tid + stride];
      __syncthreads();
    }
    float score = red[0] * scale;
    __syncthreads();
    float new_m = fmaxf(m, score);
    float exp_old = (m == neg_inf) ? 0.f : expf(m - new_m);
    float p = expf(score - new_m);
    s = s * exp_old + p;
    if (tid < d) acc = acc * exp_old + p * v_pool[base + tid];
    m = new_m;
  }
  if (tid < d) out[((long)b * n_heads + h) * d + tid] = acc / s;
}
"""


def paged_decode_attention_cuda(q, k_pool, v_pool, block_tables, context_lens, scale=None):
    """:func:`paged_decode_attention` as a CuPy ``RawKernel`` (float32), reading KV through the
    block table without gathering it."""
    import cupy
    b, nh, d = q.shape
    nbl, bs, nkv, _ = k_pool.shape
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    kernel = _cuda_kernel()
    threads = 1 << max(0, (d - 1).bit_length())
    out = cupy.empty((b, nh, d), dtype=cupy.float32)
    bt = cupy.ascontiguousarray(block_tables, dtype=cupy.int32)
    kernel((b, nh), (threads,),
           (cupy.ascontiguousarray(q, dtype=cupy.float32),
            cupy.ascontiguousarray(k_pool, dtype=cupy.float32),
            cupy.ascontiguousarray(v_pool, dtype=cupy.float32), bt,
            cupy.ascontiguousarray(context_lens, dtype=cupy.int32), out,
            np.int32(nh), np.int32(nkv), np.int32(d), np.int32(bs), np.int32(bt.shape[1]),
            np.float32(scale)),
           shared_mem=threads * 4)
    return out


_KERNEL_CACHE = {}


def _cuda_kernel():
    if "paged" not in _KERNEL_CACHE:  # compiled once per process; no state beyond the cache
        import cupy
        _KERNEL_CACHE["paged"] = cupy.RawKernel(_CUDA_PAGED_DECODE, "paged_decode_attention")
    return _KERNEL_CACHE["paged"]
