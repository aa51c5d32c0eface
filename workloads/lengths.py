"""Token-length distributions: ``dist.sample(n, rng) -> int64 array``, clipped to ``[1, max_tokens]``.

``Fixed``, ``Uniform``, ``Normal``, ``LogNormal`` (by mean and CV), ``Zipf`` (power law over
``[low, high]``) and ``Empirical`` (resampled from observed lengths, e.g. a trace's column).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arrivals import _count, _pos, _rng
from .schema import _plain


def _clip(x, max_tokens):
    x = np.rint(np.asarray(x, dtype=np.float64))
    hi = max_tokens if max_tokens else np.inf
    return np.clip(x, 1, hi).astype(np.int64)


def _check_max(max_tokens):
    if max_tokens is not None and (not isinstance(max_tokens, (int, np.integer)) or max_tokens < 1):
        raise ValueError(f"max_tokens must be an integer >= 1 or None, got {_plain(max_tokens)!r}")


@dataclass(frozen=True, slots=True)
class Fixed:
    value: int

    def __post_init__(self):
        if not isinstance(self.value, (int, np.integer)) or self.value < 1:
            raise ValueError(f"value must be an integer >= 1, got {_plain(self.value)!r}")

    def sample(self, n, rng=None):
        return np.full(_count(n), int(self.value), dtype=np.int64)


@dataclass(frozen=True, slots=True)
class Uniform:
    low: int
    high: int  # inclusive

    def __post_init__(self):
        if not (isinstance(self.low, (int, np.integer)) and isinstance(self.high, (int, np.integer))
                and 1 <= self.low <= self.high):
            raise ValueError(f"need integers 1 <= low <= high, got low={_plain(self.low)!r}, "
                             f"high={_plain(self.high)!r}")

    def sample(self, n, rng=None):
        return _rng(rng).integers(self.low, self.high + 1, _count(n)).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Normal:
    mean: float
    std: float
    max_tokens: int | None = None

    def __post_init__(self):
        _pos("mean", self.mean)
        _pos("std", self.std, allow_zero=True)
        _check_max(self.max_tokens)

    def sample(self, n, rng=None):
        return _clip(_rng(rng).normal(self.mean, self.std, _count(n)), self.max_tokens)


@dataclass(frozen=True, slots=True)
class LogNormal:
    """Lognormal with the given ``mean`` and coefficient of variation ``cv`` (std / mean)."""

    mean: float
    cv: float = 1.0
    max_tokens: int | None = None

    def __post_init__(self):
        _pos("mean", self.mean)
        _pos("cv", self.cv)
        _check_max(self.max_tokens)

    def sample(self, n, rng=None):
        sigma2 = np.log1p(self.cv ** 2)
        mu = np.log(self.mean) - sigma2 / 2
        return _clip(_rng(rng).lognormal(mu, np.sqrt(sigma2), _count(n)), self.max_tokens)


@dataclass(frozen=True, slots=True)
class Zipf:
    """``P(k) ~ k**-a`` over the integers ``low..high``."""

    a: float
    low: int = 1
    high: int = 4096

    def __post_init__(self):
        _pos("a", self.a)
        if not (isinstance(self.low, (int, np.integer)) and isinstance(self.high, (int, np.integer))
                and 1 <= self.low <= self.high):
            raise ValueError(f"need integers 1 <= low <= high, got low={_plain(self.low)!r}, "
                             f"high={_plain(self.high)!r}")

    def pmf(self):
        k = np.arange(self.low, self.high + 1, dtype=np.float64)
        w = k ** -self.a
        return k, w / w.sum()

    def sample(self, n, rng=None):
        k, p = self.pmf()
        return _rng(rng).choice(k, size=_count(n), p=p).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Empirical:
    """Resample (with replacement) from observed ``values``."""

    values: tuple
    max_tokens: int | None = None

    def __init__(self, values, max_tokens=None):
        arr = np.asarray(values, dtype=np.float64)
        if arr.ndim != 1 or arr.size == 0 or not np.isfinite(arr).all() or (arr < 1).any():
            raise ValueError("values must be a non-empty 1-d collection of lengths >= 1")
        frac = arr != np.round(arr)
        if frac.any():  # (they were truncated: 2.7 sampled as 2)
            i = int(np.flatnonzero(frac)[0])
            raise ValueError(f"values must be whole token counts: values[{i}] is "
                             f"{_plain(np.asarray(values)[i])!r}")
        _check_max(max_tokens)
        object.__setattr__(self, "values", tuple(arr.astype(np.int64).tolist()))
        object.__setattr__(self, "max_tokens", max_tokens)

    def sample(self, n, rng=None):
        return _clip(_rng(rng).choice(np.array(self.values), size=_count(n)), self.max_tokens)


def as_distribution(spec, name=None):
    """An int is :class:`Fixed`; anything with ``sample`` is itself. ``name`` (the caller's
    argument: ``prompt``, ``output``, ...) is the one an error names."""
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        if name is not None and spec < 1:
            raise ValueError(f"{name} must be an integer >= 1 or a length distribution, got "
                             f"{_plain(spec)!r}")
        return Fixed(int(spec))
    if callable(getattr(spec, "sample", None)):
        return spec
    raise TypeError(f"{name or 'a length'} must be an int or a length distribution (with "
                    f"sample(n, rng)), got {spec!r}")
