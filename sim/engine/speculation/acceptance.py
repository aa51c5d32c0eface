"""Speculative decoding's acceptance draws: how many tokens each verification emits.

:class:`EmissionSource` gives a request's whole sequence of emissions at once (vectorised, from
the run's one seeded generator, in the engine's deterministic order), so its finish and its KV
block demands are known when it starts decoding
(:class:`~sim.engine.core.spec_decoding.SpecDecodes`); after a preemption it is drawn anew for
the tokens left. :func:`make_drawer` builds one replica's ``draw(r, tokens_left)``.

Invariants (tests/test_speculation.py): emissions are in ``1..k+1`` and sum to the tokens left;
the mean emission per verification is ``E = (1 - alpha**(k+1)) / (1 - alpha)`` and the accepted
fraction of drafts ``alpha (1 - alpha**k) / ((1 - alpha) k)`` (closed forms, checked by
simulation); same seed, same draws.
"""

from __future__ import annotations

import math

import numpy as np

from .settings import SpeculativeConfig


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
