"""sim/engine/core/request.py: the request record and its state machine.

Through ``sim.run``, every request follows the module's diagram (WAITING -> PREFILL -> DECODE ->
FINISHED, preemption back to WAITING, REJECTED only on arrival) and reaches exactly one terminal
status exactly once; a rejected one says why.
"""

import numpy as np
import pandas as pd
import pytest

import sim
import sim.engine.core.columns as columns
from sim import native
from sim.engine.core import request as request_module
from sim.engine.core.request import (DECODE, FINISHED, PREFILL, REJECTED, STATUS_NAMES, WAITING,
                                Request)


def test_status_constants_and_names():
    assert (WAITING, PREFILL, DECODE, FINISHED, REJECTED) == (0, 1, 2, 3, 4)
    assert STATUS_NAMES == ("waiting", "prefill", "decode", "finished", "rejected")
    for code, name in enumerate(STATUS_NAMES):
        assert getattr(request_module, name.upper()) == code


def test_initial_state():
    r = Request(3, "req-3", 1.5, 100, 20)
    assert (r.index, r.request_id, r.arrival_time) == (3, "req-3", 1.5)
    assert (r.num_prompt_tokens, r.num_output_tokens) == (100, 20)
    assert r.status == WAITING and not r.is_finished
    assert r.num_generated == r.num_computed == r.num_preemptions == 0
    assert r.prefill_target == 100  # the prompt, until a preemption adds generated tokens
    assert r.decode_start == r.block_phase == r.finish_iteration == r.scheduled_iteration == -1
    assert r.decode_base_tokens == r.decode_base_generated == 0
    assert r.first_scheduled_time is None and r.first_token_time is None
    assert r.finish_time is None
    assert r.reason == "" and r.segments == []


def test_segments_are_not_shared_between_requests():
    a, b = Request(0, 0, 0.0, 1, 1), Request(1, 1, 0.0, 1, 1)
    a.segments.append((0, 3))
    assert b.segments == []


@pytest.mark.parametrize("status, finished", [(WAITING, False), (PREFILL, False),
                                              (DECODE, False), (FINISHED, True),
                                              (REJECTED, True)])
def test_is_finished_means_terminal(status, finished):
    r = Request(0, 0, 0.0, 10, 2)
    r.status = status
    assert r.is_finished is finished


@pytest.mark.parametrize("status", range(5))
def test_repr_names_id_status_and_lengths(status):
    r = Request(7, "abc", 0.0, 12, 34)
    r.status = status
    assert repr(r) == f"Request('abc', {STATUS_NAMES[status]}, prompt=12, output=34)"
    assert repr(Request(0, 5, 0.0, 1, 2)) == "Request(5, waiting, prompt=1, output=2)"


def test_slots_only():
    r = Request(0, 0, 0.0, 10, 2)
    assert not hasattr(r, "__dict__")
    with pytest.raises(AttributeError):
        r.colour = "red"
    assert "status" in Request.__slots__ and len(set(Request.__slots__)) == len(Request.__slots__)
    # every slot is set by __init__: nothing reads an unset attribute later
    for name in Request.__slots__:
        getattr(r, name)


# -- through the engine ---------------------------------------------------------------------------
ALLOWED = {  # the module docstring's diagram
    WAITING: {PREFILL, REJECTED},
    PREFILL: {DECODE, FINISHED, WAITING},  # FINISHED: a one-token output ends at its prefill
    DECODE: {FINISHED, WAITING},
    FINISHED: set(),
    REJECTED: set(),
}


def traced_run(monkeypatch, df, **config):
    """``sim.run`` with requests that log every status they are given. Interpreted only: the
    compiled engine writes a request's status into its C layout, past any ``__setattr__``;
    .ci/run runs this file again with SIM_PURE_PYTHON=1, where these tests run."""
    if native.status()["sim.engine.core.request"] == "compiled":
        pytest.skip("traces status writes through __setattr__: the interpreted engine only "
                    "(.ci/run's SIM_PURE_PYTHON=1 pass runs it)")
    history = {}

    class Traced(Request):
        __slots__ = ()

        def __setattr__(self, name, value):
            if name == "status" and hasattr(self, "status"):  # not __init__'s WAITING
                history.setdefault(self.index, []).append(value)
            object.__setattr__(self, name, value)

    monkeypatch.setattr(columns, "Request", Traced)  # (make_requests builds a run's)
    return sim.run(df, **config), history


def workload(seed, n, max_prompt, max_output, rate):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "request_id": [f"r{i}" for i in range(n)],
        "arrival_time": np.cumsum(rng.exponential(1 / rate, n)),
        "num_prompt_tokens": rng.integers(1, max_prompt, n),
        "num_output_tokens": rng.integers(1, max_output, n),
    })


@pytest.mark.parametrize("scheduler", ["static", "continuous", "chunked"])
def test_every_request_ends_finished_or_rejected_exactly_once(monkeypatch, scheduler):
    # a 16-block pool (256 tokens): long requests are rejected, the rest contend and preempt
    df = workload(seed=1, n=120, max_prompt=200, max_output=120, rate=200.0)
    res, history = traced_run(monkeypatch, df, scheduler=scheduler,
                              cost_model=sim.ConstantCost(0.01), kv_blocks=16, block_size=16,
                              max_batch_size=8)
    assert sorted(history) == list(range(len(df)))
    for i, statuses in history.items():
        path = [WAITING] + statuses
        for a, b in zip(path, path[1:]):
            assert b in ALLOWED[a], (i, [STATUS_NAMES[s] for s in path])
        terminal = [s for s in path if s in (FINISHED, REJECTED)]
        assert terminal == [path[-1]], (i, path)  # exactly one terminal status, last
    req = res.requests
    too_big = (df["num_prompt_tokens"] + df["num_output_tokens"] > 16 * 16).to_numpy()
    rejected = (req["status"] == "rejected").to_numpy()
    assert too_big.any() and (~too_big).any()
    assert np.array_equal(rejected, too_big)
    assert set(req["status"]) == {"finished", "rejected"}
    for _, row in req[rejected].iterrows():
        assert "KV blocks" in row["reason"] and str(row["num_prompt_tokens"]
                                                   + row["num_output_tokens"]) in row["reason"]
        assert pd.isna(row["finish_time"]) and pd.isna(row["ttft"])
    assert (req.loc[~rejected, "reason"] == "").all()
    assert req.loc[~rejected, "finish_time"].notna().all()
    # preemption happened, and a preempted request went back to WAITING before finishing
    preempted = [i for i, s in history.items() if s.count(WAITING)]
    if scheduler != "static":
        assert res.summary()["num_preemptions"] > 0 and preempted
    for i in preempted:
        assert history[i][-1] == FINISHED
        assert req["num_preemptions"].iloc[i] == history[i].count(WAITING)


def test_rejected_requests_never_run(monkeypatch):
    df = pd.DataFrame({"arrival_time": [0.0, 0.0, 0.1], "num_prompt_tokens": [10, 500, 10],
                       "num_output_tokens": [5, 5, 5]})
    res, history = traced_run(monkeypatch, df, scheduler="continuous",
                              cost_model=sim.ConstantCost(0.01), kv_blocks=4, block_size=16)
    assert history[1] == [REJECTED]
    assert history[0] == history[2] == [PREFILL, DECODE, FINISHED]
    assert list(res.requests["status"]) == ["finished", "rejected", "finished"]
    assert res.requests["reason"].iloc[1] == ("kv_pool: needs 32 KV blocks for 505 tokens but the pool "
                                              "has 4")


def test_one_token_outputs_finish_at_their_prefill(monkeypatch):
    df = pd.DataFrame({"arrival_time": [0.0, 0.0], "num_prompt_tokens": [30, 40],
                       "num_output_tokens": [1, 1]})
    res, history = traced_run(monkeypatch, df, scheduler="continuous",
                              cost_model=sim.ConstantCost(0.01), kv_blocks=64)
    assert history == {0: [PREFILL, FINISHED], 1: [PREFILL, FINISHED]}
    assert (res.requests["e2e"] == res.requests["ttft"]).all()
