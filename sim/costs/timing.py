"""Kernel timing: time the real kernels of an engine iteration on this device, fit tables.

:func:`measure_kernels` times, on an :class:`~sim.costs.executor.Executor` (CuPy on an NVIDIA
GPU, NumPy on the CPU), over a grid, exactly the code an executed iteration runs:

- ``linear``: embedding + every layer's norms, QKV/O/MLP GEMMs, RoPE, residuals, vs tokens T;
- ``lm_head``: the LM head and greedy pick for ``s`` sequences;
- ``decode_attention``: K/V write + paged decode attention of ``b`` sequences of context ``L``
  through their block tables (all layers);
- ``prefill_attention``: K/V write + causal attention of a ``c``-token chunk over ``p`` cached
  tokens (all layers).

Each point is the median of repeats after warm-up (device synchronised). ``linear`` and
``lm_head`` become log-log interpolation tables over T; the attention ops bilinear tables over
their grids. Part of each grid is held out of the fit, and the held-out error (median and P90
absolute percentage error) goes into the profile with the device, library versions, dtype,
model dims, date and grid. How the op times add up inside real engine iterations is fitted
afterwards by running the engine (:mod:`sim.tools.calibration`, above the engine in the layer
order); :class:`~sim.costs.calibrated.CalibratedCost` prices a batch from the profile.
"""

from __future__ import annotations

import datetime
import json
import platform
import time
from pathlib import Path

import numpy as np

from ..specs.models import ModelConfig
from .calibrated import PROFILE_FORMAT, _bilinear, _loglog_interp
from .executor import Executor
from .kernels import synchronize

CPU_MODEL = ModelConfig("cpu-tiny", num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=688, vocab_size=2048)
GRID = {
    "linear": [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 320, 384, 448, 512, 640, 768,
               1024],
    "lm_head": [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64],
    "decode_attention": [(b, L) for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
                         for L in (16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)],
    "prefill_attention": [(c, p) for c in (8, 16, 32, 64, 96, 128, 192, 256, 384, 512)
                          for p in (0, 64, 128, 256, 384, 512, 768, 1024, 1536)],
}
QUICK_GRID = {  # a coarse grid for smoke runs (seconds, not minutes)
    "linear": [1, 4, 16, 64, 256], "lm_head": [1, 4, 16],
    "decode_attention": [(b, L) for b in (1, 4, 16) for L in (16, 128, 512)],
    "prefill_attention": [(c, p) for c in (8, 64, 256) for p in (0, 256, 1024)],
}
REPEATS = 3  # timed runs per point per pass, after WARMUP untimed runs
WARMUP = 5


def _time_once(fn, xp, samples):
    synchronize(xp)
    t = time.perf_counter()
    fn()
    synchronize(xp)
    samples.append(time.perf_counter() - t)


class _Bench:
    """The timed operations, each a closure over prepared inputs."""

    def __init__(self, ex: Executor):
        self.ex, self.xp = ex, ex.xp
        self.rng = np.random.default_rng(1)

    def _x(self, *shape):
        return self.xp.asarray(self.rng.standard_normal(shape).astype(self.ex.dtype))

    def linear(self, t):
        ex, xp = self.ex, self.xp
        plan = {"tokens": xp.asarray(self.rng.integers(0, ex.model.vocab_size, t)),
                "pos": xp.asarray(np.arange(t))}

        def run():
            x = ex.emb[plan["tokens"]]
            for i in range(len(ex.layers)):
                x = ex.layer(i, x, plan, attention=False)
        return run

    def lm_head(self, s):
        ex = self.ex
        x = self._x(s, ex.model.hidden_size)

        def run():
            picks = (x @ ex.lm).argmax(axis=-1)
            if ex.xp is not np:
                picks.get()
        return run

    def decode_attention(self, b, length):
        ex = self.ex
        keys = [("cal-d", i) for i in range(b)]
        for k in keys:
            ex.release(k)
        plan = ex._plan([], [(k, length) for k in keys])
        q, k_, v = self._x(b, ex.nh, ex.d), self._x(b, ex.nkv, ex.d), self._x(b, ex.nkv, ex.d)

        def run():
            for i in range(len(ex.layers)):
                ex.attention(i, q, k_, v, plan)
        return run, keys

    def prefill_attention(self, c, p):
        ex = self.ex
        key = ("cal-p", 0)
        ex.release(key)
        plan = ex._plan([(key, c, p)], [])
        q, k_, v = self._x(c, ex.nh, ex.d), self._x(c, ex.nkv, ex.d), self._x(c, ex.nkv, ex.d)

        def run():
            for i in range(len(ex.layers)):
                ex.attention(i, q, k_, v, plan)
        return run, [key]


Y_TRANSFORM = {"decode_attention": "log", "prefill_attention": "linear"}  # p may be 0


def _fit_and_holdout(op, points, times, seed):
    """(fitted model, held-out error): 1-D ops hold out interior points; 2-D ops hold out whole
    interior rows and columns of the grid, predicted by interpolating the remaining sub-grid."""
    t = np.asarray(times)
    rng = np.random.default_rng(seed)
    if not isinstance(points[0], (tuple, list)):
        xs = np.asarray(points, dtype=np.float64)
        mask = np.zeros(len(xs), dtype=bool)
        inner = np.arange(1, len(xs) - 1)
        mask[rng.choice(inner, size=max(1, len(inner) // 4), replace=False)] = True
        model = {"kind": "table1d", "x": xs[~mask].tolist(), "y": t[~mask].tolist()}
        err = ape(_loglog_interp(xs[mask], xs[~mask], t[~mask]), t[mask])
        return model, err
    pts = np.asarray(points, dtype=np.float64)
    xs, ys = np.unique(pts[:, 0]), np.unique(pts[:, 1])
    z = np.full((len(xs), len(ys)), np.nan)
    for (x, y), v in zip(pts, t):
        z[np.searchsorted(xs, x), np.searchsorted(ys, y)] = v
    hx = rng.choice(np.arange(1, len(xs) - 1), size=max(1, (len(xs) - 2) // 3), replace=False)
    hy = rng.choice(np.arange(1, len(ys) - 1), size=max(1, (len(ys) - 2) // 3), replace=False)
    kx = np.setdiff1d(np.arange(len(xs)), hx)
    ky = np.setdiff1d(np.arange(len(ys)), hy)
    model = {"kind": "table2d", "x": xs[kx].tolist(), "y": ys[ky].tolist(),
             "z": z[np.ix_(kx, ky)].tolist(), "y_transform": Y_TRANSFORM[op]}
    test = np.isin(np.searchsorted(xs, pts[:, 0]), hx) | np.isin(np.searchsorted(ys, pts[:, 1]), hy)
    err = ape(_bilinear(pts[test, 0], pts[test, 1], model), t[test])
    return model, err


def ape(pred, meas):
    e = np.abs(np.asarray(pred) / np.asarray(meas) - 1) * 100
    return {"median_ape_pct": float(np.median(e)), "p90_ape_pct": float(np.percentile(e, 90)),
            "points": int(len(e))}


def pool_blocks(grid, block_size) -> int:
    """KV blocks an executor needs to time ``grid`` (the largest decode and prefill points)."""
    need = max(b * -(-L // block_size) for b, L in grid["decode_attention"])
    return need + max(-(-(c + p) // block_size) for c, p in grid["prefill_attention"]) + 64


def measure_kernels(ex: Executor, device_name: str, *, budget_s=120.0, seed=0, grid=None,
                    progress=False) -> dict:
    """Time every op of ``grid`` on executor ``ex`` within about ``budget_s`` seconds (at least
    3 passes), fit the tables and their held-out errors; return the profile without the
    in-engine weights (:func:`sim.tools.calibration.calibrate` adds them)."""
    xp = ex.xp
    on_gpu = xp is not np
    grid = grid or GRID
    bench = _Bench(ex)
    ops = []
    for op, points in grid.items():
        for pt in points:
            args = pt if isinstance(pt, tuple) else (pt,)
            made = getattr(bench, op)(*args)
            fn, keys = made if isinstance(made, tuple) else (made, [])
            ops.append([op, pt, fn, keys, []])
    start = time.perf_counter()
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=budget_s, unit="s", desc="calibrating",
                   bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s")
    passes = 0
    while True:  # passes over the whole grid until the budget is spent (>= 3 passes)
        for item in ops:
            fn, samples = item[2], item[4]
            for _ in range(WARMUP):  # an engine runs similar iterations back to back: time the
                fn()                 # steady state (after a large op, a small one needs ~5 runs)
            for _ in range(REPEATS):
                _time_once(fn, xp, samples)
        passes += 1
        elapsed = time.perf_counter() - start
        if bar is not None:
            bar.n = min(elapsed, budget_s)
            bar.refresh()
        per_pass = elapsed / passes
        if passes >= 3 and (elapsed + per_pass > budget_s or passes >= 100):
            break
    if bar is not None:
        bar.close()
    points = {op: [] for op in grid}
    times = {op: [] for op in grid}
    for op, pt, _fn, keys, samples in ops:
        points[op].append(pt)
        times[op].append(float(np.median(samples)))
        for k in keys:
            ex.release(k)
    fits, heldout = {}, {}
    for op in grid:
        fits[op], heldout[op] = _fit_and_holdout(op, points[op], times[op], seed)
    model = ex.model
    return {
        "format": PROFILE_FORMAT, "device": device_name, "array_library": xp.__name__,
        "library_versions": _versions(xp), "dtype": ex.dtype, "block_size": ex.block_size,
        "model": {k: getattr(model, k) for k in (
            "name", "num_hidden_layers", "hidden_size", "num_attention_heads",
            "num_key_value_heads", "intermediate_size", "vocab_size", "head_dim")},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "budget_s": budget_s, "passes": passes, "seconds": round(time.perf_counter() - start, 1),
        "decode_feature": "mean" if (on_gpu and ex.raw_kernel) else "max",
        "allocator_pinned": ex.allocator_pinned,
        "grid": {op: {"points": [list(p) if isinstance(p, tuple) else p for p in points[op]],
                      "median_s": times[op]} for op in grid},
        "fit": fits, "heldout_error": heldout,
    }


def nonneg_lstsq(x, y, free=()):
    """Least squares with coefficients >= 0 except those in ``free`` (drop negative ones and
    refit; a handful of unknowns)."""
    keep = np.ones(x.shape[1], dtype=bool)
    bounded = np.ones(x.shape[1], dtype=bool)
    bounded[list(free)] = False
    while True:
        coef = np.zeros(x.shape[1])
        coef[keep], *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
        bad = bounded & (coef < 0)
        if not bad.any():
            return coef
        keep &= ~bad


def _versions(xp):
    out = {"python": platform.python_version(), "numpy": np.__version__}
    if xp is not np:
        out["cupy"] = xp.__version__
        out["cuda_runtime"] = int(xp.cuda.runtime.runtimeGetVersion())
    return out


def save_profile(profile: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(profile, indent=1) + "\n")
    return path


