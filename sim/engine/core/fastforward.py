"""Fast-forward: stretches of pure-decode iterations in one SimPy event.

In an open loop (one replica, or each of a cluster's up to its next arrival) or a closed loop
on one replica (up to the users' next issue, ``env.peek()``, and its first finish), when nothing
waits, nothing prefills, the policy declares ``quiet_when_decoding`` (all built-ins; SGLang's
replays its ``new_token_ratio`` decay in ``decoded_quietly``; a subclass overriding
``schedule`` declares it again) and the cost model declares itself a pure function of the
batch (``pure_decode_cost``: the roofline, ``LinearCost``, ``ConstantCost``, and ``DraftCost``
over those; see :func:`~sim.engine.core.batch.decode_pricer`), the iterations up to the next
arrival or decode preemption are pure decodes that change nothing but the clocks, the pool
and, at a decode's last token, the running set (decode progress is lazy): they are priced and
recorded one by one as the engine's loop would (:mod:`sim.engine.simulation`) - the same
prices, bit for bit, the same ``now + dt`` sums - and applied in one event
(:func:`decode_stretch`). Stepped every iteration: whenever a request waits (even one the
policy will not admit yet: static batching's queue, a full batch), a cluster in a closed
loop, prefill/decode pools, cost models without ``pure_decode_cost`` (called once per iteration, in
time order: they may keep state) and cost models that need per-decode detail. With
``check=True`` the invariants are checked after each fast-forwarded segment too.

Invariants (tests/test_fastforward.py; tests/test_invariants.py checks the pool after every
segment under ``check=True``):
- a stretch changes exactly what its iterations would, one ``form_batch`` and ``postprocess``
  each: the clocks, the pool and, at decodes' last tokens, the running set; its rows are the
  rows the loop would record, its end the clock the loop would reach, bit for bit;
- no arrival, routing or finish is seen in a different order: a stretch stops before the
  iteration that starts at or after the next arrival, and a finish in an iteration still
  running at that arrival is left to the loop; in a closed loop (``process.closed``) a
  stretch ends at its first finishing iteration and the loop finishes it
  (``process.pending_finish``) once the clock is at its end, so the users' hooks issue
  requests at the finish time;
- a cost model without ``pure_decode_cost`` is never called here (it may keep state: it is
  called once per iteration, in time order, by the loop).
"""

from __future__ import annotations

import math
from array import array

try:
    import cython
except ImportError:  # interpreted without Cython: its no-op names (sim/cython_shim.py)
    from sim import cython_shim as cython

from ...checks import declared_with
from ...costs.roofline_price import DecodePrice
from .batch import make_batch
from .events import delay_until
from .invariants import check_replica
from .records import ITERATION_COLUMNS, packed_rows

STRETCH_LIMIT = 4096  # iterations fast-forwarded in one event at most (bounds its rows list)


def can_fast_forward(policy, replica) -> bool:
    """Whether ``replica``'s pure-decode stretches may be fast-forwarded (the caller knows no
    other process acts on it but open-loop arrivals): its policy is quiet when only decodes
    run (``quiet_when_decoding``, declared where ``schedule`` is defined or below: not a flag
    a subclass overriding ``schedule`` inherits; see :mod:`sim.engine.core.policies`)."""
    return (bool(getattr(policy, "quiet_when_decoding", False))
            and declared_with(policy, "quiet_when_decoding", "schedule")
            and replica.layers is None)  # (a layer pool's decodes take blocks off-phase)


@cython.locals(c=cython.longlong, i=cython.longlong, count=cython.longlong,
               offset=cython.longlong, free=cython.longlong, n_run=cython.longlong,
               k=cython.longlong, need=cython.longlong, new=cython.longlong,
               ctx=cython.longlong, step=cython.longlong, bs=cython.longlong,
               done=cython.longlong, width=cython.Py_ssize_t, total=cython.longlong,
               spec=cython.longlong, mask=cython.longlong, t=cython.double, dt=cython.double,
               rows=list, finishing=cython.bint, finish_at=dict, inline=cython.bint,
               base=cython.double, per_ctx=cython.double, floor=cython.double,
               d_ctx=cython.double, compiled=cython.bint, out=cython.double[::1],
               n=cython.Py_ssize_t)
def decode_stretch(process, now, until):
    """Fast-forward pure-decode iterations: when nothing waits, nothing prefills and the
    policy is quiet then (``quiet_when_decoding``; its ``decoded_quietly(replica, n)``, if
    any, told of each segment), the iterations from ``now`` until one
    would preempt (its decodes' new blocks not free) or start at or after ``until`` (the
    next arrival) change nothing but the clocks, the pool and, at a decode's last token,
    the running set (decode progress is lazy). They are priced (the cost model's
    ``pure_decode_cost``) and recorded here one by one as the loop would (same prices, same
    sums, bit for bit) and applied in segments,
    each up to an iteration that finishes decodes (:meth:`Replica.skip_decodes`, then
    :meth:`Replica.finish_decodes` at its end, which must come before ``until``: a
    cluster's router then sees the replica as stepping leaves it). A segment is applied
    only where it ends at a time SimPy's clock can land on exactly (``now +
    delay_until(now, t) == t``: almost always; else it is cut back to such an end).
    Returns the delay to the stretch's end, or None when no iteration qualifies."""
    replica = process.replica
    d = replica.decodes
    spec = replica.num_spec_tokens  # speculation: each step's totals from SpecDecodes' rings
    finish_at, bs = d.finish_at, replica.block_size
    if spec:
        ring_ctx, ring_need, mask = d.ctx, d.need, d.mask
    else:
        by_phase = d.by_phase
    blocks = replica.blocks
    total = blocks.num_blocks
    cost = process.cost
    pricer = process.pricer  # (speculation: the batch priced by the cost model, declared pure)
    quietly = getattr(process.policy, "decoded_quietly", None)  # what n schedule calls did
    width = len(ITERATION_COLUMNS)  # rows[-width]: the start of the last iteration
    inf = math.inf
    # the stretch's rows: compiled, as C doubles in the process's scratch buffer (``n`` of
    # them written: no float objects, no packing); interpreted, a list of the values
    compiled = cython.compiled
    rows, n = [], 0
    if compiled:
        if process.scratch is None:
            process.scratch = array("d", bytes(8 * width * STRETCH_LIMIT))
        out = process.scratch
    t = now  # the next iteration's start
    done = 0  # iterations applied
    while replica.running and (not done or t < until):
        c, i = replica.clock, replica.iteration
        count, offset = d.count, (0 if spec else d.context_offset)
        free = blocks.num_free
        n_run = len(replica.running)
        price = None if spec else pricer(count)
        inline = isinstance(price, DecodePrice)  # (the roofline's: priced here, no call)
        if inline:
            base, per_ctx, floor = price.base, price.per_ctx, price.floor
        k = need = 0
        finishing = False
        while done + k < STRETCH_LIMIT:
            step = c + k
            if spec:
                new, ctx = int(ring_need[step & mask]), int(ring_ctx[step & mask])
            else:
                new, ctx = by_phase[step % bs], offset + count * step
            if new > free - need:
                break
            if inline:  # (DecodePrice.__call__'s operations, in its order)
                d_ctx = ctx * per_ctx
                dt = base + (d_ctx if d_ctx > floor else floor)
            else:
                dt = price(ctx) if price is not None else cost(
                    make_batch(i + k, (), 0, count, ctx, None, None, None, spec))
            if not dt >= 0 or dt == inf:
                break  # the loop prices it again and says so
            need += new
            if compiled:  # (ITERATION_COLUMNS' order, as the list below)
                out[n] = t
                out[n + 1] = dt
                out[n + 2] = n_run
                out[n + 3] = 0
                out[n + 4] = 0
                out[n + 5] = count
                out[n + 6] = total - free + need
                out[n + 7] = 0
                n += width
            else:
                rows += (t, dt, n_run, 0, 0, count, total - free + need, 0)
            t = t + dt
            k += 1
            if step in finish_at:
                finishing = True
                break
            if t >= until:  # an arrival is due by the next iteration's start
                break
        # its finishes come after the next arrival is routed (a cluster's router must not
        # see them), and SimPy's clock must land on the end: else cut back, the loop forms it
        while k and (finishing and t >= until or now + delay_until(now, t) != t):
            k -= 1
            need -= int(ring_need[(c + k) & mask]) if spec else by_phase[(c + k) % bs]
            if compiled:
                n -= width
                t = out[n]
            else:
                t = rows[-width]
                del rows[-width:]
            finishing = False
        if not k:
            break
        replica.skip_decodes(k, need, out[n - width] if compiled else rows[-width])
        if quietly is not None:
            quietly(replica, k)
        done += k
        if finishing and process.closed:  # its finish hooks run at its end (the loop's)
            process.pending_finish = c + k - 1
            break
        if finishing:
            replica.finish_decodes(c + k - 1, t)
        if process.check:  # (check=True: the invariants after each segment applied)
            check_replica(replica)
        if not finishing:
            break
    if not done:
        return None
    process.records.frombytes(memoryview(process.scratch).cast("B")[:8 * n] if compiled
                              else packed_rows(rows))
    return delay_until(now, t)
