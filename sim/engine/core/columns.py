"""The engine's requests from a workload's columns and back (compiled, sim/native.py).

:func:`make_requests` builds the :class:`~sim.engine.core.request.Request` objects of a run from
the workload's columns (as lists); :func:`request_columns` reads the attributes the results are
built from (:mod:`sim.engine.core.records`) into one array each, in request order, in one pass
over the requests. Both are the same as the plain Python they replace, value for value:
``Request(i, ...)`` for each row; ``np.fromiter`` of each attribute, a time that is None
(never reached) as NaN, and flattens every request's runs of emitting iterations
(``Request.segments``) for :func:`~sim.engine.core.decoding.inter_token_gaps`. Interpreted,
it returns None and the caller reads the attributes one by one at C speed (``np.fromiter``,
``itertools.chain``), which a Python loop over the requests would not match.

Invariant (tests/test_columns.py): the arrays equal ``np.fromiter`` / ``np.array`` of each
attribute (and of the chained runs), bit for bit, for every status a request can end in.
"""

from __future__ import annotations

try:
    import cython
except ImportError:  # interpreted without Cython: its no-op names (sim/cython_shim.py)
    from sim import cython_shim as cython

import numpy as np

from .request import Request

# the integer attributes the results read, and the times that may be None
INT_COLUMNS = ("num_prompt_tokens", "num_output_tokens", "num_preemptions",
               "num_cached_tokens", "num_prefill_computed", "status")
TIME_COLUMNS = ("first_scheduled_time", "first_token_time", "finish_time")


@cython.locals(i=cython.Py_ssize_t, n=cython.Py_ssize_t, out=list)
def make_requests(ids, arrivals, prompts, outputs) -> list:
    """``[Request(i, ids[i], arrivals[i], prompts[i], outputs[i]) for i in ...]`` (lists of
    equal length)."""
    if not cython.compiled:  # (the comprehension: the interpreter's fastest form)
        return [Request(i, *row) for i, row in enumerate(zip(ids, arrivals, prompts, outputs))]
    n = len(ids)
    out = [None] * n
    for i in range(n):
        out[i] = Request(i, ids[i], arrivals[i], prompts[i], outputs[i])
    return out


@cython.locals(r=Request, i=cython.Py_ssize_t, n=cython.Py_ssize_t, k=cython.Py_ssize_t,
               arrival=cython.double[:], fs=cython.double[:], ft=cython.double[:],
               fin=cython.double[:], p=cython.longlong[:], o=cython.longlong[:],
               pre=cython.longlong[:], cac=cython.longlong[:], pc=cython.longlong[:],
               st=cython.longlong[:], per=cython.longlong[:], idx=cython.longlong[:],
               flat=cython.longlong[:], ids=list, reasons=list, segs=list, run=tuple)
def request_columns(requests):
    """``{name: array}`` of ``arrival_time`` and :data:`TIME_COLUMNS` (float64, None as NaN),
    :data:`INT_COLUMNS` (int64), ``request_id`` and ``reason`` (lists) and ``runs``: ``(per,
    flat, index)``, each request's number of runs (``len(r.segments)``), the runs' ``(first,
    last)`` one after another, request after request, and each request's ``index`` (int64),
    over ``requests`` (a list), compiled, in one pass (their objects lie apart in memory: at 1M
    requests each further pass over them cost ~0.1 s); None interpreted."""
    if not cython.compiled:
        return None
    n = len(requests)
    floats = [np.empty(n, dtype=np.float64) for _ in range(4)]
    ints = [np.empty(n, dtype=np.longlong) for _ in INT_COLUMNS]  # (C long long buffers)
    arrival, fs, ft, fin = floats[0], floats[1], floats[2], floats[3]
    p, o, pre, cac, pc, st = ints[0], ints[1], ints[2], ints[3], ints[4], ints[5]
    per_a = np.empty(n, dtype=np.longlong)
    idx_a = np.empty(n, dtype=np.longlong)
    flat_a = np.empty(2 * n + 16, dtype=np.longlong)  # (grown when the runs outnumber it)
    per, idx, flat = per_a, idx_a, flat_a
    ids = [None] * n
    reasons = [None] * n
    nan = float("nan")
    k = 0
    for i in range(n):
        r = requests[i]
        arrival[i] = r.arrival_time
        fs[i] = nan if r.first_scheduled_time is None else r.first_scheduled_time
        ft[i] = nan if r.first_token_time is None else r.first_token_time
        fin[i] = nan if r.finish_time is None else r.finish_time
        p[i] = r.num_prompt_tokens
        o[i] = r.num_output_tokens
        pre[i] = r.num_preemptions
        cac[i] = r.num_cached_tokens
        pc[i] = r.num_prefill_computed
        st[i] = r.status
        ids[i] = r.request_id
        reasons[i] = r.reason
        idx[i] = r.index
        segs = r.segments
        per[i] = len(segs)
        if k + 2 * per[i] > flat.shape[0]:
            flat_a = np.concatenate([flat_a, np.empty(len(flat_a) + 2 * per[i], np.longlong)])
            flat = flat_a
        for run in segs:
            flat[k] = run[0]
            flat[k + 1] = run[1]
            k += 2
    cols = dict(zip(("arrival_time",) + TIME_COLUMNS, floats))
    cols.update(zip(INT_COLUMNS, (a.view(np.int64) for a in ints)))
    cols["request_id"], cols["reason"] = ids, reasons
    cols["runs"] = (per_a.view(np.int64), flat_a[:k].view(np.int64), idx_a.view(np.int64))
    return cols
