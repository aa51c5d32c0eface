"""The calibrated cost model: prices a batch from a profile written by ``sim calibrate``.

A profile holds timing tables measured on one device (see :mod:`sim.costs.timing` and :mod:`sim.tools.calibration`):
``linear`` and ``lm_head`` against token / sequence counts (piecewise power laws), decode
attention against (batch, context) and prefill attention against (chunk, cached prefix)
(bilinear tables), plus the weights with which these add up inside real engine iterations.
``CalibratedCost(profile)(batch) = weights . terms(batch)``. NumPy only; no device needed.
The terms are >= 0 and ``sim calibrate`` fits weights >= 0, so a price is >= 0; a profile
whose weights are not (written before that fit) or that failed the calibration quality gate
is flagged by :meth:`CalibratedCost.warning` (``quality``: the gate's verdict, ``None`` for a
profile written before the gate).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..numerics import dot

PROFILE_FORMAT = "llm-serving-sim calibration profile v1"

TERMS = ("linear", "lm_head", "decode_attention", "prefill_attention", "base_s", "per_seq_s",
         "per_block_s")
DEFAULT_WEIGHTS = {"linear": 1.0, "lm_head": 1.0, "decode_attention": 1.0,
                   "prefill_attention": 1.0, "base_s": 0.0, "per_seq_s": 0.0, "per_block_s": 0.0}

def _loglog_interp(x, xs, ys):
    """Piecewise power law through (xs, ys): linear in log-log, extrapolating the end segments."""
    lx, lxs, lys = np.log(np.asarray(x, dtype=np.float64)), np.log(xs), np.log(ys)
    i = np.clip(np.searchsorted(lxs, lx) - 1, 0, len(lxs) - 2)
    w = (lx - lxs[i]) / (lxs[i + 1] - lxs[i])
    return np.exp(lys[i] + w * (lys[i + 1] - lys[i]))


def _axis(values, transform):
    v = np.asarray(values, dtype=np.float64)
    return v if transform == "linear" else np.log(v)


def _bilinear(x, y, table):
    """Interpolate a 2-D timing table: log(time) linear in log(x); along y, log(time) linear in
    log(y) (``y_transform="log"``: power laws, e.g. decode batch x context) or time linear in y
    (``"linear"``: attention over a cached prefix is affine in its length), extrapolating the
    edge cells."""
    ax = np.log(np.asarray(table["x"], dtype=np.float64))
    lz = np.log(np.asarray(table["z"]))
    px = np.log(np.asarray(x, dtype=np.float64))
    i = np.clip(np.searchsorted(ax, px) - 1, 0, len(ax) - 2)
    wx = (px - ax[i]) / (ax[i + 1] - ax[i])
    linear_y = table["y_transform"] == "linear"
    ay = _axis(table["y"], table["y_transform"])
    py = _axis(y, table["y_transform"])
    j = np.clip(np.searchsorted(ay, py) - 1, 0, len(ay) - 2)
    wy = (py - ay[j]) / (ay[j + 1] - ay[j])
    lo = (1 - wx) * lz[i, j] + wx * lz[i + 1, j]  # log time on the two y grid lines
    hi = (1 - wx) * lz[i, j + 1] + wx * lz[i + 1, j + 1]
    if linear_y:
        return np.maximum((1 - wy) * np.exp(lo) + wy * np.exp(hi), 0.0)
    return np.exp((1 - wy) * lo + wy * hi)


class CalibratedCost:
    """``cost(batch) -> seconds`` from a calibration profile (see module docstring):
    ``weights . terms(batch)`` with the terms of :data:`TERMS`."""

    name = "calibrated"
    needs_decode_lengths = True  # prices decode attention from each sequence's context

    def __init__(self, profile: dict):
        if not isinstance(profile, dict):
            raise ValueError(f"a calibration profile is a JSON object, got "
                             f"{type(profile).__name__}")
        if profile.get("format") != PROFILE_FORMAT:
            raise ValueError(f"not a calibration profile (format {profile.get('format')!r})")
        self.profile = profile
        fit = profile["fit"]
        w = profile.get("weights", {})
        self.weights = np.array([float(w.get(k, DEFAULT_WEIGHTS[k])) for k in TERMS])
        self.quality = profile.get("quality")  # the gate's verdict (None: before the gate)
        self._block_size = int(profile.get("block_size", 16))
        self._lin = (np.asarray(fit["linear"]["x"]), np.asarray(fit["linear"]["y"]))
        self._lm = (np.asarray(fit["lm_head"]["x"]), np.asarray(fit["lm_head"]["y"]))
        self._dec = fit["decode_attention"]
        self._pre = fit["prefill_attention"]
        # the padded NumPy kernel costs as if every sequence had the longest context; the GPU
        # kernel reads each sequence's own context (its cost follows the mean)
        self._decode_max = profile.get("decode_feature", "max") == "max"
        self._cache = {}

    @classmethod
    def from_file(cls, path) -> "CalibratedCost":
        path = Path(path)
        if not path.exists():
            raise ValueError(f"profile {str(path)!r} does not exist")
        try:
            return cls(json.loads(path.read_text()))
        except json.JSONDecodeError as e:
            raise ValueError(f"profile {str(path)!r} is not JSON: {e}") from None

    def _table(self, key, value, table):
        k = (key, value)
        t = self._cache.get(k)
        if t is None:
            t = self._cache[k] = float(_loglog_interp(float(value), *table))
        return t

    def terms(self, prefills=(), decode_lengths=()) -> np.ndarray:
        """The :data:`TERMS` of an iteration: ``prefills`` ``[(new, cached)]`` and decodes of
        the given context lengths."""
        b = len(decode_lengths)
        tokens = sum(new for new, _cached in prefills) + b
        bs = self._block_size
        blocks = sum(-(-int(n) // bs) for n in decode_lengths) + sum(
            -(-(new + cached) // bs) for new, cached in prefills)
        dec = 0.0
        if b:
            length = max(decode_lengths) if self._decode_max else sum(decode_lengths) / b
            dec = float(_bilinear(float(b), float(length), self._dec))
        pre = sum(float(_bilinear(float(new), float(cached), self._pre))
                  for new, cached in prefills)
        return np.array([self._table("lin", tokens, self._lin),
                         self._table("lm", b + len(prefills), self._lm), dec, pre, 1.0,
                         b + len(prefills), blocks])

    def predict(self, prefills=(), decode_lengths=()) -> float:
        """Seconds for ``prefills`` ``[(new, cached)]`` and decodes of the given contexts."""
        return dot(self.terms(prefills, decode_lengths), self.weights)  # (fixed order)

    def batch_terms(self, batch) -> np.ndarray:
        lengths = batch.decode_context_lengths().tolist()
        q = 1 + getattr(batch, "num_spec_tokens", 0)
        if q > 1:  # speculative verification: each decode is a q-token chunk over its context
            return self.terms(tuple(batch.prefills) + tuple((q, n - q) for n in lengths), ())
        return self.terms(batch.prefills, lengths)

    def __call__(self, batch) -> float:
        return dot(self.batch_terms(batch), self.weights)

    def warning(self) -> str | None:
        """Why this profile's prices may not be trusted, or ``None``: negative weights (a price
        can then be below zero), a failed quality gate (accepted or not), or no gate at all."""
        notes = [f"weight {k} = {w:.3g} < 0 (a price can be negative; recalibrate)"
                 for k, w in zip(TERMS, self.weights) if w < 0]
        q = self.quality
        if q is None:
            notes.append("written before the calibration quality gate (no verdict)")
        elif not q.get("passed", False):
            how = "accepted with --accept" if q.get("accepted") else "not accepted"
            notes.append(f"failed the calibration quality gate ({how}): "
                         + "; ".join(q.get("failures", [])))
        if not notes:
            return None
        return f"profile from {self.profile.get('device', '?')}: " + "; ".join(notes)

    def __repr__(self):
        return f"CalibratedCost({self.profile['device']!r}, model={self.profile['model']['name']!r})"


def shipped_cpu_profile():
    """The CPU profile measured on the project's 2-core build machine (bundled data file)."""
    from importlib import resources
    return resources.files("sim").joinpath("data/profiles/cpu_calibration.json")
