"""LoRA adapters in a workload: the optional ``lora_id`` column, and a generator of it.

A request's ``lora_id`` names the adapter it is served with (any hashable id; a missing value -
None or NaN - or no column at all: the base model). :func:`lora_mix` draws one per request from
``adapters`` ids ``lora-0 .. lora-{N-1}`` with Zipf popularity: adapter ``k`` (0-based) is drawn
with probability proportional to ``1 / (k + 1) ** zipf`` (``zipf=0``: uniform), after a share
``base_fraction`` of the requests is left on the base model. Deterministic for a seed; the input
frame is not changed (a copy with the column is returned).
"""

from __future__ import annotations

import math

import numpy as np

from .arrivals import _rng


def zipf_weights(adapters: int, zipf: float) -> np.ndarray:
    """Popularity of ``adapters`` adapters, most popular first, summing to 1."""
    w = 1.0 / np.arange(1, adapters + 1, dtype=float) ** zipf
    return w / w.sum()


def lora_mix(df, adapters: int, *, zipf: float = 1.0, base_fraction: float = 0.0, seed=0,
             prefix: str = "lora-"):
    """``df`` with a ``lora_id`` column: ``adapters`` ids of Zipf(``zipf``) popularity, a share
    ``base_fraction`` of the requests (each with that probability) on the base model (None)."""
    if isinstance(adapters, bool) or not isinstance(adapters, (int, np.integer)) \
            or adapters < 1:
        raise ValueError(f"adapters must be an integer >= 1, got {adapters!r}")
    n = int(adapters)
    if isinstance(zipf, bool) or not isinstance(zipf, (int, float)) or not zipf >= 0 \
            or zipf == math.inf:
        raise ValueError(f"zipf must be a finite number >= 0, got {zipf!r}")
    if isinstance(base_fraction, bool) or not isinstance(base_fraction, (int, float)) \
            or not 0 <= base_fraction <= 1:
        raise ValueError(f"base_fraction must be in [0, 1], got {base_fraction!r}")
    rng = _rng(seed)
    picks = rng.choice(n, size=len(df), p=zipf_weights(n, zipf))
    base = rng.random(len(df)) < base_fraction
    out = df.copy()
    out["lora_id"] = [None if b else f"{prefix}{k}" for k, b in zip(picks.tolist(),
                                                                     base.tolist())]
    return out
