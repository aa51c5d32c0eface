"""``sim.engine.simulation``: what ``run`` leaves behind and what it costs outside the loop."""

import gc

import pytest

import sim
import workloads as wl
from sim.engine.request import Request

GPU = dict(model="llama-3.1-8b", gpu="h100")


def _workload(n=300, seed=0):
    return wl.synthetic(n, rate=50.0, prompt=wl.LogNormal(400, 1.0, max_tokens=4000),
                        output=wl.LogNormal(60, 1.0, max_tokens=500), seed=seed)


def _alive_requests() -> int:
    return sum(isinstance(o, Request) for o in gc.get_objects())


@pytest.mark.parametrize("kw", [
    dict(scheduler="chunked"),
    dict(scheduler="sglang"),
    dict(scheduler="continuous", closed_loop=wl.ClosedLoop(8, 0.1)),
    dict(scheduler="chunked", replicas=3, router="least_outstanding"),
    dict(scheduler="chunked", replicas=2, closed_loop=wl.ClosedLoop(8, 0.1)),
    dict(scheduler="chunked", disaggregation=sim.Disaggregation(prefill_replicas=2,
                                                                decode_replicas=1)),
], ids=["chunked", "sglang", "closed", "cluster", "cluster-closed", "disaggregated"])
def test_no_request_object_outlives_run_without_a_gc_pass(kw):
    """The Result holds columns only: once ``run`` returns, its Request objects are freed by
    reference counting (no cycle keeps the replicas, and with them every request, alive until
    the cyclic collector happens to run: at 1M requests that was 1.3 GB held through the
    summary, the files and the plots)."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        before = _alive_requests()
        res = sim.run(_workload(), **kw, **GPU)
        assert len(res.requests) == 300
        assert _alive_requests() == before
    finally:
        if was:
            gc.enable()


def test_requests_are_built_without_a_collector_pass():
    """Building the requests allocates two objects per request; with the collector on, 50k
    requests took over a hundred collections while being built (full ones included)."""
    from sim.engine.simulation import _requests_from
    df = _workload(50_000)
    passes = []

    def count(phase, info):
        if phase == "start":
            passes.append(info["generation"])

    assert gc.isenabled()
    gc.callbacks.append(count)
    try:
        _df, reqs = _requests_from(df)
    finally:
        gc.callbacks.remove(count)
    assert len(reqs) == 50_000 and len(passes) <= 2, passes
    assert gc.isenabled()  # restored


def test_gc_paused_restores_the_collector_as_found():
    from sim.engine.records import gc_paused
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: the inner one leaves it paused
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # found disabled, left disabled
    finally:
        gc.enable()
    with pytest.raises(RuntimeError):  # restored on an error too
        with gc_paused():
            raise RuntimeError("boom")
    assert gc.isenabled()


def test_the_iteration_records_are_released_once_read(monkeypatch):
    """build_result copies the flat iteration buffer into columns and empties it (at 1M
    requests it held 156 MB through the ITL computation and the request columns)."""
    import sim.engine.simulation as simulation
    seen = []
    real = simulation.build_result

    def spy(requests, records, *args, **kwargs):
        n = len(records)
        res = real(requests, records, *args, **kwargs)
        seen.append((n, len(records)))
        return res
    monkeypatch.setattr(simulation, "build_result", spy)
    res = sim.run(_workload(), scheduler="chunked", **GPU)
    assert seen == [(8 * len(res.iterations), 0)]


def test_a_record_buffer_still_viewed_is_kept_not_an_error():
    """A view of the buffer that outlives its reader (a sampling profiler holding a frame, as
    Dask's threaded workers do) makes emptying it impossible: it is then kept, the run goes on."""
    from array import array

    import numpy as np

    from sim.engine.records import release
    buf = array("d", [1.0, 2.0])
    view = np.frombuffer(buf, dtype=np.float64)
    release(buf)
    assert len(buf) == 2 and view.sum() == 3.0
    del view
    release(buf)
    assert len(buf) == 0
