"""Speculative decoding's settings: :class:`SpeculativeConfig` (``SimConfig.speculative``).

It says how many tokens a draft proposes per iteration (``k = num_speculative_tokens``), how
they are accepted and what drafting costs:

- acceptance: each draft token is accepted with probability ``acceptance_rate`` (``alpha``)
  until the first rejection (the cheat sheet's :class:`~sim.cheatsheet.speculative.DraftModel`),
  or the number accepted per verification follows ``acceptance_lengths = [p0, ..., pk]``
  (``p_j``: exactly ``j`` accepted). A workload column ``acceptance_rate`` overrides ``alpha``
  per request (code and chat differ); the draws: :mod:`sim.engine.speculation.acceptance`;
- draft cost - exactly one of: ``draft_model`` (a preset name or ``ModelConfig``: its roofline on
  the run's GPU, ``k`` sequential single-token steps over the batch's decodes plus a prefill of
  the batch's prefill chunks), ``draft_cost_ratio`` ``c`` (each of the ``k`` draft steps costs
  ``c`` x the target's decode step for the same decodes), or ``method="ngram"`` (prompt lookup:
  no draft model, cost 0). There is no silent free draft (the price:
  :mod:`sim.engine.speculation.draft_cost`).

Verification: a speculating decode runs ``k + 1`` query tokens (the batch's
``num_spec_tokens = k``; cost models price the GEMM rows and attention queries) and emits
``1 + accepted`` tokens, never more than it has left.

Invariants (tests/test_speculation.py): every field is checked at construction (a
``ValueError`` or ``TypeError`` naming it); ``mean_emission`` is the closed form
``E = (1 - alpha**(k+1)) / (1 - alpha)`` (or the mean of ``acceptance_lengths``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...checks import fraction, positive_float, positive_int
from ...numerics import dot

METHODS = ("draft", "ngram")
MAX_SPECULATIVE_TOKENS = 64  # a draft longer than this is a typo, not a setting


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """Speculative decoding settings (see the module docstring)."""

    num_speculative_tokens: int = 5
    acceptance_rate: float | None = None  # default 0.8 unless acceptance_lengths is given
    acceptance_lengths: tuple | None = None
    draft_model: object = None
    draft_cost_ratio: float | None = None
    method: str = "draft"

    def __post_init__(self):
        object.__setattr__(self, "num_speculative_tokens",
                           positive_int("num_speculative_tokens", self.num_speculative_tokens))
        if self.num_speculative_tokens > MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be at most {MAX_SPECULATIVE_TOKENS} "
                             f"(drafts per verification), got {self.num_speculative_tokens}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.acceptance_lengths is not None:
            if self.acceptance_rate is not None:
                raise ValueError("give acceptance_rate or acceptance_lengths, not both")
            k = self.num_speculative_tokens
            try:
                if isinstance(self.acceptance_lengths, (str, bytes)):
                    raise TypeError
                p = np.asarray(self.acceptance_lengths, dtype=np.float64)
            except (TypeError, ValueError):
                raise TypeError(f"acceptance_lengths must be a list of k + 1 = {k + 1} "
                                f"probabilities, got {self.acceptance_lengths!r}") from None
            if p.ndim != 1 or len(p) != k + 1:
                raise ValueError(f"acceptance_lengths must hold k + 1 = {k + 1} probabilities "
                                 f"(p0..p{k}), got {self.acceptance_lengths!r}")
            if not (np.isfinite(p).all() and (p >= 0).all() and (p <= 1).all()):
                raise ValueError(f"acceptance_lengths must be probabilities in [0, 1], got "
                                 f"{self.acceptance_lengths!r}")
            if abs(p.sum() - 1.0) > 1e-9:
                raise ValueError(f"acceptance_lengths must sum to 1, got "
                                 f"{self.acceptance_lengths!r} (sum {p.sum():g})")
            object.__setattr__(self, "acceptance_lengths", tuple(float(x) for x in p))
        else:
            rate = 0.8 if self.acceptance_rate is None else self.acceptance_rate
            object.__setattr__(self, "acceptance_rate",
                               fraction("acceptance_rate", rate, allow_zero=True))
        given = [name for name in ("draft_model", "draft_cost_ratio")
                 if getattr(self, name) is not None]
        if self.method == "ngram":
            if given:
                raise ValueError(f"{given[0]} is given but method='ngram' (prompt lookup) has "
                                 f"no draft model: drop it, or use method='draft'")
        elif len(given) == 2:
            raise ValueError("draft_model and draft_cost_ratio are both given: give one (the "
                             "draft model is priced by its roofline; the ratio prices it as a "
                             "fraction of the target's decode step)")
        elif not given:
            raise ValueError("speculative decoding needs its draft's cost: give draft_model (a "
                             "preset name or ModelConfig) or draft_cost_ratio, or "
                             "method='ngram' (prompt lookup, no draft)")
        if self.draft_cost_ratio is not None:
            positive_float("draft_cost_ratio", self.draft_cost_ratio, allow_zero=True)
        if self.draft_model is not None:
            from ...specs.models import get_model
            try:
                get_model(self.draft_model)  # a clear error for an unknown preset, now
            except (ValueError, TypeError) as e:
                raise type(e)(f"draft_model {self.draft_model!r}: {e}") from None

    def mean_emission(self, alpha=None) -> float:
        """Expected tokens per verification (bonus included): ``E``; ``alpha``: under
        independent acceptance at that rate instead of the config's model."""
        k = self.num_speculative_tokens
        if self.acceptance_lengths is not None and alpha is None:
            return 1.0 + dot(np.arange(k + 1), self.acceptance_lengths)  # (fixed order)
        a = self.acceptance_rate if alpha is None else alpha
        return float(k + 1) if a == 1.0 else (1 - a ** (k + 1)) / (1 - a)
