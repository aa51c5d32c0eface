"""Speculative decoding: one draft-verify round, its acceptance maths and its speedup.

A draft proposes ``k`` tokens; the target verifies them in one forward pass. With a simulated
:class:`DraftModel` each draft token is accepted with probability ``a`` until the first rejection,
and the target always adds one token (the correction, or a bonus when all ``k`` are accepted), so
a round yields ``E = (1 - a**(k+1)) / (1 - a)`` tokens on average. With real models (callables
``context -> probability vector``) the speculative-sampling rule of Leviathan et al. / Chen et
al. 2023 makes the output distributed exactly as the target's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..checks import fraction, positive_float, positive_int


def _rng(seed) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise TypeError(f"seed must be an int, None or numpy.random.Generator, got {seed!r}")
    return np.random.default_rng(seed)


class DraftModel:
    """A simulated draft whose tokens are each accepted with ``acceptance_rate``."""

    def __init__(self, acceptance_rate=0.8, seed=None, vocab_size=32000):
        self.acceptance_rate = fraction("acceptance_rate", acceptance_rate, allow_zero=True)
        self.vocab_size = positive_int("vocab_size", vocab_size)
        self.rng = _rng(seed)

    def propose(self, context, k):
        """``k`` synthetic draft token ids."""
        return [int(t) for t in self.rng.integers(0, self.vocab_size, size=k)]


@dataclass(frozen=True, slots=True)
class SpeculativeResult:
    tokens: list  # accepted draft tokens then the target's token: 1 .. k+1 tokens
    num_accepted: int
    num_speculative: int


def speculative_decode(draft_model, target_model, context, num_speculative=5, seed=None):
    """Run ONE draft-verify round; return the tokens it yields and how many drafts were accepted.

    ``draft_model``: a :class:`DraftModel` (``target_model`` may then be None) or a callable
    ``context -> probability vector``; ``target_model``: such a callable. ``seed``: an int or a
    ``numpy.random.Generator`` (default: the DraftModel's own generator, else fresh entropy).
    """
    k = positive_int("num_speculative", num_speculative)
    context = list(context)
    if isinstance(draft_model, DraftModel):
        rng = draft_model.rng if seed is None else _rng(seed)
        drafted = draft_model.propose(context, k)
        accepted = 0
        while accepted < k and rng.random() < draft_model.acceptance_rate:
            accepted += 1
        tokens = drafted[:accepted]
        if target_model is None:
            tokens.append(int(rng.integers(0, draft_model.vocab_size)))
        else:
            p = _probs("target_model", target_model(context + tokens))
            tokens.append(int(rng.choice(len(p), p=p)))
        return SpeculativeResult(tokens, accepted, k)
    if not callable(draft_model) or not callable(target_model):
        raise TypeError("draft_model must be a DraftModel or a callable, and target_model a "
                        "callable, when the draft is a real model")
    rng = _rng(seed)
    drafted, qs = [], []
    for _ in range(k):
        q = _probs("draft_model", draft_model(context + drafted))
        qs.append(q)
        drafted.append(int(rng.choice(len(q), p=q)))
    tokens = []
    for i, x in enumerate(drafted):
        p = _probs("target_model", target_model(context + drafted[:i]))
        if len(p) != len(qs[i]):
            raise ValueError(f"draft and target vocabularies differ: {len(qs[i])} vs {len(p)}")
        if rng.random() < min(1.0, p[x] / qs[i][x]):
            tokens.append(x)
            continue
        residual = np.maximum(0.0, p - qs[i])
        total = residual.sum()
        residual = residual / total if total > 0 else p
        tokens.append(int(rng.choice(len(p), p=residual)))
        return SpeculativeResult(tokens, i, k)
    p = _probs("target_model", target_model(context + drafted))
    tokens.append(int(rng.choice(len(p), p=p)))
    return SpeculativeResult(tokens, k, k)


def _probs(name, p):
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1 or p.size == 0 or np.any(p < 0) or not np.isfinite(p).all():
        raise ValueError(f"{name} must return a 1-d non-negative probability vector")
    total = p.sum()
    if not abs(total - 1.0) < 1e-6:
        raise ValueError(f"{name} returned probabilities summing to {total}, not 1")
    return p / total


def expected_tokens_per_step(a, k) -> float:
    """Mean tokens per draft-verify round: ``(1 - a**(k+1)) / (1 - a)`` (``k + 1`` at a = 1)."""
    a = fraction("acceptance_rate", a, allow_zero=True)
    k = positive_int("num_speculative", k, allow_zero=True)
    return float(k + 1) if a == 1.0 else (1 - a ** (k + 1)) / (1 - a)


def speculative_speedup(a, k, cost_ratio) -> float:
    """Speedup over plain decoding: ``E / (k * c + 1)``, c = draft cost / target cost per token.

    Below 1 means speculation got slower (acceptance too low or the draft too costly).
    """
    c = positive_float("cost_ratio", cost_ratio, allow_zero=True)
    return expected_tokens_per_step(a, k) / (positive_int("k", k, allow_zero=True) * c + 1)
