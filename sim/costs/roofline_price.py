"""The roofline's per-iteration price without a :class:`~sim.engine.core.batch.Batch`: the
engine's fast path for :class:`~sim.costs.roofline.RooflineCost` (compiled, sim/native.py).

``RooflinePrice(cost).price(prefills, num_prefill_tokens, num_decodes, decode_context_tokens,
num_spec_tokens)`` returns what ``cost(batch)`` returns for the batch of those fields, bit for
bit: the same terms added in the same order, from the same memo of linear-op prices
(``cost._linear_cache``, filled by ``cost.linear_time`` on a miss). ``prefills`` is the
iteration's ``(new, cached)`` pairs (a list or tuple). With ``overheads`` (an
:class:`~sim.costs.overheads.EngineOverheads`) it is :class:`~sim.costs.overheads.OverheadCost`'s
price over that base instead: the prefill iteration's fixed time added, then the host's
least time of a prefill forward (``prefill_host_s``: the iteration takes at least that), then
the step's CPU time added (or overlapped), the same way.

:func:`batch_pricer` is the engine's rule for using it: only for a cost model whose price
this is - a ``RooflineCost`` whose class does not re-price iterations (``__call__`` not
overridden), without MLA up-projections or local/linear attention layers, alone or wrapped in
an ``OverheadCost``; None otherwise (the engine then snapshots a ``Batch`` and calls the cost
model). A wrapper that knows its own price says so with a ``fields_price()`` method, which
``batch_pricer`` calls: speculative decoding's ``DraftCost`` gives a :class:`DraftPrice` (the
target's price plus its draft steps') where its target and draft are such roofline prices. The
price's terms are read once, when it is made: a cost model is not changed while a run uses it.

Invariant (tests/test_roofline_price.py): ``price(...) == cost(make_batch(...))`` for every
model, GPU, precision and batch shape it is used for (``DraftCost`` too: ratio and draft-model
modes, with or without overheads), in both the compiled and the interpreted core.
"""

from __future__ import annotations

try:
    import cython
except ImportError:  # interpreted without Cython: its no-op names (sim/cython_shim.py)
    from sim import cython_shim as cython


class DecodePrice:
    """:meth:`~sim.costs.roofline.RooflineCost.pure_decode_cost`'s price of a pure-decode batch
    as a function of the tokens its decodes attend over: ``base + max(context_tokens x
    per_ctx, floor)``, the roofline's terms in its order. The engine's fast-forward reads the
    three doubles and prices each iteration itself (compiled: no call per iteration; the same
    IEEE operations, so the same floats)."""

    def __init__(self, base, per_ctx, floor):
        self.base, self.per_ctx, self.floor = base, per_ctx, floor

    @cython.locals(d=cython.double)
    def __call__(self, context_tokens):
        d = context_tokens * self.per_ctx
        return self.base + (d if d > self.floor else self.floor)


class RooflinePrice:
    """``cost(batch)`` of a :class:`~sim.costs.roofline.RooflineCost` from the batch's fields
    (see the module docstring)."""

    def __init__(self, cost, overheads=None, prefill_host_s=0.0):
        self.cost = cost
        self.cache = cost._linear_cache
        self.fixed_s, self.per_seq_s, self.eager_s = cost._fixed_s, cost._per_seq_s, cost._eager_s
        self.graph_max = cost._graph_max
        self.decode_s_per_ctx = cost._decode_s_per_ctx
        self.decode_flops_s_per_ctx = cost._decode_flops_s_per_ctx
        self.decode_bytes_s_per_ctx = cost._decode_bytes_s_per_ctx
        self.attn_floor, self.attn_half = cost._attn_floor, cost._attn_half
        self.pa, self.pb, self.pc = cost._prefill_coeffs
        self.overheads = overheads is not None and bool(overheads.per_iter_s
                                                        or overheads.per_seq_s)
        self.prefill_iter_s = overheads.per_prefill_iter_s if overheads is not None else 0.0
        self.per_iter_cpu_s = overheads.per_iter_s if self.overheads else 0.0
        self.per_seq_cpu_s = overheads.per_seq_s if self.overheads else 0.0
        self.overlap = bool(overheads.overlap) if self.overheads else False
        self.prefill_host_s = prefill_host_s  # OverheadCost's: a prefill iteration's floor

    @cython.locals(num_prefill_tokens=cython.longlong, n_dec=cython.longlong,
                   ctx=cython.longlong, spec=cython.longlong, q=cython.longlong,
                   seqs=cython.longlong, new=cython.longlong, cached=cython.longlong,
                   t=cython.double, per_ctx=cython.double, d=cython.double, x=cython.double,
                   y=cython.double, floor=cython.double, half=cython.double, cpu=cython.double)
    def price(self, prefills, num_prefill_tokens, n_dec, ctx, spec) -> float:
        """The price of the batch with these fields (RooflineCost.__call__'s terms, in its
        order; then OverheadCost's step rule when made with overheads)."""
        q = n_dec * (1 + spec) if spec else n_dec
        seqs = q + len(prefills)
        key = (num_prefill_tokens + q, seqs)
        found = self.cache.get(key)
        if found is None:
            found = self.cost.linear_time(num_prefill_tokens + q, seqs)
        t = found
        t += self.fixed_s + self.per_seq_s * seqs  # fixed costs (RooflineCost.fixed_time)
        if prefills or q > self.graph_max:  # graphs are captured per query-token count
            t += self.eager_s
        if n_dec:
            per_ctx = self.decode_s_per_ctx if not spec else max(
                (1 + spec) * self.decode_flops_s_per_ctx, self.decode_bytes_s_per_ctx)
            d = ctx * per_ctx
            t += d if d > self.attn_floor else self.attn_floor
        if prefills:
            floor, half = self.attn_floor, self.attn_half
            for new, cached in prefills:
                x = self.pa * new * (cached + 0.5 * new)
                if half:  # efficiency saturating in the context (prefill_attention_eff)
                    x *= 1.0 + half / (cached + new)
                y = self.pb * (cached + new) + self.pc * new
                x = x if x > y else y
                t += x if x > floor else floor
            if self.prefill_iter_s:  # OverheadCost's prefill iteration's fixed time
                t += self.prefill_iter_s
            if t < self.prefill_host_s:  # OverheadCost's host launches, the GPU behind them
                t = self.prefill_host_s
        if not self.overheads:
            return t
        cpu = self.per_iter_cpu_s + self.per_seq_cpu_s * (n_dec + len(prefills))
        if self.overlap:
            return t if t >= cpu else cpu  # max(gpu_s, cpu): the first of equals
        return t + cpu


class DraftPrice(RooflinePrice):
    """Speculative decoding's price (:class:`~sim.engine.speculation.draft_cost.DraftCost`)
    from the batch's fields: the target's price plus ``k`` draft steps, each ``ratio`` x the
    target's price of the decode-only batch, or with a ``draft`` price the draft model's
    decode-only price less its fixed costs (plus one draft prefill of the chunks) - DraftCost's
    terms in its order, bit for bit."""

    def __init__(self, target, k, ratio=None, draft=None):
        self.target, self.draft, self.k = target, draft, k
        self.ratio = 0.0 if ratio is None else ratio

    @cython.locals(t=cython.double, n_dec=cython.longlong, spec=cython.longlong,
                   draft=RooflinePrice)
    def price(self, prefills, num_prefill_tokens, n_dec, ctx, spec) -> float:
        t = self.target.price(prefills, num_prefill_tokens, n_dec, ctx, spec)
        if not n_dec or not spec:
            return t
        if self.draft is None:
            return t + self.k * self.ratio * self.target.price((), 0, n_dec, ctx - n_dec * spec, 0)
        draft = self.draft  # (its step: the price less fixed_time(seqs, graphed=True))
        t += self.k * (draft.price((), 0, n_dec, ctx - n_dec * spec, 0)
                       - (draft.fixed_s + draft.per_seq_s * n_dec))
        if prefills:
            t += (draft.price(prefills, num_prefill_tokens, 0, 0, 0)
                  - (draft.fixed_s + draft.per_seq_s * len(prefills)))
        return t


def batch_pricer(cost):
    """A :class:`RooflinePrice` equal to ``cost`` (the module docstring's rule), else None."""
    from ..checks import declared_with
    from .overheads import OverheadCost, PureOverheadCost
    fields_price = getattr(type(cost), "fields_price", None)
    if fields_price is not None:  # a wrapper that knows its price (DraftCost)
        return fields_price(cost)
    overheads, host = None, 0.0
    if type(cost) in (OverheadCost, PureOverheadCost):
        cost, overheads, host = cost.base, cost.overheads, cost.prefill_host_s
    if not declared_with(cost, "fields_priced", "__call__") or cost._upproj \
            or cost._extra_layers:  # (a RooflineCost whose __call__ is the roofline's)
        return None
    return RooflinePrice(cost, overheads, host)
