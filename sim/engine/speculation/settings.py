"""Speculative decoding in the engine: its settings, the seeded acceptance draws, and the draft's
price.

:class:`SpeculativeConfig` (``SimConfig.speculative``) says how many tokens a draft proposes per
iteration (``k = num_speculative_tokens``), how they are accepted and what drafting costs:

- acceptance: each draft token is accepted with probability ``acceptance_rate`` (``alpha``)
  until the first rejection (the cheat sheet's :class:`~sim.cheatsheet.speculative.DraftModel`),
  or the number accepted per verification follows ``acceptance_lengths = [p0, ..., pk]``
  (``p_j``: exactly ``j`` accepted). A workload column ``acceptance_rate`` overrides ``alpha``
  per request (code and chat differ);
- draft cost - exactly one of: ``draft_model`` (a preset name or ``ModelConfig``: its roofline on
  the run's GPU, ``k`` sequential single-token steps over the batch's decodes plus a prefill of
  the batch's prefill chunks), ``draft_cost_ratio`` ``c`` (each of the ``k`` draft steps costs
  ``c`` x the target's decode step for the same decodes), or ``method="ngram"`` (prompt lookup:
  no draft model, cost 0). There is no silent free draft.

Verification: a speculating decode runs ``k + 1`` query tokens (the batch's
``num_spec_tokens = k``; cost models price the GEMM rows and attention queries) and emits
``1 + accepted`` tokens, never more than it has left. :class:`EmissionSource` gives a
request's whole sequence of emissions at once (vectorised, from the run's one seeded
generator, in the engine's deterministic order), so its finish and its KV block demands are known when it
starts decoding (:class:`~sim.engine.core.decoding.SpecDecodes`); after a preemption it is drawn
anew for the tokens left.

Invariants (tests/test_speculation.py): emissions are in ``1..k+1`` and sum to the tokens left;
the mean emission per verification is ``E = (1 - alpha**(k+1)) / (1 - alpha)`` and the accepted
fraction of drafts ``alpha (1 - alpha**k) / ((1 - alpha) k)`` (closed forms, checked by
simulation); same seed, same draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...checks import fraction, positive_float, positive_int
from ..core.batch import decode_pricer, make_batch

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
            return 1.0 + float(np.dot(np.arange(k + 1), self.acceptance_lengths))
        a = self.acceptance_rate if alpha is None else alpha
        return float(k + 1) if a == 1.0 else (1 - a ** (k + 1)) / (1 - a)


def _emissions(lengths, u, alpha, k):
    """Tokens per verification from uniforms ``u``: ``1 + accepted``, ``accepted`` drawn from
    ``lengths`` (p0..pk) when given, else geometric (failures before the first rejection at
    acceptance ``alpha``) capped at ``k``."""
    if lengths is not None:
        return np.searchsorted(np.cumsum(lengths)[:-1], u, side="right") + 1
    if alpha >= 1.0:
        return np.full(len(u), k + 1, dtype=np.int64)
    if alpha <= 0.0:
        return np.ones(len(u), dtype=np.int64)
    return np.minimum(np.floor(np.log1p(-u) / math.log(alpha)), k).astype(np.int64) + 1


def emission_draws(spec: SpeculativeConfig, rng, n: int, alpha=None, *,
                   with_overshoot=False):
    """Tokens emitted by each verification of a request with ``n`` tokens left: int64 values in
    ``1..k+1`` summing to ``n`` (the last one cut to what is left). ``alpha``: the request's own
    acceptance rate, independent acceptance (``None``: the run's acceptance model).
    ``with_overshoot``: also return the accepted drafts the cut dropped (they count as
    accepted in vLLM's acceptance metrics, which see the verification before the output is
    cut at ``max_tokens``)."""
    k = spec.num_speculative_tokens
    lengths = spec.acceptance_lengths if alpha is None else None
    a = spec.acceptance_rate if alpha is None else alpha
    mean = spec.mean_emission(alpha)
    draw = max(1, min(n, math.ceil(1.1 * n / mean) + 8))
    parts, total = [], 0
    while total < n:
        e = _emissions(lengths, rng.random(draw), a, k)
        parts.append(e)
        total += int(e.sum())
        draw = max(8, math.ceil(1.1 * (n - total) / mean) + 8)
    e = np.concatenate(parts) if len(parts) > 1 else parts[0]
    cum = np.cumsum(e)
    m = int(np.searchsorted(cum, n)) + 1  # first verification reaching n tokens
    e = e[:m].astype(np.int64)
    over = int(cum[m - 1]) - n
    e[-1] -= over
    return (e, over) if with_overshoot else e


class EmissionSource:
    """A run's emissions: ``source(n, alpha) -> (run, base, over)`` for a request with ``n``
    tokens left: ``run[j] - base`` tokens come out of its first ``j`` verifications (``j < m =
    len(run) - 1``; ``run[0] == base``), its ``m``-th verification reaches ``n`` and drew
    ``over`` accepted drafts beyond them (``run[m] - base == n + over``, or ``n``). Requests
    under the run's acceptance model take consecutive stretches of one pre-drawn pool
    (``POOL`` verifications drawn and summed at once): ``run`` is a view of the pool's running
    sums, so a request costs one ``searchsorted`` and a slice, no copy; a request with its own
    ``acceptance_rate`` draws for itself (:func:`emission_draws`). Same seed, same output."""

    POOL = 1 << 16

    def __init__(self, spec: SpeculativeConfig, rng):
        self.spec, self.rng = spec, rng
        self.k = spec.num_speculative_tokens
        self.pos = 0
        self.sums = np.zeros(1, dtype=np.int64)  # sums[j]: tokens of the pool's first j
        self.at = self.total = 0  # sums[pos], sums[-1] (Python ints: read per request)

    def _refill(self):
        spec = self.spec
        e = _emissions(spec.acceptance_lengths, self.rng.random(self.POOL), spec.acceptance_rate,
                       self.k)
        self.sums = np.zeros(self.POOL + 1, dtype=np.int64)
        np.cumsum(e, out=self.sums[1:])
        self.pos = self.at = 0
        self.total = int(self.sums[-1])

    def __call__(self, n: int, alpha=None):
        spec = self.spec
        if (alpha is not None and (spec.acceptance_lengths is not None
                                   or alpha != spec.acceptance_rate)) or n > self.POOL:
            e, over = emission_draws(spec, self.rng, n, alpha, with_overshoot=True)
            run = np.zeros(len(e) + 1, dtype=np.int64)
            np.cumsum(e, out=run[1:])
            return run, 0, over
        base = self.at
        target = base + n
        if target > self.total:
            self._refill()
            base, target = 0, n
        p = self.pos
        q = int(self.sums.searchsorted(target))  # the verification reaching n tokens
        self.pos, self.at = q, int(self.sums[q])
        return self.sums[p:q + 1], base, self.at - target


def make_drawer(config, stream: int = 0):
    """``draw(r, tokens_left)`` for one replica: a speculating request's running sums of
    emissions (:class:`EmissionSource`), from a generator seeded by ``config.seed`` (replica
    ``stream`` > 0 of a cluster: by ``[seed, stream]``, its own stream) and consumed in the
    engine's deterministic order; None without speculation."""
    spec = config.speculative
    if spec is None:
        return None
    seed = config.seed if not stream else [config.seed, stream]
    source = EmissionSource(spec, np.random.default_rng(seed))
    return lambda r, n: source(n, r.acceptance_rate)


class DraftCost:
    """The target's cost model plus the draft's: ``cost(batch) = target(batch) + draft``.

    ``ratio`` ``c``: ``k * c * target(decode-only batch)``, the decodes priced as plain
    one-token decodes; ``draft`` (a cost model of the draft model): ``k`` draft steps over the
    decode-only batch plus a draft prefill of the batch's prefill chunks, each without the
    draft model's per-iteration CPU costs (``fixed_time``: the engine step schedules and
    samples once, not once per draft step). No decodes, no draft steps."""

    def __init__(self, target, k, *, ratio=None, draft=None):
        self.target, self.k, self.ratio, self.draft = target, k, ratio, draft
        self.needs_decode_lengths = bool(getattr(target, "needs_decode_lengths", False)
                                         or getattr(draft, "needs_decode_lengths", False))
        self.name = getattr(target, "name", type(target).__name__)
        # pure when what it adds up is (sim.engine.core.batch.decode_pricer): the engine may then
        # fast-forward pure-decode stretches, pricing each step's batch ahead of time; a batch
        # of decodes without drafts is the target's alone
        target_price = decode_pricer(target)
        if (target_price is not None and (draft is None or decode_pricer(draft) is not None)
                and type(self).__call__ is DraftCost.__call__):  # (a subclass re-prices)
            self.pure_decode_cost = target_price

    def _draft_step(self, batch, seqs) -> float:
        t = self.draft(batch)
        fixed = getattr(self.draft, "fixed_time", None)
        return t - fixed(seqs, graphed=True) if fixed is not None else t

    def __call__(self, batch) -> float:
        t = self.target(batch)
        n = batch.num_decode_tokens
        k = batch.num_spec_tokens
        if not n or not k:
            return t
        lengths = batch.decode_lengths
        plain = make_batch(batch.iteration, (), 0, n, batch.decode_context_tokens - n * k,
                           (), batch.decode_ids, None if lengths is None else lengths - k)
        if self.draft is None:
            return t + self.k * self.ratio * self.target(plain)
        t += self.k * self._draft_step(plain, n)
        if batch.prefills:
            t += self._draft_step(make_batch(batch.iteration, batch.prefills,
                                             batch.num_prefill_tokens, 0, 0, batch.prefill_ids,
                                             (), None if lengths is None else lengths[:0]),
                                  len(batch.prefills))
        return t

    def cost_ratio(self, context=1024) -> float:
        """``c``: one draft step over one target decode step, for one sequence at ``context``
        tokens (the cheat sheet's ``speculative_speedup(a, k, c)``)."""
        if self.draft is None:
            return float(self.ratio)
        one = make_batch(0, (), 0, 1, context, (), (0,), np.array([context], dtype=np.int64))
        return self._draft_step(one, 1) / self.target(one)

    def __repr__(self):
        draft = f"draft={self.draft!r}" if self.draft is not None else f"ratio={self.ratio}"
        return f"DraftCost({self.target!r}, k={self.k}, {draft})"
