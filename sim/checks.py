"""Small argument checks shared by the library: each raises ValueError/TypeError naming the field;
and the words of messages (:func:`did_you_mean`, :func:`plural`)."""

from __future__ import annotations

import math
import numbers


def positive_int(name: str, value, *, allow_zero: bool = False) -> int:
    """Return ``value`` as an int; raise if it is not an integer > 0 (or >= 0)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and float(value).is_integer():
            value = int(value)
        else:
            raise TypeError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def positive_float(name: str, value, *, allow_zero: bool = False) -> float:
    """Return ``value`` as a finite float; raise if it is not > 0 (or >= 0)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value}")
    return value


def fraction(name: str, value, *, allow_zero: bool = False) -> float:
    """Return ``value`` as a float in (0, 1] (or [0, 1])."""
    value = positive_float(name, value, allow_zero=allow_zero)
    if value > 1:
        raise ValueError(f"{name} must be at most 1, got {value}")
    return value


def did_you_mean(value, choices) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to a misspelt name, or the one
    whose words' initials it spells (``tp``: ``tensor_parallel``), else ``""``."""
    import difflib
    name, choices = str(value).strip().lower(), [str(c) for c in choices]
    close = [c for c in choices if "_" in c and "".join(w[:1] for w in c.split("_")) == name]
    if len(close) != 1:
        close = difflib.get_close_matches(name, choices, 1, 0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def plural(count, word: str, words: str | None = None) -> str:
    """``count`` and ``word`` agreeing: ``1 request``, ``2 requests``, ``1,024 blocks`` (an
    integer gets thousands separators); ``words``: an irregular plural (``passes``)."""
    shown = f"{count:,}" if isinstance(count, numbers.Integral) else f"{count}"
    return f"{shown} {word if count == 1 else (words or word + 's')}"


def each_gpu(n: int) -> str:
    """``one GPU`` or ``each of N GPUs`` (a per-GPU figure's scope)."""
    return "one GPU" if n == 1 else f"each of {n:,} GPUs"


def declared_with(obj, name: str, method: str) -> bool:
    """Whether attribute ``name`` of ``obj`` (a promise about its ``method``) was set on the
    instance, or declared by the class that defines ``method`` or a subclass of it: a subclass
    overriding ``method`` alone does not inherit its parent's promise about the parent's
    ``method``. False when ``obj`` has no ``name``."""
    if getattr(obj, name, None) is None:
        return False
    if name in getattr(obj, "__dict__", ()):
        return True
    mro = type(obj).__mro__
    defines = next((k for k in mro if method in vars(k)), None)
    declares = next((k for k in mro if name in vars(k)), None)
    return defines is not None and declares is not None and issubclass(declares, defines)
