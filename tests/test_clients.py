"""Closed-loop clients (sim.engine.fleet.clients): a conversation's turns are issued by one user, in
order, each after the previous turn finished; a rejected turn ends its conversation (the rest
come out abandoned at once); without conversations, workload order."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import workloads as wl
from sim.costs.simple import LinearCost
from sim.engine import Disaggregation, run
from sim.engine.fleet.clients import conversations

COST = LinearCost(0.002, 1e-5, 1e-4, 0.0)


def _conversations(n, seed=0):
    return wl.multi_turn(n, turns=wl.Uniform(1, 5), user_tokens=wl.Uniform(20, 200),
                         output=wl.Uniform(2, 40), rate=50.0, think_time=0.1,
                         system_prompt_tokens=64, seed=seed)


def _check_turns(df, req, think):
    """Each turn issued at or after its previous turn's finish + think time, by one user."""
    out = req.assign(session_id=df["session_id"].to_numpy(), turn=df["turn"].to_numpy())
    for _, g in out.groupby("session_id"):
        g = g.sort_values("turn")
        prev_end = g["finish_time"].to_numpy()[:-1]
        assert (g["arrival_time"].to_numpy()[1:] >= prev_end + think - 1e-12).all(), g
        assert (g["status"] == "finished").all()


def test_conversations_group_by_session_in_order_of_first_turns():
    df = pd.DataFrame({"session_id": ["b", "a", "b", np.nan, "a"]})
    reqs = list("01234")
    assert conversations(df, reqs) == [["0", "2"], ["1", "4"], ["3"]]
    assert conversations(df.drop(columns="session_id"), reqs) is None


def test_a_turn_column_orders_a_conversations_turns():
    # (review9: turns followed workload order, the turn column unread) a file whose rows are
    # not in turn order within a session: the turns go out in turn order, ties as written
    from types import SimpleNamespace
    df = pd.DataFrame({"session_id": ["a", "b", "a", "a", "b"], "turn": [2, 0, 0, 1, 0]})
    reqs = [SimpleNamespace(index=i) for i in range(5)]
    got = [[r.index for r in c] for c in conversations(df, reqs)]
    assert got == [[2, 3, 0], [1, 4]]
    gaps = df.assign(turn=[2, 0, None, 1, 0])  # a turn missing: workload order
    assert [[r.index for r in c] for c in conversations(gaps, reqs)] == [[0, 2, 3], [1, 4]]


@pytest.mark.parametrize("dtype", ["Int64", "string", "category", object])
def test_missing_session_ids_of_any_dtype_are_conversations_of_their_own(dtype):
    # (review9) a nullable column (Int64, string: pd.NA) raised "boolean value of NA is
    # ambiguous" from the NaN test (s != s)
    ids = [1, 2, None, 1, None] if dtype == "Int64" else ["b", "a", None, "b", None]
    df = pd.DataFrame({"session_id": pd.Series(ids, dtype=dtype)})
    assert conversations(df, list("01234")) == [["0", "3"], ["1"], ["2"], ["4"]]


def test_an_unhashable_session_id_is_an_error_naming_the_column_and_row():
    # (review9) a list as an id raised "unhashable type: 'list'" from inside the run
    df = pd.DataFrame({"arrival_time": [0.0, 0.0], "num_prompt_tokens": 8,
                       "num_output_tokens": 2, "session_id": [1, [2]]})
    with pytest.raises(TypeError, match=r"^workload column session_id: row 1 holds \[2\], "
                                        r"not an id"):
        run(df, cost_model=COST, closed_loop=wl.ClosedLoop(2))


@pytest.mark.parametrize("think", [0.0, 0.05])
def test_a_turn_waits_for_the_previous_turns_answer(think):
    # before: users took requests in workload order, so with 8 users turn 2 of a conversation
    # was issued while turn 1 still ran (its answer, in turn 2's prompt, not yet written)
    df = _conversations(60)
    res = run(df, cost_model=COST, closed_loop=wl.ClosedLoop(8, think), check=True)
    _check_turns(df, res.requests, think)
    assert len(res.requests) == len(df)


def test_each_user_holds_one_conversation_at_a_time():
    df = _conversations(40, seed=3)
    res = run(df, cost_model=COST, closed_loop=wl.ClosedLoop(4), check=True).requests
    # at most 4 requests out at once (finish times and issue times on one clock)
    events = sorted([(t, 1) for t in res["arrival_time"]] + [(t, -1) for t in res["finish_time"]],
                    key=lambda e: (e[0], e[1]))
    out = np.cumsum([d for _, d in events])
    assert out.max() <= 4
    # one user, one conversation after another, turns in order: the issue order is the
    # conversations' order, each conversation's turns together
    one = run(df, cost_model=COST, closed_loop=wl.ClosedLoop(1)).requests
    order = df.loc[one.sort_values("arrival_time").index, ["session_id", "turn"]]
    firsts = df.drop_duplicates("session_id")["session_id"].tolist()
    assert order["session_id"].drop_duplicates().tolist() == firsts
    assert order.groupby("session_id", sort=False)["turn"].apply(
        lambda t: t.is_monotonic_increasing).all()
    assert (order["session_id"] != order["session_id"].shift()).sum() == len(firsts)


def _expected_statuses(df, limit):
    """By hand from the workload: in each conversation (turn order), the turns before the
    first one over ``limit`` finish, that one is rejected for its length, the rest are
    abandoned (vLLM's multi-turn client drops a conversation whose request failed)."""
    want = pd.Series("finished", index=df.index)
    over = df["num_prompt_tokens"] + df["num_output_tokens"] > limit
    for _, g in df.sort_values("turn", kind="stable").groupby("session_id", sort=False):
        hit = over[g.index].to_numpy().nonzero()[0]
        if len(hit):
            want[g.index[hit[0]]] = "context_length"
            want[g.index[hit[0] + 1:]] = "conversation_abandoned"
    return want


def _kinds(req):
    return req["reason"].str.split(":").str[0].where(req["status"] == "rejected", "finished")


def test_a_rejected_turn_ends_its_conversation():
    # before: the user went on sending the conversation's later turns, each after a think
    # time, each rejected too (its prompt holds the rejected one's)
    df = _conversations(30, seed=5)
    limit = int(df["num_prompt_tokens"].quantile(0.6)) + 50
    res = run(df, cost_model=COST, closed_loop=wl.ClosedLoop(3, 0.05), max_model_len=limit,
              check=True)
    req = res.requests
    want = _expected_statuses(df, limit)
    assert (want == "conversation_abandoned").sum() >= 5  # (the case is exercised)
    assert _kinds(req).tolist() == want.tolist()
    s = res.summary()
    assert (s["num_rejected"], s["num_rejected_context_length"],
            s["num_rejected_conversation_abandoned"]) == (
        (want != "finished").sum(), (want == "context_length").sum(),
        (want == "conversation_abandoned").sum())
    assert res.abandoned().tolist() == (want == "conversation_abandoned").tolist()
    # each abandoned turn names the rejected turn of its conversation and comes out at the
    # moment it was rejected
    gone = req[res.abandoned()]
    cause = gone["reason"].str.extract(r"\(request (\d+)\)")[0].astype(int)
    assert (df.loc[gone.index, "session_id"].to_numpy()
            == df.loc[cause.to_numpy(), "session_id"].to_numpy()).all()
    assert (gone["arrival_time"].to_numpy()
            == req.loc[cause.to_numpy(), "arrival_time"].to_numpy()).all()
    codes = [f.code for f in res.diagnose()]
    assert "conversation_abandoned" in codes and "rejected" not in codes  # not the KV pool's
    from sim.cli.run import format_summary
    assert (f"({s['num_rejected_context_length']} over max_model_len, "
            f"{s['num_rejected_conversation_abandoned']} turns of abandoned conversations)"
            in format_summary(s))


@pytest.mark.parametrize("think", [0.0, 0.5])
def test_after_a_rejected_turn_the_user_starts_its_next_conversation(think):
    # one user, conversation a: 100 tokens, then 9,000 (over the model's 4,096), then two
    # more turns; conversation b: one turn. b starts one think time after the rejection
    # (as after any request), the abandoned turns taking none of the user's time
    df = pd.DataFrame({"arrival_time": 0.0, "num_prompt_tokens": [100, 9000, 9100, 9200, 50],
                       "num_output_tokens": 10, "session_id": ["a"] * 4 + ["b"],
                       "turn": [0, 1, 2, 3, 0]})
    res = run(df, model="llama-2-7b", cost_model=COST, kv_blocks=4000,
              closed_loop=wl.ClosedLoop(1, think), check=True)
    req = res.requests
    assert _kinds(req).tolist() == ["finished", "context_length", "conversation_abandoned",
                                    "conversation_abandoned", "finished"]
    rejected_at = req["finish_time"][0] + think  # turn 1 issued, rejected at once
    assert req["arrival_time"][1] == rejected_at
    assert (req["arrival_time"][2:4] == rejected_at).all()
    assert req["arrival_time"][4] == rejected_at + think  # (before: rejected_at + 3 think)
    assert req["reason"][2] == ("conversation_abandoned: an earlier turn of its conversation "
                                "(request 1) was rejected")


def test_without_sessions_the_order_is_the_workloads():
    df = _conversations(30, seed=1)
    plain = df.drop(columns=["session_id"])
    a = run(plain, cost_model=COST, closed_loop=wl.ClosedLoop(1)).requests
    assert a["arrival_time"].is_monotonic_increasing  # one user: the workload's order


@pytest.mark.parametrize("setup", [dict(replicas=3, router="least_outstanding"),
                                   dict(disaggregation=Disaggregation(2, 1))])
def test_clusters_and_pools_keep_conversations_in_order_too(setup):
    df = _conversations(40, seed=2)
    res = run(df, cost_model=COST, closed_loop=wl.ClosedLoop(6, 0.02), **setup)
    _check_turns(df, res.requests, 0.02)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 25), users=st.integers(1, 12), think=st.sampled_from([0.0, 0.01]),
       seed=st.integers(0, 50))
def test_every_turn_comes_out_once_in_order(n, users, think, seed):
    df = _conversations(n, seed=seed)
    res = run(df, cost_model=COST, closed_loop=wl.ClosedLoop(users, think), check=True)
    assert len(res.requests) == len(df) and res.requests["request_id"].is_unique
    _check_turns(df, res.requests, think)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 20), users=st.integers(1, 8), think=st.sampled_from([0.0, 0.01]),
       seed=st.integers(0, 50), quantile=st.floats(0.0, 1.0),
       layout=st.sampled_from([{}, dict(replicas=2, router="round_robin"),
                               dict(disaggregation=Disaggregation(1, 1))]))
def test_every_turn_comes_out_once_and_a_rejection_ends_its_conversation(
        n, users, think, seed, quantile, layout):
    """Nothing lost with rejections on one replica, a cluster and pools: every turn comes out
    once, as the workload alone says (finished, rejected for its length, or abandoned after
    an earlier turn's rejection), the turns issued in order after their answers."""
    df = _conversations(n, seed=seed)
    limit = int(df["num_prompt_tokens"].quantile(quantile)) + 20
    res = run(df, cost_model=COST, closed_loop=wl.ClosedLoop(users, think),
              max_model_len=limit, check=True, **layout)
    req = res.requests
    assert len(req) == len(df) and req["request_id"].is_unique
    assert _kinds(req).tolist() == _expected_statuses(df, limit).tolist()
    gone = res.abandoned()
    assert (req.loc[gone, "replica"] == (-1 if layout else 0)).all()  # never routed
    if "prefill_replica" in req:
        assert (req.loc[gone, "prefill_replica"] == -1).all()
    sent = df.assign(abandoned=res.abandoned())
    sent = sent[~sent["abandoned"]]
    done = req.loc[sent.index]
    _check_turns(sent[done["status"] == "finished"], done[done["status"] == "finished"], think)
