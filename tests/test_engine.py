import dataclasses

import numpy as np
import pandas as pd
import pytest
import simpy
from hypothesis import HealthCheck, given, settings, strategies as st

import sim
from workloads import ClosedLoop
from sim import simulate_continuous_batching, simulate_static_batching
from sim.constants import KV_BLOCK_SIZE, KV_BLOCKS_AVAILABLE
from sim.costs.simple import ConstantCost, LinearCost
from sim.engine import ChunkedPrefill, ContinuousBatching, SimConfig, StaticBatching, run
from sim.engine.core.request import DECODE, PREFILL


def _knobs(sched, chunk_size):
    """chunk_size belongs to the chunked policy only (other policies refuse it)."""
    return {"chunk_size": chunk_size} if sched == "chunked" else {}


def _df(arrivals, prompts, outputs):
    return pd.DataFrame({"arrival_time": arrivals, "num_prompt_tokens": prompts,
                         "num_output_tokens": outputs})


class Checked:
    """Wraps a policy; after each schedule checks the block-pool invariant and records which
    requests emit a token in each iteration (a brute-force per-token trace)."""

    def __init__(self, policy):
        self.policy = policy
        self.name = policy.name
        self.emitters = []

    def schedule(self, replica, now):
        self.policy.schedule(replica, now)
        batch = replica.batch(detail=True)
        i, bs = replica.iteration, replica.block_size
        in_batch = {rid: new for (new, _), rid in zip(batch.prefills, batch.prefill_ids)}
        held, emit = 0, []
        for r in replica.running.values():
            if r.status == DECODE:
                held += -(-(r.decode_base_tokens + i - r.decode_start) // bs)
                emit.append(r.index)
            else:
                assert r.status == PREFILL
                done = r.num_computed + in_batch.get(r.index, 0)
                held += -(-done // bs)
                if done == r.prefill_target:
                    emit.append(r.index)
        pool = replica.blocks
        assert 0 <= pool.num_free <= pool.num_blocks
        assert held == pool.num_used, (held, pool.num_free)
        assert held == sum(replica.held_blocks(r) for r in replica.running.values())
        assert len(replica.running) <= replica.max_batch_size
        assert batch.num_decode_tokens == sum(r.status == DECODE for r in replica.running.values())
        self.emitters.append(emit)


def _token_times(result, checked):
    end = (result.iterations["start"] + result.iterations["duration"]).to_numpy()
    times = {}
    for it, emit in enumerate(checked.emitters):
        for idx in emit:
            times.setdefault(idx, []).append(end[it])
    return times


workloads = st.lists(st.tuples(st.floats(0, 5), st.integers(1, 120), st.integers(1, 40)),
                     min_size=1, max_size=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads, st.sampled_from(["static", "continuous", "chunked"]), st.integers(4, 40),
       st.integers(1, 8), st.sampled_from([1, 4, 16]))
def test_every_request_once_blocks_within_pool_and_per_token_trace(rows, sched, kv_blocks,
                                                                    max_bs, block_size):
    rows.sort()
    df = _df(*zip(*rows))
    policy = {"static": StaticBatching(), "continuous": ContinuousBatching(),
              "chunked": ChunkedPrefill(16)}[sched]
    checked = Checked(policy)
    cost = LinearCost(base=0.01, per_prefill_token=0.001, per_decode_token=0.002)
    res = run(df, scheduler=checked, cost_model=cost, kv_blocks=kv_blocks, block_size=block_size,
              max_batch_size=max_bs)
    req = res.requests
    assert len(req) == len(df) and list(req["request_id"]) == list(range(len(df)))
    assert set(req["status"]) <= {"finished", "rejected"}
    too_big = -(-(df.num_prompt_tokens + df.num_output_tokens) // block_size) > kv_blocks
    assert (req["status"] == "rejected").tolist() == too_big.tolist()
    assert (req.loc[too_big, "reason"].str.contains("KV blocks")).all()
    assert (res.iterations["kv_blocks_used"] <= kv_blocks).all()
    # per-token brute force: each finished request emits exactly n tokens, the last at finish
    times = _token_times(res, checked)
    itls = []
    for i, r in req.iterrows():
        if r.status != "finished":
            assert i not in times
            continue
        t = times[i]
        assert len(t) == r.num_output_tokens
        assert t[0] == pytest.approx(r.first_token_time) and t[-1] == pytest.approx(r.finish_time)
        itls += list(np.diff(t))
        if r.num_output_tokens > 1:
            assert r.max_itl == pytest.approx(max(np.diff(t)))
    np.testing.assert_allclose(np.sort(res.itl()), np.sort(itls), rtol=1e-12, atol=1e-12)
    if itls:
        np.testing.assert_allclose(res.itl_percentiles([50, 90, 99]),
                                   np.percentile(itls, [50, 90, 99]), rtol=1e-9)
        assert res.summary()["itl_mean"] == pytest.approx(np.mean(itls))
    assert req["num_preemptions"].sum() == res.iterations["num_preemptions"].sum()


def test_one_request_alone_closed_form():
    cost = LinearCost(base=0.005, per_prefill_token=1e-4, per_decode_token=2e-4,
                      per_context_token=1e-6)
    p, n = 1000, 20
    for sched, chunk in [("continuous", 512), ("static", 512), ("chunked", 2048), ("chunked", 256)]:
        res = run(_df([1.0], [p], [n]), scheduler=sched, cost_model=cost, max_batch_size=8,
                  **_knobs(sched, chunk))
        r = res.requests.iloc[0]
        # prefill iterations: chunks of min(chunk, remaining) over the cached prefix
        ttft, done = 0.0, 0
        budget = chunk if sched == "chunked" else p
        while done < p:
            c = min(budget, p - done)
            ttft += 0.005 + 1e-4 * c + 1e-6 * (done + c)
            done += c
        decodes = sum(0.005 + 2e-4 + 1e-6 * (p + j) for j in range(1, n))
        assert r.ttft == pytest.approx(ttft, rel=1e-12)
        assert r.e2e == pytest.approx(ttft + decodes, rel=1e-12)
        assert r.tpot == pytest.approx(decodes / (n - 1))
        assert r.tpot_incl_ttft == pytest.approx((ttft + decodes) / n)
        assert r.queueing_delay == 0 and r.first_scheduled_time == 1.0
        assert len(res.iterations) == -(-p // budget) + n - 1


def test_md1_mean_wait_matches_pollaczek_khinchine():
    rng = np.random.default_rng(2024)
    n, d, rho = 40000, 0.01, 0.7
    lam = rho / d
    arrivals = np.cumsum(rng.exponential(1 / lam, n))
    res = run(_df(arrivals, np.full(n, 8), np.ones(n, dtype=int)), scheduler="continuous",
              cost_model=ConstantCost(d), max_batch_size=1)
    wq = rho * d / (2 * (1 - rho))  # Pollaczek-Khinchine for deterministic service
    measured = res.requests["queueing_delay"].to_numpy()[n // 10:].mean()  # drop warm-up
    assert measured == pytest.approx(wq, rel=0.05)
    assert res.summary()["busy_fraction"] == pytest.approx(rho, rel=0.03)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 25), min_size=1, max_size=25), st.integers(1, 6))
def test_all_at_once_reproduces_step_level_batching(lengths, b):
    df = _df(np.zeros(len(lengths)), np.full(len(lengths), 3), lengths)
    for sched, ref in [("static", simulate_static_batching),
                       ("continuous", simulate_continuous_batching),
                       ("chunked", simulate_continuous_batching)]:
        res = run(df, scheduler=sched, cost_model=ConstantCost(1.0), max_batch_size=b,
                  kv_blocks=10**6, **_knobs(sched, 64))
        expected = ref(lengths, b)
        assert res.requests["finish_time"].tolist() == [float(s) for s in expected.finish_steps]
        assert res.requests["first_token_time"].tolist() == [float(s) for s in expected.start_steps]
        assert len(res.iterations) == expected.steps
        util = (res.iterations["num_running"].sum()) / (b * expected.steps)
        assert util == pytest.approx(expected.utilization)


def test_long_prompt_stalls_decodes_under_continuous_not_chunked():
    cost = LinearCost(base=0.01, per_prefill_token=1e-4, per_decode_token=1e-4)
    n_dec = 8
    arrivals = [0.0] * n_dec + [0.5]
    df = _df(arrivals, [16] * n_dec + [8192], [200] * n_dec + [5])
    itl = {}
    for sched in ("continuous", "chunked"):
        res = run(df, scheduler=sched, cost_model=cost, max_batch_size=16, kv_blocks=10**5,
                  **_knobs(sched, 512))
        itl[sched] = res.requests["max_itl"].iloc[:n_dec].max()
    prefill_whole = 0.01 + 1e-4 * 8192 + 1e-4 * n_dec
    one_budget = 0.01 + 1e-4 * 512
    assert itl["continuous"] == pytest.approx(prefill_whole, rel=0.01)
    assert itl["chunked"] == pytest.approx(one_budget, rel=0.01)
    assert itl["continuous"] > 10 * itl["chunked"]


def test_continuous_token_budget_admits_oversized_first_prompt():
    cost = ConstantCost(1.0)
    df = _df([0, 0, 0], [100, 10, 10], [2, 2, 2])
    res = run(df, scheduler="continuous", token_budget=50, cost_model=cost)
    it = res.iterations
    assert it["num_prefill_tokens"].tolist()[:2] == [100, 20]


@pytest.mark.parametrize("sched", ["static", "continuous", "chunked"])
def test_tight_kv_pool_preempts_and_finishes_everything(sched):
    rng = np.random.default_rng(5)
    n = 300
    df = _df(np.sort(rng.uniform(0, 2, n)), rng.integers(20, 200, n), rng.integers(20, 300, n))
    res = run(df, scheduler=sched, cost_model=LinearCost(0.01, 1e-5, 1e-4), kv_blocks=64,
              max_batch_size=32, **_knobs(sched, 64))
    assert (res.requests["status"] == "finished").all()
    assert res.requests["num_preemptions"].sum() > 0
    assert res.summary()["num_preemptions"] > 0
    assert res.iterations["kv_blocks_used"].max() <= 64


def test_impossible_request_rejected_with_reason_others_finish():
    df = _df([0, 0, 1], [10, 5000, 10], [10, 10, 10])
    res = run(df, cost_model=ConstantCost(0.01), kv_blocks=100)
    assert res.requests["status"].tolist() == ["finished", "rejected", "finished"]
    assert "314 KV blocks" in res.requests["reason"].iloc[1]
    assert np.isnan(res.requests["ttft"].iloc[1])


def test_same_seed_same_result_bit_for_bit():
    rng = np.random.default_rng(9)
    df = _df(np.sort(rng.uniform(0, 5, 500)), rng.integers(1, 800, 500), rng.integers(1, 200, 500))
    a = run(df, kv_blocks=300, seed=3)
    b = run(df, kv_blocks=300, seed=3)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.iterations, b.iterations)
    sa, sb = a.summary(), b.summary()
    sa.pop("wall_seconds"), sb.pop("wall_seconds")
    assert sa == sb


def _count_events(monkeypatch) -> dict:
    """Events put in SimPy's queue, counted in the returned ``{"n": ...}``: SimPy's own
    (``schedule``) and the engine's pre-made ones (``sim.engine.core.events``)."""
    from sim.engine.core import events
    count = {"n": 0}
    original, push = simpy.Environment.schedule, events.heappush

    def counting(self, event, priority=1, delay=0):
        count["n"] += 1
        return original(self, event, priority, delay)

    def counting_push(queue, entry):
        count["n"] += 1
        return push(queue, entry)

    monkeypatch.setattr(simpy.Environment, "schedule", counting)
    monkeypatch.setattr(events, "heappush", counting_push)
    return count


def _simpys_own_events(monkeypatch):
    """The engine's waits as SimPy's own events, never skipping: ``Timeout(delay)`` for a
    sleep, an ``Event`` scheduled at the priority for a wake-up, SimPy's ``run``."""
    from sim.engine.core import events

    def resume(wakeup):
        return lambda _event: wakeup.resume[0](wakeup)

    def sleep(self, delay, wakeup):
        self.timeout(delay).callbacks.append(resume(wakeup))
        return False

    def wake(self, wakeup, delay=0.0, *, priority=events.NORMAL):
        ev = simpy.Event(self)
        ev._ok, ev._value = True, None
        ev.callbacks.append(resume(wakeup))
        self.schedule(ev, priority, delay)

    monkeypatch.setattr(events.Environment, "sleep", sleep)
    monkeypatch.setattr(events.Environment, "wake", wake)
    monkeypatch.setattr(events.Environment, "run", simpy.Environment.run)


def test_one_simpy_event_per_iteration(monkeypatch):
    count = _count_events(monkeypatch)
    df = _df(np.arange(50) * 0.5, np.full(50, 100), np.full(50, 400))
    res = run(df, cost_model=ConstantCost(0.01))
    tokens = int(df.num_output_tokens.sum())
    # iterations + arrivals + process start/stop and wake-ups; never one per token
    assert count["n"] <= len(res.iterations) + 3 * len(df) + 10
    assert len(res.iterations) < tokens / 5


def _frames(res):
    return res.requests, res.iterations


@pytest.mark.parametrize("kw", [
    dict(scheduler="chunked", cost_model=LinearCost(0.004, 2e-5, 1e-4)),
    dict(scheduler="vllm", prefix_caching="block"),
    dict(scheduler="sglang"),
    dict(scheduler="chunked", replicas=3, router="least_outstanding"),
    dict(scheduler="chunked", disaggregation=sim.Disaggregation(prefill_replicas=1,
                                                                decode_replicas=1)),
    dict(scheduler="continuous", closed_loop=ClosedLoop(num_users=4, think_time=0.05)),
])
def test_alone_in_the_environment_the_clock_is_set_not_scheduled(monkeypatch, kw):
    # A replica alone in the environment sets the clock itself (what SimPy's step would do
    # with its timeout the only event), and every other wait is a pre-made event in SimPy's
    # queue (sim.engine.core.events): the same results, bit for bit, as yielding SimPy's own
    # Timeout and Event objects every time (and SimPy's run), and in a saturated open loop
    # no event per iteration.
    rng = np.random.default_rng(5)
    n = 300
    df = _df(np.sort(rng.uniform(0, 3.0, n)), rng.integers(20, 900, n), rng.integers(1, 120, n))
    groups = rng.integers(0, 4, n)  # 4 shared first 512-token blocks, then each its own
    df["hash_ids"] = [[int(g)] + [100 + 2 * i + j for j in range(-(-int(p) // 512) - 1)]
                      for i, (g, p) in enumerate(zip(groups, df.num_prompt_tokens))]
    df.attrs["block_size"] = 512
    kw = dict(model="llama-3.1-8b", gpu="h100", kv_blocks=400, **kw)
    count = _count_events(monkeypatch)
    fast = run(df, **kw)
    skipped = count["n"]
    _simpys_own_events(monkeypatch)
    count["n"] = 0
    slow = run(df, **kw)
    for a, b in zip(_frames(fast), _frames(slow)):
        pd.testing.assert_frame_equal(a, b)
    assert skipped <= count["n"]
    if "replicas" not in kw and "disaggregation" not in kw and "closed_loop" not in kw:
        assert count["n"] >= len(slow.iterations) // 2  # (stretches: one event for many)
        assert skipped <= 5  # its start, its end: nothing per iteration


def test_saturated_replica_runs_without_an_event_per_iteration(monkeypatch):
    count = _count_events(monkeypatch)
    df = _df(np.zeros(200), np.full(200, 700), np.full(200, 30))  # all at once: always waiting
    res = run(df, scheduler="chunked", cost_model=ConstantCost(0.01))
    assert len(res.iterations) > 200
    assert count["n"] <= 3


def test_bad_config_and_workload_errors():
    df = _df([0], [10], [10])
    with pytest.raises(ValueError, match="max_batch_size"):
        run(df, max_batch_size=0)
    with pytest.raises(ValueError, match="chunk_size"):
        run(df, chunk_size=64, max_batch_size=256)
    with pytest.raises(ValueError, match="scheduler"):
        run(df, scheduler="fastest")
    with pytest.raises(ValueError, match="kv_blocks"):
        SimConfig(kv_blocks=-1)
    with pytest.raises(TypeError, match="cost_model"):
        run(df, cost_model=3.0)
    with pytest.raises(ValueError, match="cost model returned"):
        run(df, cost_model=lambda b: -1.0)
    for returned in (None, "0.01", float("nan")):  # one error, never a bare TypeError
        with pytest.raises(ValueError, match=f"^cost model returned {returned!r} seconds for "
                                             f"Batch.*; expected a finite number of seconds"):
            run(df, cost_model=lambda b, returned=returned: returned)
    with pytest.raises(ValueError, match="num_prompt_tokens: row 1"):
        run(_df([0, 1], [5, -2], [1, 1]))
    with pytest.raises(ValueError, match="num_output_tokens: row 0"):
        run(_df([0], [5], [1.5]))
    with pytest.raises(ValueError, match="arrival_time: row 2"):
        run(_df([0, 1, 0.5], [5, 5, 5], [1, 1, 1]))
    with pytest.raises(ValueError, match="arrival_time: row 0"):
        run(_df([np.nan], [5], [1]))
    with pytest.raises(ValueError, match="missing column"):
        run(pd.DataFrame({"arrival_time": [0]}))
    with pytest.raises(TypeError):
        run(42)


@pytest.mark.parametrize("scheduler", ["chunked", "vllm", "sglang"])
def test_kv_blocks_beside_a_utilization_is_refused_not_ignored(scheduler):
    """kv_blocks gives the pool; a utilization beside it would change nothing (before, 0.5 and
    0.9 ran the same pool and the summary recorded the utilization): an error. The resolved
    config of a given pool fills no utilization in."""
    with pytest.raises(ValueError, match=r"^gpu_memory_utilization=0.5 sizes the KV pool, "
                                         r"which kv_blocks=300 gives: set one of them$"):
        SimConfig(scheduler=scheduler, kv_blocks=300, gpu_memory_utilization=0.5)
    cfg = SimConfig(scheduler=scheduler, kv_blocks=300).resolved()
    assert (cfg.kv_blocks, cfg.gpu_memory_utilization) == (300, None)
    resolved = SimConfig(scheduler=scheduler, model="llama-3.1-8b").resolved()
    assert resolved.gpu_memory_utilization == (None if scheduler == "sglang" else 0.9)
    # an override of the pool's size replaces the config's way of sizing it: a run's resolved
    # config (its utilization filled in) with kv_blocks, in run's keywords and in a sweep
    df = _df([0, 0.1], [40, 50], [3, 4])
    res = run(df, resolved, kv_blocks=300, cost_model=ConstantCost(0.01))
    assert res.kv_blocks == 300 and res.config.gpu_memory_utilization is None
    table = sim.sweep(df, {"kv_blocks": [300, 400]}, base=resolved, workers=1, progress=False)
    assert table["error"].tolist() == ["", ""] and table["kv_blocks"].tolist() == [300, 400]
    if scheduler != "sglang":  # (its pool: mem_fraction_static, no utilization filled in)
        with pytest.raises(ValueError, match="sizes the KV pool, which kv_blocks=300 gives"):
            dataclasses.replace(resolved, kv_blocks=300)  # (replace itself: both set)


@pytest.mark.parametrize("scheduler, knob", [("chunked", "gpu_memory_utilization"),
                                             ("vllm", "gpu_memory_utilization"),
                                             ("tensorrt-llm", "free_gpu_memory_fraction")])
def test_a_memory_fraction_without_a_model_sizes_the_default_models_pool(scheduler, knob):
    """(review9) Without model or gpu the pool was the cheat sheet's 1,800 blocks whatever the
    fraction: SimConfig(gpu_memory_utilization=0.5) and 0.9 ran the same pool (a sweep over it
    gave identical points). A fraction given sizes the pool from the budget of the default
    model on the default GPU, as sim run (whose --model defaults to it) does; the cheat
    sheet's pool records no fraction (none is read)."""
    sizes = {}
    for f in (0.5, 0.9):
        cfg = SimConfig(scheduler=scheduler, **{knob: f})
        sizes[f] = cfg.resolved_kv_blocks()
        assert sizes[f] == SimConfig(scheduler=scheduler, model="llama-3.1-8b", gpu="h100",
                                     **{knob: f}).resolved_kv_blocks()
        assert getattr(cfg.resolved(), knob) == f
        assert cfg.resolved().resolved_kv_blocks() == sizes[f]
    assert sizes[0.5] < sizes[0.9] / 1.5
    cheat = SimConfig(scheduler=scheduler, cost_model=ConstantCost(0.01)).resolved()
    assert (cheat.gpu_memory_utilization, cheat.free_gpu_memory_fraction) == (None, None)
    assert cheat.resolved_kv_blocks() == KV_BLOCKS_AVAILABLE * KV_BLOCK_SIZE // cheat.block_size


def test_records_input_and_user_callable_cost():
    recs = [{"arrival_time": 0.0, "num_prompt_tokens": 4, "num_output_tokens": 3,
             "request_id": "a"},
            {"arrival_time": 0.1, "num_prompt_tokens": 4, "num_output_tokens": 1,
             "request_id": "b"}]
    seen = []

    class Cost:
        needs_decode_lengths = True  # items() lists each decode's context

        def __call__(self, batch):
            seen.append(batch.items())
            return 0.5

    cost = Cost()

    res = run(recs, cost_model=cost)
    assert res.requests["request_id"].tolist() == ["a", "b"]
    assert seen[0] == [(4, 4)]
    assert seen[1] == [(4, 4), (1, 5)]  # b's prefill beside a's first decode (context 5)


def test_summary_slo_attainment_and_goodput():
    df = _df([0, 0, 0, 0], [10, 10, 10, 10], [5, 5, 5, 5])
    res = run(df, scheduler="static", cost_model=ConstantCost(1.0), max_batch_size=2)
    s = res.summary(slo={"ttft": 2.0})
    # batch 1 TTFT 1 s, batch 2 TTFT 6 s
    assert s["slo_attainment"] == 0.5
    assert s["goodput"] == pytest.approx(2 / 10)
    s = res.summary(slo={"ttft": 10, "e2e": 5.0, "itl": 1.0})
    assert s["slo_attainment"] == 0.5
    assert s["request_throughput"] == pytest.approx(0.4)
    assert s["output_token_throughput"] == pytest.approx(2.0)
    assert s["slot_utilization"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="slo"):
        res.summary(slo={"latency": 1})
    for key in ("ttft", "itl", "tpot", "e2e"):
        for q in ("mean", "p50", "p90", "p95", "p99"):
            assert f"{key}_{q}" in s


def test_default_config_runs_with_roofline_and_memory_budget():
    df = _df([0, 0.1], [500, 800], [50, 60])
    res = run(df, model="llama-3.1-8b", gpu="h100")
    h100 = sim.get_gpu("h100").memory_gb  # what the device reports (81,559 MiB)
    assert res.kv_blocks == sim.memory_budget("llama-3.1-8b", h100).kv_blocks
    assert res.cost_model_name == "roofline"
    assert (res.requests["status"] == "finished").all()
    with pytest.raises(ValueError, match="does not fit"):
        run(df, model="llama-3.1-70b", gpu="a100")


def test_model_or_gpu_alone_sizes_the_pool_with_the_others_default():
    df = _df([0.0], [10], [5])
    assert run(df, gpu="a100").kv_blocks == sim.memory_budget(
        "llama-3.1-8b", sim.get_gpu("a100").memory_gb).kv_blocks
    with pytest.raises(ValueError, match="llama-3.1-70b.*h100.*does not fit"):
        run(df, model="llama-3.1-70b")  # a 70B model on one (default) H100
    user = ConstantCost(0.01)  # a user cost model and no model or GPU: the cheat sheet's pool
    assert run(df, cost_model=user).kv_blocks == sim.KV_BLOCKS_AVAILABLE
    assert SimConfig(gpu="a100").resolved_cost_model().model.name == "llama-3.1-8b"


@pytest.mark.parametrize("field", ["model", "gpu"])
def test_an_empty_model_or_gpu_name_is_an_error_not_the_default(field):
    with pytest.raises(ValueError, match=f"^{field} must be a preset name, got ''"):
        SimConfig(**{field: ""})


@pytest.mark.parametrize("kw", [
    dict(),
    dict(replicas=3, router="least_outstanding"),
    dict(disaggregation=sim.Disaggregation(prefill_replicas=2, decode_replicas=1)),
    dict(disaggregation=sim.Disaggregation(prefill_replicas=1, decode_replicas=1),
         closed_loop=ClosedLoop(num_users=4, think_time=0.05)),
])
def test_no_replica_outlives_its_run_without_the_cyclic_collector(monkeypatch, kw):
    # Every process, dispatcher, retry and landing event is closed or dropped when the run
    # ends: no reference cycle keeps a replica (and its requests) alive until a collection.
    import gc
    import weakref
    import sim.engine.fleet.cluster as cluster  # (where new_replica builds every replica)
    from sim.engine.core.replica import Replica
    made = []

    class Recording(Replica):  # (a compiled Replica's type is immutable: a subclass records)
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(weakref.ref(self))

    monkeypatch.setattr(cluster, "Replica", Recording)
    rng = np.random.default_rng(2)
    df = _df(np.sort(rng.uniform(0, 1.0, 60)), rng.integers(20, 600, 60), rng.integers(1, 60, 60))
    was = gc.isenabled()
    gc.disable()
    try:
        res = run(df, model="llama-3.1-8b", gpu="h100", scheduler="chunked", **kw)
        assert made and not [w for w in made if w() is not None]
    finally:
        if was:
            gc.enable()
    assert (res.requests["status"] == "finished").all()


def test_a_replica_loop_starts_and_wakes_where_simpy_would():
    # env.process(gen) schedules its start URGENT at now, Event.succeed() NORMAL at now: the
    # replica loop's own start and wake-up events go to the same places (a NORMAL start would
    # run after the NORMAL events of its instant).
    from array import array
    from sim.engine.core import events, process
    from sim.engine.fleet.cluster import new_replica
    from sim.engine.schedulers import resolve
    config, policy = resolve(SimConfig(cost_model=ConstantCost(0.01), kv_blocks=100))
    env = events.Environment()
    env.timeout(0.0)  # a NORMAL event of the instant, scheduled first
    proc = process.ReplicaProcess(env, new_replica(config, policy, 100), policy,
                                 config.resolved_cost_model(), array("d"), False, 0)
    proc.start()
    env.process(x for x in ())
    started, simpys, normal = sorted(env._queue)
    assert (started[3], simpys[3].__class__.__name__) == (proc._wakeup, "Initialize")
    assert started[:2] == simpys[:2] == (0, events.URGENT) and normal[1] == events.NORMAL
    env.run()  # (the loop runs: nothing queued, it waits for work)
    assert proc.idle and not env._queue
    proc.wake()
    proc.wake()  # (once: already woken)
    assert [entry[:2] for entry in env._queue] == [(0, events.NORMAL)]  # Event.succeed()'s
    proc.close()


def test_the_api_sizes_the_pool_as_sim_run_does():
    """(issue 32, item 1) sim.run(df) priced Llama-3.1-8B on an H100 (the roofline's defaults)
    but sized the pool with the cheat sheet's 1,800 blocks instead of the 28,343 sim run gives
    the same model and GPU; tensor_parallel=2 without a model halved the cost and kept the
    pool. One default now: the memory budget of the default model on the default GPU; the
    cheat sheet's pool only for a user cost model with no model or GPU in play, and said."""
    df = _df([0.0, 0.1], [500, 800], [50, 60])
    h100 = sim.get_gpu("h100").memory_gb
    s = run(df).summary()
    assert s["kv_blocks"] == sim.memory_budget("llama-3.1-8b", h100).kv_blocks
    assert (s["kv_tokens"], s["kv_pool"]) == (s["kv_blocks"] * 16, "memory budget")
    tp2 = run(df, tensor_parallel=2).kv_blocks
    assert tp2 == sim.memory_budget("llama-3.1-8b", h100, tensor_parallel=2).kv_blocks > s[
        "kv_blocks"]
    user = run(df, cost_model=ConstantCost(0.01)).summary()
    assert (user["kv_blocks"], user["kv_pool"]) == (sim.KV_BLOCKS_AVAILABLE, "cheat sheet")
    assert run(df, cost_model=ConstantCost(0.01), tensor_parallel=2).kv_blocks == tp2


@pytest.mark.parametrize("scheduler, block_size", [("chunked", 16), ("sglang", 1),
                                                   ("tensorrt-llm", 32)])
def test_kv_tokens_gives_every_preset_the_same_memory(scheduler, block_size):
    """(issue 32, item 2) --kv-blocks N is N x 16 tokens under chunked, N x 1 under sglang and
    N x 32 under tensorrt-llm; kv_tokens is the same memory under each, and one of the two."""
    df = _df([0.0], [100], [5])
    s = run(df, scheduler=scheduler, kv_tokens=32_000).summary()
    assert (s["kv_blocks"], s["kv_tokens"], s["kv_pool"]) == (32_000 // block_size, 32_000,
                                                              "kv_tokens")
    with pytest.raises(ValueError, match="kv_tokens=32000 sizes the KV pool, which kv_blocks"):
        SimConfig(kv_blocks=100, kv_tokens=32_000)
    with pytest.raises(ValueError, match="gpu_memory_utilization=0.5 sizes the KV pool, which "
                                         "kv_tokens"):
        SimConfig(kv_tokens=32_000, gpu_memory_utilization=0.5)
    with pytest.raises(ValueError, match="kv_tokens=8 is less than one block of block_size=16"):
        SimConfig(kv_tokens=8, block_size=16).resolved_kv_blocks()
