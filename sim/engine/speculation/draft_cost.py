"""Speculative decoding's price: the target's cost model plus the draft's (:class:`DraftCost`).

``SimConfig.resolved_cost_model`` wraps the run's cost model in it when speculation is on with
a draft (``draft_model`` or ``draft_cost_ratio``; ``ngram`` drafts for free). It stays pure when
what it adds up is (the engine may then fast-forward pure-decode stretches), and a batch without
decodes or drafts is priced as the target alone (tests/test_speculation.py).
"""

from __future__ import annotations

import numpy as np

from ..core.batch import decode_pricer, make_batch


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

    def fields_price(self):
        """Its price from a batch's fields (:class:`~sim.costs.roofline_price.DraftPrice`),
        where the target's and the draft's are roofline prices and nothing re-prices or
        needs per-request lengths; else None (the engine then prices a Batch)."""
        from ...costs.roofline import RooflineCost
        from ...costs.roofline_price import DraftPrice, batch_pricer
        if type(self).__call__ is not DraftCost.__call__ or self.needs_decode_lengths:
            return None
        target = batch_pricer(self.target)
        draft = None if self.draft is None else batch_pricer(self.draft)
        if target is None or (self.draft is not None and (
                draft is None
                or getattr(type(self.draft), "fixed_time", None) is not RooflineCost.fixed_time)):
            return None
        return DraftPrice(target, self.k, self.ratio, draft)

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
