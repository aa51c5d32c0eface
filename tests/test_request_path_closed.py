"""``request_path`` in a closed loop (``sim.engine.fleet.clients`` with
``request_path.ClosedPath``): a user issues, the request passes in_s and the one FIFO tokeniser,
the engine receives it; the user sees the end out_s after the engine and issues its next then."""

import numpy as np
import pandas as pd
import pytest

import sim
import workloads as wl
from sim import RequestPath

GPU = dict(model="llama-3.1-8b", gpu="h100")
PATH = RequestPath(in_s=0.002, per_prompt_token_s=5e-6, out_s=0.003)
DISAGG = sim.Disaggregation(prefill_replicas=1, decode_replicas=1)


def _workload(n=60, seed=0):
    return wl.synthetic(n, rate=20.0, prompt=wl.LogNormal(400, 1.0, max_tokens=3000),
                        output=wl.LogNormal(40, 1.0, max_tokens=200), seed=seed)


def _conversations(n=40, seed=1):
    df = _workload(n, seed)
    return df.assign(session_id=np.arange(n) // 4, turn=np.arange(n) % 4)


def _same(a, b):
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.iterations, b.iterations, check_exact=True)
    sa, sb = a.summary(), b.summary()
    sa.pop("wall_seconds"), sb.pop("wall_seconds")
    assert str(sa) == str(sb)


CASES = {
    "one": dict(scheduler="chunked", closed_loop=wl.ClosedLoop(4, 0.05)),
    "paced": dict(scheduler="chunked", closed_loop=wl.MaxConcurrency(3)),
    "sglang": dict(scheduler="sglang", closed_loop=wl.ClosedLoop(5)),
    "cluster": dict(scheduler="chunked", replicas=2, router="least_outstanding",
                    closed_loop=wl.ClosedLoop(6, 0.01)),
    "disaggregated": dict(scheduler="chunked", disaggregation=DISAGG,
                          closed_loop=wl.ClosedLoop(4)),
}


@pytest.mark.parametrize("kw", CASES.values(), ids=CASES.keys())
def test_a_zero_path_is_no_path_bit_for_bit(kw):
    for df in (_workload(50), _conversations(24)):
        off = sim.run(df, **GPU, **kw)
        _same(off, sim.run(df, request_path=RequestPath(), **GPU, **kw))


@pytest.mark.parametrize("think", [0.0, 0.04])
def test_one_user_each_request_takes_the_path_longer_closed_form(think):
    """One user: the engine serves the same requests one at a time, so each request's e2e and
    TTFT grow by exactly in + tokenising its prompt + out, and each later request is issued
    that much later per request before it (the run lasts the sum of them longer)."""
    df = _workload(12)
    loop = wl.ClosedLoop(1, think)
    off = sim.run(df, closed_loop=loop, scheduler="chunked", **GPU, check=True).requests
    on = sim.run(df, closed_loop=loop, request_path=PATH, scheduler="chunked", **GPU,
                 check=True).requests
    extra = PATH.in_s + PATH.per_prompt_token_s * df["num_prompt_tokens"].to_numpy() + PATH.out_s
    np.testing.assert_allclose(on["e2e"], off["e2e"] + extra, rtol=0, atol=1e-12)
    np.testing.assert_allclose(on["ttft"], off["ttft"] + extra, rtol=0, atol=1e-12)
    np.testing.assert_allclose(on["tpot"], off["tpot"], rtol=0, atol=1e-12)
    before = np.concatenate([[0.0], np.cumsum(extra)[:-1]])
    np.testing.assert_allclose(on["arrival_time"], off["arrival_time"] + before, rtol=0,
                               atol=1e-12)
    np.testing.assert_allclose(on["engine_arrival_time"] - on["arrival_time"],
                               extra - PATH.out_s, rtol=0, atol=1e-12)
    assert on["finish_time"].max() == pytest.approx(off["finish_time"].max() + extra.sum(),
                                                    abs=1e-12)
    # the user issues on the finish it sees (the engine's + out_s), plus its think time
    np.testing.assert_allclose(on["arrival_time"].to_numpy()[1:],
                               on["finish_time"].to_numpy()[:-1] + think, rtol=0, atol=1e-12)


def test_users_issuing_together_queue_at_the_tokeniser_closed_form():
    """N users issue at t = 0, a tokeniser only: the engine receives the first N requests
    at the cumulative sums of their service times, in issue (workload) order."""
    n = 8
    df = _workload(3 * n)
    res = sim.run(df, closed_loop=wl.ClosedLoop(n), scheduler="chunked", check=True,
                  request_path=RequestPath(per_prompt_token_s=2e-5), **GPU).requests
    service = 2e-5 * df["num_prompt_tokens"].to_numpy()[:n]
    np.testing.assert_array_equal(res["arrival_time"].to_numpy()[:n], np.zeros(n))
    np.testing.assert_allclose(res["engine_arrival_time"].to_numpy()[:n], np.cumsum(service),
                               rtol=0, atol=1e-15)
    later = res.iloc[n:]  # issued at finishes: never before the tokeniser could take them
    assert (later["engine_arrival_time"] >= later["arrival_time"]
            + 2e-5 * later["num_prompt_tokens"] - 1e-12).all()


def test_the_engine_runs_the_arrivals_it_received():
    """The engine's iterations are those of an open loop of the engine arrival times the
    closed loop made; the client's tokens are the engine's plus out_s."""
    df = _workload(50)
    seen = sim.run(df, closed_loop=wl.ClosedLoop(4), request_path=PATH, scheduler="chunked",
                   **GPU)
    req = seen.requests
    engine = sim.run(df.assign(arrival_time=req["engine_arrival_time"].to_numpy()),
                     scheduler="chunked", **GPU)
    pd.testing.assert_frame_equal(seen.iterations, engine.iterations, check_exact=True)
    eng = engine.requests
    np.testing.assert_array_equal(req["finish_time"], eng["finish_time"] + PATH.out_s)
    np.testing.assert_array_equal(req["first_token_time"], eng["first_token_time"] + PATH.out_s)
    np.testing.assert_array_equal(req["queueing_delay"], eng["queueing_delay"])


@pytest.mark.parametrize("kw", CASES.values(), ids=CASES.keys())
def test_nothing_lost_rejections_seen_late(kw):
    """Every request comes out once under check=True (too-long prompts rejected, their
    conversations' later turns abandoned); at most num_users out at once as the client counts
    them (issue to the end it sees)."""
    df = _conversations(32)
    df.loc[[5, 17], "num_prompt_tokens"] = 9000  # over max_model_len 8192: rejected
    res = sim.run(df, request_path=PATH, max_model_len=8192, check=True, **GPU, **kw).requests
    off = sim.run(df, max_model_len=8192, **GPU, **kw).requests
    assert len(res) == len(df) and res["request_id"].is_unique
    assert (res["status"] == "rejected").sum() == (off["status"] == "rejected").sum() > 2
    done = res[res["status"] == "finished"]
    assert (done["engine_arrival_time"] >= done["arrival_time"] + PATH.in_s).all()
    users = kw["closed_loop"].num_users
    events = sorted([(t, 1) for t in done["arrival_time"]]
                    + [(t, -1) for t in done["finish_time"]])
    assert max(np.cumsum([d for _, d in events])) <= users


def test_a_rejection_is_seen_out_s_later():
    """One user, the second request rejected by the engine when it receives it: the third
    is issued out_s (+ think) after that."""
    df = _workload(4)
    df.loc[1, "num_prompt_tokens"] = 9000
    think = 0.01
    res = sim.run(df, closed_loop=wl.ClosedLoop(1, think), request_path=PATH, check=True,
                  max_model_len=8192, scheduler="chunked", **GPU).requests
    assert res["status"].tolist() == ["finished", "rejected", "finished", "finished"]
    e = res["engine_arrival_time"][1]
    assert res["arrival_time"][2] == pytest.approx(e + PATH.out_s + think, abs=1e-12)


def test_engine_overheads_lag_adds_to_the_path():
    """With the fitted engine overheads' per-request time the user issues after the finish
    it sees: engine finish + out_s + per_request_s (+ think)."""
    df = _workload(6)
    res = sim.run(df, closed_loop=wl.ClosedLoop(1), request_path=PATH, scheduler="sglang",
                  engine_overheads="fitted", check=True, **GPU)
    req = res.requests
    np.testing.assert_allclose(req["arrival_time"].to_numpy()[1:],
                               req["finish_time"].to_numpy()[:-1], rtol=0, atol=1e-12)
    assert res.summary()["engine_overhead_per_request_s"] > 0


@pytest.mark.parametrize("join", [True, False])
def test_agentic_sessions_wait_for_the_client_view(join):
    """Sub-agents and joins (fleet.sessions) with a path: every turn issued no sooner than
    its gap after the finish the client saw of the turn before (and of the sub-agent sessions
    it joins); nothing lost; a zero path is no path there too."""
    import test_agentic as ta
    df = wl.agentic(4, turns=wl.Uniform(1, 4), tool_gap=wl.Exponential(0.2), fan_out=2,
                    sub_turns=wl.Uniform(1, 3), join=join, new_tokens=wl.Uniform(20, 200),
                    output=wl.Uniform(2, 40), system_prompt_tokens=32, seed=5)
    res = ta._run(df, users=2, request_path=RequestPath(0.01, 1e-5, 0.02))
    req = res.requests
    assert len(req) == len(df) and (req["status"] == "finished").all()
    ta._check_order(df, req, join)
    off = ta._run(df, users=2)
    _same(off, ta._run(df, users=2, request_path=RequestPath()))
    # the path made each turn later than without it (the users wait for out_s and the rest)
    assert req["arrival_time"].max() > off.requests["arrival_time"].max()
