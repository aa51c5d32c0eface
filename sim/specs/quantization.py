"""Symmetric integer quantization: per tensor, per channel (``axis``) or per group.

``scale = max|x| / (2**(bits-1) - 1)`` over the tensor, each channel or each group;
``q = round(x / scale)`` clipped to ``[-qmax, qmax]``; ``dequantize(q, scale) = q * scale``, so
the error of each value is at most ``scale / 2``. An all-zero tensor/channel/group gets
``scale = 0`` and ``q = 0`` (no division by zero).
"""

from __future__ import annotations

import numpy as np

from ..checks import positive_int


def quantize(x, bits=8, axis=None, group_size=None):
    """Return ``(q, scale)`` with ``q`` integers and ``scale`` broadcastable or grouped.

    - per tensor (default): ``scale`` is a 0-d array;
    - ``axis=k``: one scale per index along axis ``k`` (shape keeps dims, size 1 elsewhere);
    - ``group_size=g``: groups of ``g`` consecutive values along the last axis, which ``g`` must
      divide; ``scale`` has shape ``x.shape[:-1] + (x.shape[-1] // g,)``.
    """
    bits = positive_int("bits", bits)
    if not 2 <= bits <= 16:
        raise ValueError(f"bits must be in 2..16, got {bits}")
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
        raise TypeError(f"x must be a real numeric array, got dtype {x.dtype}")
    x = x.astype(np.float64) if x.dtype.itemsize < 4 or not np.issubdtype(x.dtype, np.floating) \
        else x
    if not np.all(np.isfinite(x)):
        raise ValueError("x must be finite (found NaN or inf)")
    qmax = 2 ** (bits - 1) - 1
    qdtype = np.int8 if bits <= 8 else np.int16
    if axis is not None and group_size is not None:
        raise ValueError("give axis or group_size, not both")
    if group_size is not None:
        g = positive_int("group_size", group_size)
        if x.ndim == 0 or x.shape[-1] % g:
            raise ValueError(f"group_size {g} must divide the last axis of shape {x.shape}")
        grouped = x.reshape(*x.shape[:-1], x.shape[-1] // g, g)
        scale = np.abs(grouped).max(axis=-1, keepdims=True) / qmax
        q = _round(grouped, scale, qmax).astype(qdtype).reshape(x.shape)
        return q, scale[..., 0]
    if axis is not None:
        if not isinstance(axis, (int, np.integer)) or not -x.ndim <= axis < x.ndim:
            raise ValueError(f"axis must be an integer in [-{x.ndim}, {x.ndim}), got {axis!r}")
        other = tuple(i for i in range(x.ndim) if i != axis % x.ndim)
        scale = np.abs(x).max(axis=other, keepdims=True) / qmax
    else:
        scale = np.asarray(np.abs(x).max() / qmax if x.size else 0.0)
    return _round(x, scale, qmax).astype(qdtype), scale


def _round(x, scale, qmax):
    safe = np.where(scale == 0, 1.0, scale)
    return np.clip(np.rint(x / safe), -qmax, qmax)


def dequantize(q, scale):
    """Inverse of :func:`quantize`: ``q * scale``, expanding a grouped scale over its groups."""
    q = np.asarray(q)
    scale = np.asarray(scale, dtype=np.float64)
    if (scale.ndim == q.ndim and scale.ndim > 0 and scale.shape[-1] not in (1, q.shape[-1])
            and q.shape[-1] % scale.shape[-1] == 0 and scale.shape[:-1] == q.shape[:-1]):
        scale = np.repeat(scale, q.shape[-1] // scale.shape[-1], axis=-1)
    try:
        return q.astype(np.float64) * scale
    except ValueError:
        raise ValueError(f"scale of shape {scale.shape} does not match q of shape {q.shape}") \
            from None
