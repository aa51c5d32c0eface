"""sim.engine.core.columns: requests from columns and back, value for value the plain Python
(compiled: one typed pass; interpreted: None, the caller reads np.fromiter per column)."""

import operator

import numpy as np
import pytest

import workloads as wl
from sim import native
from sim.engine import run
from sim.engine.core.columns import INT_COLUMNS, TIME_COLUMNS, make_requests, request_columns
from sim.engine.core.request import FINISHED, REJECTED, Request


def _plain(requests):
    n = len(requests)
    cols = {"arrival_time": np.fromiter((r.arrival_time for r in requests), np.float64, n)}
    for name in TIME_COLUMNS:  # None as NaN
        cols[name] = np.array([getattr(r, name) for r in requests], dtype=np.float64)
    for name in INT_COLUMNS:
        cols[name] = np.fromiter((getattr(r, name) for r in requests), np.int64, n)
    cols["request_id"] = [r.request_id for r in requests]
    cols["reason"] = [r.reason for r in requests]
    cols["runs"] = _plain_runs(requests)
    return cols


def _requests():
    reqs = make_requests(["a", "b", "c", "d"], [0.0, 0.25, 1e-300, 7.5], [10, 20, 1, 4096],
                         [1, 5, 2, 9000])
    reqs[0].status, reqs[0].first_scheduled_time = FINISHED, 0.1
    reqs[0].first_token_time, reqs[0].finish_time = 0.2, 0.30000000000000004
    reqs[0].num_preemptions, reqs[0].num_cached_tokens, reqs[0].num_prefill_computed = 3, 8, 31
    reqs[1].first_scheduled_time = 0.5  # scheduled, no token yet
    reqs[3].status = REJECTED  # never scheduled
    return reqs


def test_make_requests_is_the_plain_constructor():
    reqs = make_requests(["x", 7], [0.5, 1.5], [3, 4], [5, 6])
    assert [type(r) for r in reqs] == [Request, Request]
    assert [(r.index, r.request_id, r.arrival_time, r.num_prompt_tokens, r.num_output_tokens,
             r.prefill_target) for r in reqs] == [(0, "x", 0.5, 3, 5, 3), (1, 7, 1.5, 4, 6, 4)]
    assert make_requests([], [], [], []) == []


def _same(got, want):
    assert set(got) == set(want)
    for name, arr in want.items():
        if name in ("request_id", "reason"):  # (lists of the objects themselves)
            assert type(got[name]) is list and all(map(operator.is_, got[name], arr)), name
            continue
        if name == "runs":  # (per, flat, index)
            assert [(a.dtype, a.tobytes()) for a in got[name]] == \
                [(a.dtype, a.tobytes()) for a in arr]
            continue
        assert got[name].dtype == arr.dtype, name
        assert got[name].tobytes() == arr.tobytes(), name  # (NaN where None, bit for bit)


@pytest.mark.skipif(native.summary() != "compiled", reason="interpreted: returns None")
def test_request_columns_are_the_plain_columns_bit_for_bit():
    reqs = _requests()
    _same(request_columns(reqs), _plain(reqs))
    _same(request_columns([]), _plain([]))


def _a_runs_requests(module, name):
    """The requests of a run with rejections and preemptions, as they ended: what
    ``module.name`` (a function of the requests) was called with."""
    df = wl.synthetic(300, rate=200.0, prompt=wl.LogNormal(900, 1.0, max_tokens=8000),
                      output=wl.LogNormal(200, 1.0, max_tokens=2000), seed=2)
    seen, real = {}, getattr(module, name)
    def recording(reqs):
        seen["reqs"] = reqs
        return real(reqs)
    setattr(module, name, recording)
    try:
        res = run(df, model="llama-3.1-8b", gpu="h100", scheduler="continuous", kv_blocks=400,
                  max_model_len=4096)
    finally:
        setattr(module, name, real)
    assert (res.requests["status"] == "rejected").any() and res.requests["num_preemptions"].any()
    return seen["reqs"]


@pytest.mark.skipif(native.summary() != "compiled", reason="interpreted: returns None")
def test_request_columns_of_a_run_with_rejections_and_preemptions():
    from sim.engine.core import records
    reqs = _a_runs_requests(records, "request_columns")
    _same(request_columns(reqs), _plain(reqs))


def test_interpreted_returns_none_for_the_callers_own_columns():
    assert (request_columns(_requests()) is None) == (native.summary() != "compiled")


def _plain_runs(requests):
    per = np.array([len(r.segments) for r in requests], dtype=np.int64)
    flat = np.array([x for r in requests for run in r.segments for x in run], dtype=np.int64)
    return per, flat, np.array([r.index for r in requests], dtype=np.int64)


@pytest.mark.skipif(native.summary() != "compiled", reason="interpreted: returns None")
def test_request_columns_runs_are_the_chained_segments_bit_for_bit():
    """Runs, points of prefill-only iterations (negative), more runs than requests (the buffer
    grown), requests with none, and none at all; then a run's own preempted requests."""
    reqs = _requests()
    reqs[0].segments = [(3, 9), (-1 - 12, -1), (14, 14)]
    reqs[2].segments = [(0, 2**40)]
    reqs[3].segments = [(j, j + 1) for j in range(0, 60, 3)]
    _same(request_columns(reqs), _plain(reqs))
    for got in request_columns([])["runs"]:
        assert got.dtype == np.int64 and len(got) == 0
    from sim.engine.core import records
    reqs = _a_runs_requests(records, "request_columns")
    assert max(map(len, (r.segments for r in reqs))) > 1  # (runs split by preemptions)
    _same(request_columns(reqs), _plain(reqs))


@pytest.mark.parametrize("codes", [[3, 4, 3, 0, 1, 2], [], [4] * 5])
def test_status_column_is_what_pandas_makes_of_the_names(codes):
    """Built from the codes (in Arrow under pandas 3), the same column, dtype and values, as
    pandas infers from the names as Python strings."""
    import pandas as pd
    from sim.engine.core.records import status_column
    from sim.engine.core.request import STATUS_NAMES
    codes = np.array(codes, dtype=np.int64)
    got = pd.DataFrame({"status": status_column(codes)}, copy=False)["status"]
    want = pd.DataFrame({"status": np.array(STATUS_NAMES, dtype=object)[codes]})["status"]
    assert got.dtype == want.dtype
    assert got.tolist() == want.tolist() and got.equals(want)


@pytest.mark.parametrize("rows", [0, 1, 2 * 32768 + 5])
def test_iterations_frame_is_the_buffer_column_by_column(rows):
    """Split block by block (more rows than one block here): each column the buffer's, the
    counts as int64, whatever the rows."""
    from array import array
    from sim.engine.core import records
    assert records.ROWS_PER_BLOCK == 32768
    rng = np.random.default_rng(rows)
    k = len(records.ITERATION_COLUMNS)
    values = rng.random((rows, k)) * 1e3
    values[:, 2:] = np.floor(values[:, 2:])
    buf = array("d", values.ravel().tolist())
    got = records.iterations_frame(buf)
    assert list(got.columns) == ["iteration", *records.ITERATION_COLUMNS]
    assert got["iteration"].tolist() == list(range(rows))
    for j, c in enumerate(records.ITERATION_COLUMNS):
        want = values[:, j] if j < 2 else values[:, j].astype(np.int64)
        assert got[c].dtype == want.dtype and got[c].to_numpy().tobytes() == want.tobytes(), c
