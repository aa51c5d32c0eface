"""``sim.engine.simulation``: what ``run`` leaves behind and what it costs outside the loop."""

import gc
import re

import pytest

import sim
import workloads as wl
from sim.engine.core.request import Request

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
    from sim.engine.core.records import gc_paused
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

    from sim.engine.core.records import release
    buf = array("d", [1.0, 2.0])
    view = np.frombuffer(buf, dtype=np.float64)
    release(buf)
    assert len(buf) == 2 and view.sum() == 3.0
    del view
    release(buf)
    assert len(buf) == 0


# -- an iteration whose forming preempted every running request is formed anew ---------------

@pytest.mark.parametrize("scheduler", ["sglang", "vllm"])
def test_the_preemptions_of_a_batch_formed_anew_are_recorded_in_the_iteration_that_runs(
        scheduler):
    """A decode step that preempts the only running request forms an empty batch (vLLM admits
    none in a step that preempted; SGLang's retraction) and is formed anew: that preemption
    is counted in the iteration that runs, so the iterations' ``num_preemptions`` sum to the
    requests' (sim.results.metrics says so; the first forming's count was dropped: 0 vs 1).
    Here A (192 tokens, one 512-token hash id) references the radix node that B, sharing the
    id, then fills to 512 tokens: alone after B, A's decodes outgrow the 100-page pool."""
    import pandas as pd
    df = pd.DataFrame({"arrival_time": [0.0, 0.5], "num_prompt_tokens": [192, 520],
                       "num_output_tokens": [1300, 1], "hash_ids": [[1000], [1000, 1001]]})
    df.attrs["block_size"] = 512
    formed = []
    from sim.engine.core.replica import Replica

    class Counted(Replica):
        def form(self, *args, **kwargs):  # (form_batch forms through it too)
            formed.append(self.iteration)
            return super().form(*args, **kwargs)
    import sim.engine.fleet.cluster as cluster  # (where new_replica builds every replica)
    real, cluster.Replica = cluster.Replica, Counted
    try:
        res = sim.run(df, scheduler=scheduler, prefix_caching="radix", block_size=16,
                      kv_blocks=100, check=True, **GPU)
    finally:
        cluster.Replica = real
    assert len(formed) == len(set(formed)) + 1  # one iteration formed twice
    assert res.requests["num_preemptions"].tolist() == [1, 0]
    assert res.iterations["num_preemptions"].sum() == 1


class _AdmitThenPreempt:
    """A broken policy: it admits the queue's head and preempts it again in the same call (an
    empty batch with a preemption, the same state every time it is formed anew)."""

    def __init__(self):
        self.calls = 0

    def schedule(self, replica, now):
        self.calls += 1
        assert self.calls < 1000, "the engine formed the same empty batch forever"
        r = replica.waiting[0]
        if replica.admit(r, r.prefill_target):
            replica.preempt(r)


class _PreemptAll:
    """A broken policy: admits everything once, then preempts whatever runs and admits
    nothing."""

    def __init__(self):
        self.calls = 0

    def schedule(self, replica, now):
        self.calls += 1
        assert self.calls < 1000, "the engine formed the same empty batch forever"
        if not replica.iteration:
            for r in list(replica.waiting):
                replica.admit(r, r.prefill_target)
            return
        for r in list(replica.running.values()):
            replica.preempt(r)


@pytest.mark.parametrize("cluster", [{}, dict(replicas=2, router="round_robin")])
def test_a_policy_that_preempts_what_it_admits_raises_instead_of_forming_forever(cluster):
    """Forming anew must make progress: each round preempts some request that was running
    before it. A policy that only preempts what it has just admitted raises (the engine
    formed its empty batch forever, at the same simulated time); one that preempts
    everything and admits nothing raises once nothing runs."""
    import pandas as pd
    df = pd.DataFrame({"arrival_time": [0.0, 0.0, 0.0, 0.0], "num_prompt_tokens": [8] * 4,
                       "num_output_tokens": [5] * 4})
    policy = _AdmitThenPreempt()
    with pytest.raises(RuntimeError, match=r"formed an empty batch with [24] waiting and 0 "
                                           r"running \(it preempted only requests it had just "
                                           r"admitted\)"):
        sim.run(df, scheduler=policy, **cluster, **GPU)
    assert policy.calls <= 2  # one forming per replica
    policy = _PreemptAll()
    with pytest.raises(RuntimeError, match=r"formed an empty batch with [24] waiting and 0 "
                                           r"running$"):
        sim.run(df, scheduler=policy, **cluster, **GPU)
    assert policy.calls <= 6  # admit, preempt, raise: on each replica


@pytest.mark.parametrize("config, hint", [
    ("vllm", "; for a scheduler write scheduler='vllm'"),
    ({"scheduler": "vllm"}, "; for a dict write SimConfig(**d) or pass its keys as keywords"),
    (5, ""),
])
def test_a_config_that_is_not_a_simconfig_is_a_type_error_naming_it(config, hint):
    """``sim.run(df, "vllm")`` (a scheduler in the config's place) raised AttributeError from
    inside the run; run, sweep's ``base`` and max_rate's ``config`` now say what to write."""
    df = wl.load("azure-code", n=5)
    with pytest.raises(TypeError, match=f"^config must be a sim.SimConfig or None, got "
                                        f"{re.escape(repr(config) + hint)}$"):
        sim.run(df, config)
    with pytest.raises(TypeError, match="^config must be a sim.SimConfig or None"):
        sim.run(df, config, max_batch_size=4)
    with pytest.raises(TypeError, match="^base must be a sim.SimConfig or None"):
        sim.sweep(df, {"max_batch_size": [4]}, base=config, workers=1, progress=False)
    with pytest.raises(TypeError, match="^config must be a sim.SimConfig or None"):
        sim.max_rate(df, {"ttft": 1.0}, config=config)
    assert sim.run(df, None).summary()["num_finished"] == 5


class _FreezeWatcher:
    """A cost model that records how many objects the collector holds frozen as it prices."""

    def __init__(self):
        self.seen = []

    def __call__(self, batch):
        if len(self.seen) < 20:  # (the count walks the frozen objects: the first 20 prices)
            self.seen.append(gc.get_freeze_count())
        return 0.01


@pytest.mark.parametrize("kw", [dict(), dict(replicas=3, router="least_outstanding")],
                         ids=["one", "cluster"])
def test_the_event_loop_runs_with_the_requests_frozen_and_thaws_them(kw):
    """gc_frozen: while the loop runs, every object made before it (the 300 requests among
    them) is in the permanent generation, so the loop's collections skip them; after the run
    nothing stays frozen. A caller's own freeze is left as it was (nothing thawed or added)."""
    watch = _FreezeWatcher()
    res = sim.run(_workload(), cost_model=watch, **kw)
    assert (res.requests["status"] == "finished").all()
    assert min(watch.seen) > 300 and gc.get_freeze_count() == 0
    watch, df = _FreezeWatcher(), _workload()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        sim.run(df, cost_model=watch, **kw)
        assert max(watch.seen) <= frozen  # nothing more frozen (only what died left) ...
        assert gc.get_freeze_count() > 0  # ... and nothing thawed
    finally:
        gc.unfreeze()


def test_gc_frozen_thaws_on_an_error():
    from sim.engine.core.records import gc_frozen
    with pytest.raises(RuntimeError):
        with gc_frozen():
            assert gc.get_freeze_count() > 0
            raise RuntimeError("boom")
    assert gc.get_freeze_count() == 0


def test_a_misspelt_keyword_names_the_field_meant():
    df = wl.from_records([dict(arrival_time=0.0, num_prompt_tokens=10, num_output_tokens=2)])
    with pytest.raises(TypeError, match=r"^unknown SimConfig field\(s\) \['shceduler'\] "
                                        r"\(did you mean 'scheduler'\?\)$"):
        sim.run(df, shceduler="vllm")


def test_a_seed_that_changes_nothing_warns(tmp_path, capsys):
    """(issue 32, item 5) --seed on a replayed trace without speculation (the README's own
    example used it) and seed= with nothing in the engine drawing at random were silent
    no-ops; they warn, while a seed that some draw takes does not."""
    import warnings

    from sim.cli import main
    df = wl.load("azure-code", n=20)
    with pytest.warns(UserWarning, match="seed=3 changes nothing"):
        sim.run(df, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sim.run(df, seed=3, replicas=2, router="random")
        sim.run(df, seed=3, speculative=sim.SpeculativeConfig(num_speculative_tokens=2,
                                                              method="ngram"))
        sim.run(df)  # (the default seed, 0, is no choice made)
    out = str(tmp_path / "o")
    assert main(["run", "-w", "azure-code", "-n", "20", "--seed", "3", "-q", "-o", out]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warning: --seed 3 changes nothing" in err
    assert main(["run", "-w", "sharegpt", "--rate", "2", "-n", "20", "--seed", "3", "-q",
                 "-o", out]) == 0
    assert capsys.readouterr().err == ""  # a length-only set draws its arrivals from it


def test_arrival_times_in_the_wrong_unit_or_out_of_resolution_warn(tmp_path, capsys):
    """(issue 32, item 7) Epoch-millisecond arrival times were read as seconds without a word,
    and --rate 1e-300 reported TTFT, ITL and E2E of exactly 0 (float64 cannot resolve a
    millisecond at 1e301 s): each warns, in the CLI as one line; a trace's own seconds do
    not."""
    import warnings

    from sim.cli import main
    df = wl.load("azure-code", n=50)
    cost = sim.ConstantCost(0.01)
    cases = {"epoch timestamps \\(in milliseconds": df.arrival_time * 1000 + 1.7e12,
             "epoch timestamps \\(in seconds": df.arrival_time + 1.7e9,
             "look like milliseconds read as seconds": (df.arrival_time * 1000).round(),
             "float64 resolves only": df.arrival_time * 1e290}
    for match, times in cases.items():
        with pytest.warns(UserWarning, match=match):
            sim.run(df.assign(arrival_time=times), cost_model=cost)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sim.run(df, cost_model=cost)
        sim.run(df.assign(arrival_time=df.arrival_time.round()), cost_model=cost)  # 1 s apart
    assert main(["run", "-n", "50", "--rate", "1e-300", "-q", "-o", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sim run: warning: arrival times reach ")
