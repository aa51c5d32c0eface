"""Run an engine iteration for real: the GEMMs and attention of a (small) transformer with
random weights, over a paged KV cache holding the true keys and values of every request.

Used two ways: by calibration (time each op on this device) and by validation, where
:class:`ExecutedCost` is the cost model: the engine's own schedule runs on the device and each
iteration takes the wall time it really took.

Per iteration: embed the batch's tokens (prefill chunks first, then one token per decode),
then per layer: RMSNorm, fused QKV GEMM, RoPE, write K/V into the paged pool, prefill attention
per chunk (causal over its cached prefix) and paged decode attention for all decodes at once, O
GEMM, residual, RMSNorm, gate+up GEMM, SiLU-mul, down GEMM, residual; then the LM head for the
last token of each sequence and a greedy pick.
"""

from __future__ import annotations

import gc
import time

import numpy as np

from .kernels import (paged_decode_attention, paged_decode_attention_cuda,
                      prefill_chunk_attention, synchronize)
from ..specs.models import get_model


def pin_allocator() -> bool:
    """Make glibc serve large arrays from the heap instead of fresh ``mmap``s.

    By default glibc maps each large temporary anew (page-faulting every page on first touch)
    until its *dynamic* threshold has grown past that size, so the same NumPy op can take 2.5x
    longer depending on the process's allocation history (measured here on a VM: causal
    attention of 256 tokens over 512 cached, 13 ms vs 5.3 ms). Fixed thresholds make timings
    reproducible. Process-wide; called by the executor that measures, never by the simulator.
    """
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 1 << 30)
                    and libc.mallopt(m_trim_threshold, 1 << 30))
    except (OSError, AttributeError):  # not glibc: nothing to pin
        return False


class Executor:
    """A small transformer on ``xp`` (NumPy or CuPy) with its own paged KV pool."""

    def __init__(self, model, *, num_blocks, block_size=16, xp=np, dtype="float32", seed=0,
                 raw_kernel=None):
        self.allocator_pinned = pin_allocator() if xp is np else False
        self.model = m = get_model(model)
        self.xp, self.dtype = xp, dtype
        self.block_size = block_size
        self.raw_kernel = (xp is not np) if raw_kernel is None else raw_kernel
        rng = np.random.default_rng(seed)
        h, inter, v = m.hidden_size, m.intermediate_size, m.vocab_size
        self.nh, self.nkv, self.d = m.num_attention_heads, m.num_key_value_heads, m.head_dim

        def w(*shape):
            return xp.asarray((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(dtype))

        self.emb = w(v, h)
        self.lm = w(h, v)
        self.layers = [dict(wqkv=w(h, m.q_size + 2 * m.kv_size), wo=w(m.q_size, h),
                            wup=w(h, 2 * inter), wdown=w(inter, h),
                            n1=xp.ones(h, dtype=dtype), n2=xp.ones(h, dtype=dtype))
                       for _ in range(m.num_hidden_layers)]
        kv_dtype = "float32" if self.raw_kernel else dtype
        shape = (num_blocks, block_size, self.nkv, self.d)
        self.k_pool = [xp.zeros(shape, dtype=kv_dtype) for _ in self.layers]
        self.v_pool = [xp.zeros(shape, dtype=kv_dtype) for _ in self.layers]
        self.free = list(range(num_blocks - 1, -1, -1))
        self.tables = {}  # sequence key -> list of block ids
        self.last_token = {}
        inv = 1.0 / (10000.0 ** (np.arange(0, self.d, 2) / self.d))
        self.inv_freq = xp.asarray(inv.astype(dtype))
        self.rng = rng

    # -- bookkeeping ----------------------------------------------------------------------
    def _ensure(self, key, tokens):
        table = self.tables.setdefault(key, [])
        need = -(-tokens // self.block_size) - len(table)
        if need > len(self.free):
            raise RuntimeError(f"executor KV pool exhausted ({len(self.free)} free blocks)")
        for _ in range(need):
            table.append(self.free.pop())
        return table

    def release(self, key):
        self.free.extend(self.tables.pop(key, ()))
        self.last_token.pop(key, None)

    def _plan(self, prefills, decodes):
        """prefills: [(key, new, cached)]; decodes: [(key, context incl. the new token)]."""
        xp, bs = self.xp, self.block_size
        tokens, positions, rows = [], [], []
        for key, new, cached in prefills:
            if cached == 0 and key in self.tables:
                self.release(key)  # restarted (recompute after a preemption)
            self._ensure(key, cached + new)
            rows.append((len(positions), new, cached, key))
            positions.extend(range(cached, cached + new))
            tokens.extend(self.rng.integers(0, self.model.vocab_size, new).tolist())
        dec_tables, dec_lens = [], []
        for key, ctx in decodes:
            table = self._ensure(key, ctx)
            positions.append(ctx - 1)
            tokens.append(self.last_token.get(key, 0))
            dec_tables.append(table)
            dec_lens.append(ctx)
        pos = np.asarray(positions, dtype=np.int64)
        slot_block = np.empty(len(pos), dtype=np.int64)
        k = 0
        for key, new, cached in prefills:
            table = np.asarray(self.tables[key])
            slot_block[k:k + new] = table[np.arange(cached, cached + new) // bs]
            k += new
        for table, ctx in zip(dec_tables, dec_lens):
            slot_block[k] = table[(ctx - 1) // bs]
            k += 1
        plan = {"tokens": xp.asarray(np.asarray(tokens, dtype=np.int64)), "pos": xp.asarray(pos),
                "slot_block": xp.asarray(slot_block), "slot_off": xp.asarray(pos % bs),
                "prefills": rows, "n_dec": len(decodes)}
        if decodes:
            width = max(len(t) for t in dec_tables)
            bt = np.zeros((len(decodes), width), dtype=np.int32)
            for i, t in enumerate(dec_tables):
                bt[i, :len(t)] = t
            plan["dec_tables"] = xp.asarray(bt)
            plan["dec_lens"] = xp.asarray(np.asarray(dec_lens, dtype=np.int32))
        starts = [r[0] + r[1] - 1 for r in rows] + list(range(len(pos) - len(decodes), len(pos)))
        plan["sample_rows"] = xp.asarray(np.asarray(starts, dtype=np.int64))
        plan["sample_keys"] = [r[3] for r in rows] + [key for key, _ in decodes]
        return plan

    # -- compute --------------------------------------------------------------------------
    def _rms(self, x, w):
        xp = self.xp
        return x * (1.0 / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6)) * w

    def _rope(self, x, pos):
        xp = self.xp
        ang = pos[:, None].astype(self.dtype) * self.inv_freq[None, :]
        cos, sin = xp.cos(ang)[:, None, :], xp.sin(ang)[:, None, :]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = xp.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x1 * sin + x2 * cos
        return out

    def attention(self, layer, q, k, v, plan):
        """Write this iteration's K/V into the paged pool, then attend (the op calibration times)."""
        kp, vp = self.k_pool[layer], self.v_pool[layer]
        kp[plan["slot_block"], plan["slot_off"]] = k.astype(kp.dtype)
        vp[plan["slot_block"], plan["slot_off"]] = v.astype(vp.dtype)
        out = self.xp.empty_like(q)
        for row, new, cached, key in plan["prefills"]:
            table = self.tables[key]
            n = cached + new
            kk = kp[table].reshape(-1, self.nkv, self.d)[:n]
            vv = vp[table].reshape(-1, self.nkv, self.d)[:n]
            out[row:row + new] = prefill_chunk_attention(q[row:row + new], kk.astype(q.dtype),
                                                         vv.astype(q.dtype), xp=self.xp)
        n_dec = plan["n_dec"]
        if n_dec:
            qd = q[q.shape[0] - n_dec:]
            if self.raw_kernel:
                o = paged_decode_attention_cuda(qd, kp, vp, plan["dec_tables"], plan["dec_lens"])
            else:
                o = paged_decode_attention(qd, kp, vp, plan["dec_tables"], plan["dec_lens"],
                                           xp=self.xp)
            out[q.shape[0] - n_dec:] = o.astype(q.dtype)
        return out

    def layer(self, i, x, plan, attention=True):
        w, m = self.layers[i], self.model
        t = x.shape[0]
        qkv = self._rms(x, w["n1"]) @ w["wqkv"]
        q = qkv[:, :m.q_size].reshape(t, self.nh, self.d)
        k = qkv[:, m.q_size:m.q_size + m.kv_size].reshape(t, self.nkv, self.d)
        v = qkv[:, m.q_size + m.kv_size:].reshape(t, self.nkv, self.d)
        q, k = self._rope(q, plan["pos"]), self._rope(k, plan["pos"])
        attn = self.attention(i, q, k, v, plan) if attention else q
        x = x + attn.reshape(t, -1) @ w["wo"]
        gu = self._rms(x, w["n2"]) @ w["wup"]
        gate, up = gu[:, :m.intermediate_size], gu[:, m.intermediate_size:]
        return x + ((gate / (1.0 + self.xp.exp(-gate))) * up) @ w["wdown"]

    def forward(self, plan, attention=True):
        x = self.emb[plan["tokens"]]
        for i in range(len(self.layers)):
            x = self.layer(i, x, plan, attention)
        picks = (x[plan["sample_rows"]] @ self.lm).argmax(axis=-1)
        picks = picks.get() if self.xp is not np else picks
        for key, tok in zip(plan["sample_keys"], picks.tolist()):
            self.last_token[key] = tok
        return x

    def execute(self, prefills, decodes) -> float:
        """Run one iteration; return its wall time in seconds (device synchronised). The
        garbage collector is paused meanwhile: its pauses belong to the simulator's own Python
        objects, not to the iteration being measured."""
        synchronize(self.xp)
        enabled = gc.isenabled()
        gc.disable()
        try:
            t = time.perf_counter()
            self.forward(self._plan(prefills, decodes))
            synchronize(self.xp)
            return time.perf_counter() - t
        finally:
            if enabled:
                gc.enable()


class ExecutedCost:
    """A cost model that *executes* each batch on the device and returns its wall time.

    ``predictor`` (optional): another cost model priced on the same batches, for the
    per-iteration comparison. ``records``, per iteration: ``(measured, predicted)``. The
    executor keeps a request's KV while it is in consecutive batches and releases it when the
    request is absent from one (finished, preempted, or a prefill that got no chunk: it is
    re-allocated with the same length when it comes back, which costs the same to attend over).
    """

    name = "executed"
    needs_decode_lengths = True  # the engine gives each batch its decodes' ids and contexts

    def __init__(self, executor: Executor, predictor=None):
        self.executor = executor
        self.predictor = predictor
        self.records = []

    def __call__(self, batch) -> float:
        if getattr(batch, "num_spec_tokens", 0):
            raise ValueError("the executor runs one token per decode: speculative decoding "
                             "(num_spec_tokens > 0) is priced by the roofline or a calibrated "
                             "profile, not executed")
        ex = self.executor
        present = set(batch.prefill_ids)
        present.update(batch.decode_ids)
        for key in [k for k in ex.tables if k not in present]:
            ex.release(key)
        prefills = [(rid, new, cached) for (new, cached), rid in
                    zip(batch.prefills, batch.prefill_ids)]
        decodes = [(rid, int(n)) for rid, n in zip(batch.decode_ids, batch.decode_lengths)]
        seconds = ex.execute(prefills, decodes)
        predicted = self.predictor(batch) if self.predictor is not None else float("nan")
        self.records.append((seconds, predicted))
        return seconds
