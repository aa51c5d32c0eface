"""Strict JSON for the tools' files: NumPy scalars and arrays as Python values, every NaN or
infinity as ``null`` (what a tool writes for a metric with no values), never ``NaN`` text that
strict parsers refuse."""

from __future__ import annotations

import json
import math

import numpy as np


def clean(x):
    """``x`` with NumPy scalars as Python ones and every NaN or infinity as None."""
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return [clean(v) for v in x.tolist()]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def json_text(doc, indent=2) -> str:
    return json.dumps(clean(doc), indent=indent, allow_nan=False) + "\n"
