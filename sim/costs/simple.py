"""Cost models: one call ``cost(batch) -> seconds`` prices an engine iteration.

A batch (:class:`~sim.engine.core.batch.Batch`) says how many prefill tokens it computes (per
request: new tokens and cached context), how many requests decode one token, and the context
they attend over. Any callable with that signature is a cost model; these are the simple ones.
The roofline and calibrated models live in :mod:`sim.costs.roofline` and
:mod:`sim.costs.calibrated`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import positive_float


@dataclass(frozen=True, slots=True)
class ConstantCost:
    """Every iteration takes ``seconds``."""

    seconds: float

    def __post_init__(self):
        positive_float("seconds", self.seconds)

    def __call__(self, batch) -> float:
        return self.seconds

    def pure_decode_cost(self, num_decodes: int):
        """The price of ``num_decodes`` decodes alone, as ``f(context_tokens)`` (the engine's
        fast-forward; :mod:`sim.engine.core.batch`)."""
        seconds = self.seconds
        return lambda context_tokens: seconds


@dataclass(frozen=True, slots=True)
class LinearCost:
    """``base + per_prefill_token x prefill tokens + per_decode_token x decode tokens
    + per_context_token x context tokens`` (the tokens all requests attend over). Decode tokens
    are query tokens: a speculating decode counts ``1 + num_spec_tokens``."""

    base: float = 0.0
    per_prefill_token: float = 0.0
    per_decode_token: float = 0.0
    per_context_token: float = 0.0

    def __post_init__(self):
        for f in ("base", "per_prefill_token", "per_decode_token", "per_context_token"):
            positive_float(f, getattr(self, f), allow_zero=True)
        if not (self.base or self.per_prefill_token or self.per_decode_token
                or self.per_context_token):
            raise ValueError("LinearCost needs at least one positive coefficient")

    def __call__(self, batch) -> float:
        t = (self.base + self.per_prefill_token * batch.num_prefill_tokens
             + self.per_decode_token * batch.num_decode_tokens
             * (1 + getattr(batch, "num_spec_tokens", 0)))
        if self.per_context_token:
            t += self.per_context_token * batch.context_tokens
        return t

    def pure_decode_cost(self, num_decodes: int):
        """The price of ``num_decodes`` decodes alone (no speculation) as ``f(context_tokens)``,
        equal bit for bit to ``self(batch)``: the same terms in the same order (the engine's
        fast-forward; :mod:`sim.engine.core.batch`)."""
        t = (self.base + self.per_prefill_token * 0
             + self.per_decode_token * num_decodes * (1 + 0))
        per_ctx = self.per_context_token
        if not per_ctx:
            return lambda context_tokens: t
        return lambda context_tokens: t + per_ctx * context_tokens
