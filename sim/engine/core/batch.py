"""What one engine iteration computes: an immutable snapshot, the only argument of a cost model.

A cost model is any callable ``cost(batch) -> seconds``. The batch is immutable and refers to
no live state: it says the same thing after the iteration ran as before, whoever keeps it.
The engine calls it once per iteration, when the iteration starts (in time order across a
cluster's replicas), so a cost model may keep state (noise from its own generator, a record
of what it priced) - unless it has the optional ``cost.pure_decode_cost(num_decodes)``, which
returns ``f(decode_context_tokens) -> seconds``, equal bit for bit to pricing a batch of
``num_decodes`` decodes and nothing else (no speculation). Having it declares the cost model a
pure function of the batch: the engine's fast-forward of pure-decode iterations then prices
them through ``f`` instead of calling the cost model, ahead of time, and may price an
iteration more than once; without it (or where a subclass overrides ``__call__`` but not
``pure_decode_cost``: :func:`decode_pricer`) every iteration is stepped. ``RooflineCost``,
``LinearCost`` and ``ConstantCost`` have one.

- ``prefills``: ``(num_new_tokens, num_cached_tokens)`` per request running (part of) its
  prefill this iteration, ``num_prefill_tokens`` their new tokens in all;
- ``num_decode_tokens``: requests decoding this iteration, attending over
  ``decode_context_tokens`` tokens in all (their new tokens included). Decode tokens per
  request come from :mod:`sim.engine.core.decoding`;
- ``num_spec_tokens``: draft tokens each decoding request verifies (speculative decoding,
  :mod:`sim.engine.speculation`; 0 without): a decode then runs ``1 + num_spec_tokens`` query
  tokens (``num_decode_query_tokens`` in all) and its context counts those slots.

Per-request detail costs O(running) per iteration, so it is opt-in: a cost model with a class
attribute ``needs_decode_lengths = True`` gets ``prefill_ids`` (the prefilling requests'
indices, in ``prefills`` order), ``decode_ids`` and ``decode_lengths`` (context length of each
decoding request, a read-only array); other cost models get ``None`` there and pay nothing.
"""

from __future__ import annotations

import numpy as np

from ...checks import declared_with

FIELDS = ("iteration", "prefills", "num_prefill_tokens", "num_decode_tokens",
          "decode_context_tokens", "prefill_ids", "decode_ids", "decode_lengths", "num_spec_tokens")


class _Fields:
    __slots__ = FIELDS


class Batch(_Fields):
    """One iteration's work (see the module docstring); frozen: setting a field raises."""

    __slots__ = ()

    def __init__(self, iteration, prefills, num_prefill_tokens, num_decode_tokens,
                 decode_context_tokens, prefill_ids=None, decode_ids=None, decode_lengths=None,
                 num_spec_tokens=0):
        values = (iteration, tuple(prefills), num_prefill_tokens, num_decode_tokens,
                  decode_context_tokens, None if prefill_ids is None else tuple(prefill_ids),
                  None if decode_ids is None else tuple(decode_ids), decode_lengths,
                  num_spec_tokens)
        for name, value in zip(FIELDS, values):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError(f"a Batch is an immutable snapshot; cannot set {name!r}")

    __delattr__ = __setattr__

    def __eq__(self, other):
        if not isinstance(other, Batch):
            return NotImplemented
        return all(_same(getattr(self, f), getattr(other, f)) for f in FIELDS)

    __hash__ = None
    @property
    def num_decode_query_tokens(self) -> int:
        """Query tokens the decodes run: one each, ``1 + num_spec_tokens`` when speculating."""
        return self.num_decode_tokens * (1 + self.num_spec_tokens)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_query_tokens

    @property
    def num_requests(self) -> int:
        return len(self.prefills) + self.num_decode_tokens

    @property
    def prefill_context_tokens(self) -> int:
        return sum(new + cached for new, cached in self.prefills)

    @property
    def context_tokens(self) -> int:
        """Tokens attended over by every request of the batch (new tokens included)."""
        return self.decode_context_tokens + self.prefill_context_tokens

    def decode_context_lengths(self) -> np.ndarray:
        """Context length of each decoding request; needs ``needs_decode_lengths = True`` on
        the cost model."""
        if self.decode_lengths is None:
            if self.num_decode_tokens == 0:
                return np.zeros(0, dtype=np.int64)
            raise AttributeError("this batch carries no per-decode detail: give the cost model "
                                 "a class attribute needs_decode_lengths = True")
        return self.decode_lengths

    def items(self) -> list:
        """``(tokens, context_length)`` per request: prefills, then decodes (one token each, or
        ``1 + num_spec_tokens`` when speculating)."""
        out = [(new, new + cached) for new, cached in self.prefills]
        q = 1 + self.num_spec_tokens
        out += [(q, int(c)) for c in self.decode_context_lengths()]
        return out

    def __repr__(self):
        spec = f", spec_tokens={self.num_spec_tokens}" if self.num_spec_tokens else ""
        return (f"Batch(iteration={self.iteration}, prefill_tokens={self.num_prefill_tokens} in "
                f"{len(self.prefills)}, decodes={self.num_decode_tokens}{spec})")


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return a is not None and b is not None and np.array_equal(a, b)
    return a == b


class _Building(_Fields):
    """Same layout as :class:`Batch`, without the guard: filled, then re-classed."""

    __slots__ = ()


def make_batch(iteration, prefills, num_prefill_tokens, num_decode_tokens,
               decode_context_tokens, prefill_ids=None, decode_ids=None,
               decode_lengths=None, num_spec_tokens=0) -> Batch:
    """The engine's fast constructor (``prefills`` already a tuple of tuples): fill an
    unguarded object of the same slots layout, then switch its class to :class:`Batch` -
    measured 0.24 us, against 0.28 us for a plain ``__init__`` and 2.8x slower field reads for
    a NamedTuple (cost models read fields every iteration)."""
    b = _Building()
    b.iteration = iteration
    b.prefills = prefills
    b.num_prefill_tokens = num_prefill_tokens
    b.num_decode_tokens = num_decode_tokens
    b.decode_context_tokens = decode_context_tokens
    b.prefill_ids = prefill_ids
    b.decode_ids = decode_ids
    b.decode_lengths = decode_lengths
    b.num_spec_tokens = num_spec_tokens
    b.__class__ = Batch
    return b


def decode_pricer(cost):
    """``cost.pure_decode_cost`` when it prices what ``cost(batch)`` does: set on the instance,
    or defined by the class defining ``__call__`` or a subclass of it (a subclass that
    re-prices iterations without re-pricing pure decodes gets None; ``declared_with``). None
    when the cost model has none: its iterations are all stepped."""
    return cost.pure_decode_cost if declared_with(cost, "pure_decode_cost", "__call__") else None
