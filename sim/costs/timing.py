"""Kernel timing: time the real kernels of an engine iteration on this device, fit tables.

:func:`measure_kernels` times, on an :class:`~sim.costs.executor.Executor` (CuPy on an NVIDIA
GPU, NumPy on the CPU), over a grid, exactly the code an executed iteration runs:

- ``linear``: embedding + every layer's norms, QKV/O/MLP GEMMs, RoPE, residuals, vs tokens T;
- ``lm_head``: the LM head and greedy pick for ``s`` sequences;
- ``decode_attention``: K/V write + paged decode attention of ``b`` sequences of context ``L``
  through their block tables (all layers);
- ``prefill_attention``: K/V write + causal attention of a ``c``-token chunk over ``p`` cached
  tokens (all layers).

Each point is the median of repeats after warm-up (device synchronised; :func:`time_ops`, whose
clock is injectable). ``linear`` and ``lm_head`` become log-log interpolation tables over T; the
attention ops bilinear tables over their grids (:func:`fit_tables`); a table holds measured
times, so every value in it is > 0 and no interpolation is below 0. Part of each grid is held
out of the fit, and the held-out error (median and P90 absolute percentage error) goes into the
profile with the device, library versions, dtype, model dims, date and grid. How the op times
add up inside real engine iterations is fitted afterwards by running the engine
(:mod:`sim.tools.calibration`, above the engine in the layer order);
:class:`~sim.costs.calibrated.CalibratedCost` prices a batch from the profile.
:func:`nonneg_lstsq` is the fit with every coefficient >= 0 that the in-engine weights use.
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


def _time_once(fn, sync, samples, timer):
    sync()
    t = timer()
    fn()
    sync()
    samples.append(timer() - t)


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
    interior rows and columns of the grid, predicted by interpolating the remaining sub-grid.
    Every time must be finite and > 0 (a log table of a zero or negative time is meaningless)."""
    t = np.asarray(times, dtype=np.float64)
    bad = ~(np.isfinite(t) & (t > 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{op}: timings must be finite and > 0 s, got {t[i]!r} at point "
                         f"{points[i]!r}")
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


def time_ops(ops, *, budget_s, timer=time.perf_counter, sync=lambda: None, progress=False,
             on_pass=None):
    """Median seconds of each zero-argument callable in ``ops``, timed in passes over all of
    them until about ``budget_s`` seconds of ``timer`` have gone (at least 3 passes, at most
    100); in each pass every op runs :data:`WARMUP` times untimed, then :data:`REPEATS` times
    timed between ``sync()`` calls. Returns ``(medians, passes, seconds)``. ``timer`` is any
    clock in seconds (tests inject one that the ops advance). ``on_pass(passes, elapsed)``, if
    given, is called after each pass with the passes done and the seconds of ``timer`` since
    the start (the CLI prints a line; this module prints nothing)."""
    samples = [[] for _ in ops]
    start = timer()
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=budget_s, unit="s", desc="calibrating",
                   bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s")
    passes = 0
    while True:
        for fn, got in zip(ops, samples):
            for _ in range(WARMUP):  # an engine runs similar iterations back to back: time the
                fn()                 # steady state (after a large op, a small one needs ~5 runs)
            for _ in range(REPEATS):
                _time_once(fn, sync, got, timer)
        passes += 1
        elapsed = timer() - start
        if on_pass is not None:
            on_pass(passes, elapsed)
        if bar is not None:
            bar.n = min(elapsed, budget_s)
            bar.refresh()
        per_pass = elapsed / passes
        if passes >= 3 and (elapsed + per_pass > budget_s or passes >= 100):
            break
    if bar is not None:
        bar.close()
    return [float(np.median(got)) for got in samples], passes, timer() - start


def fit_tables(grid, times, seed=0):
    """``(fits, heldout_error)`` per op of ``grid`` from the median ``times`` of its points
    (``{op: [seconds per point]}``); see :func:`_fit_and_holdout`."""
    fits, heldout = {}, {}
    for op, points in grid.items():
        fits[op], heldout[op] = _fit_and_holdout(op, points, times[op], seed)
    return fits, heldout


def measure_kernels(ex: Executor, device_name: str, *, budget_s=120.0, seed=0, grid=None,
                    progress=False, timer=time.perf_counter, on_pass=None) -> dict:
    """Time every op of ``grid`` on executor ``ex`` within about ``budget_s`` seconds (at least
    3 passes), fit the tables and their held-out errors; return the profile without the
    in-engine weights (:func:`sim.tools.calibration.calibrate` adds them). ``on_pass``: see
    :func:`time_ops`."""
    xp = ex.xp
    on_gpu = xp is not np
    grid = grid or GRID
    bench = _Bench(ex)
    ops = []  # (op, point, fn, KV keys to release)
    for op, points in grid.items():
        for pt in points:
            args = pt if isinstance(pt, tuple) else (pt,)
            made = getattr(bench, op)(*args)
            fn, keys = made if isinstance(made, tuple) else (made, [])
            ops.append((op, pt, fn, keys))
    medians, passes, seconds = time_ops([fn for _, _, fn, _ in ops], budget_s=budget_s,
                                        timer=timer, sync=lambda: synchronize(xp),
                                        progress=progress, on_pass=on_pass)
    points = {op: [] for op in grid}
    times = {op: [] for op in grid}
    for (op, pt, _fn, keys), median in zip(ops, medians):
        points[op].append(pt)
        times[op].append(median)
        for k in keys:
            ex.release(k)
    fits, heldout = fit_tables(points, times, seed)
    model = ex.model
    return {
        "format": PROFILE_FORMAT, "device": device_name, "array_library": xp.__name__,
        "library_versions": _versions(xp), "dtype": ex.dtype, "block_size": ex.block_size,
        "model": {k: getattr(model, k) for k in (
            "name", "num_hidden_layers", "hidden_size", "num_attention_heads",
            "num_key_value_heads", "intermediate_size", "vocab_size", "head_dim")},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "budget_s": budget_s, "passes": passes, "seconds": round(seconds, 1),
        "decode_feature": "mean" if (on_gpu and ex.raw_kernel) else "max",
        "allocator_pinned": ex.allocator_pinned,
        "grid": {op: {"points": [list(p) if isinstance(p, tuple) else p for p in points[op]],
                      "median_s": times[op]} for op in grid},
        "fit": fits, "heldout_error": heldout,
    }


def nonneg_lstsq(x, y, *, max_iter=None):
    """``argmin ||x c - y||`` subject to every ``c >= 0``: Lawson and Hanson's active-set NNLS
    (Solving Least Squares Problems, 1974, ch. 23), on unit-norm columns (the terms differ by
    orders of magnitude). A column of zeros gets 0. Invariant: every coefficient returned is
    >= 0, so ``x @ c >= 0`` wherever ``x >= 0``. Stops after ``max_iter`` (default ``30 n``)
    inner steps with the feasible point it has."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(f"x must be (m, n) and y (m,), got {x.shape} and {y.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("x and y must be finite")
    m, n = x.shape
    norms = np.linalg.norm(x, axis=0)
    usable = norms > 0
    a = np.where(usable, x / np.where(usable, norms, 1.0), 0.0)
    tol = 10 * max(m, n) * np.finfo(np.float64).eps * max(1.0, float(np.linalg.norm(y)))
    c = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    steps, max_iter = 0, max_iter or 30 * n
    w = a.T @ y  # the negative gradient; optimal when w <= tol off the passive set
    while steps < max_iter:
        free = np.where(usable & ~passive, w, -np.inf)
        j = int(np.argmax(free))
        if not free[j] > tol:
            break
        passive[j] = True
        while steps < max_iter:
            steps += 1
            s = np.zeros(n)
            s[passive], *_ = np.linalg.lstsq(a[:, passive], y, rcond=None)
            if (s[passive] > 0).all():
                break
            # move from c toward s until the first passive coefficient reaches 0, drop it
            hit = passive & (s <= 0)
            gap = c[hit] - s[hit]  # >= 0; 0 only where both are 0
            alpha = np.min(np.divide(c[hit], gap, out=np.zeros_like(gap), where=gap > 0))
            c = c + alpha * (s - c)
            passive &= c > tol
            c[~passive] = 0.0
        else:
            break
        c = s
        w = a.T @ (y - a @ c)
    c = np.maximum(c, 0.0)  # the invariant, also after an early stop
    return np.where(usable, c / np.where(usable, norms, 1.0), 0.0)


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


