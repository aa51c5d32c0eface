"""Batching policies: the built-ins' knobs, the table that names them, and the proof that a new
policy is one small class (shortest-prompt-first, written only against the replica's verbs)."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import sim
from sim.cli import main
from sim.engine import POLICIES, ChunkedPrefill, ContinuousBatching, SimConfig, StaticBatching


class ShortestPromptFirst:
    """Admit the waiting request with the shortest (re-)prompt first, whole, while a slot and
    blocks allow; under block pressure, preempt the running request with most tokens left."""

    name = "sjf"

    @classmethod
    def from_config(cls, config):
        return cls()

    def schedule(self, replica, now):
        for r in sorted(replica.waiting, key=lambda r: (r.prefill_target, r.index)):
            if not replica.admit(r, r.prefill_target):
                break

    @staticmethod
    def select_victim(replica):
        return max(replica.running.values(),
                   key=lambda r: (r.num_output_tokens - replica.num_generated(r), r.index))


def _df(arrivals, prompts, outputs):
    return pd.DataFrame({"arrival_time": arrivals, "num_prompt_tokens": prompts,
                         "num_output_tokens": outputs})


def test_shortest_prompt_first_serves_short_prompts_first():
    prompts = [400, 50, 300, 10, 200]
    res = sim.run(_df([0.0] * 5, prompts, [1] * 5), scheduler=ShortestPromptFirst(),
                  cost_model=sim.LinearCost(0.001, 1e-4), max_batch_size=1)
    order = res.requests.sort_values("finish_time")["num_prompt_tokens"].tolist()
    assert order == sorted(prompts)
    assert res.scheduler_name == "sjf"
    # FCFS on the same input serves in arrival order
    fcfs = sim.run(_df([0.0] * 5, prompts, [1] * 5), scheduler="continuous",
                   cost_model=sim.LinearCost(0.001, 1e-4), max_batch_size=1)
    assert fcfs.requests.sort_values("finish_time")["num_prompt_tokens"].tolist() == prompts


def test_a_policy_class_instead_of_an_instance_says_so():
    with pytest.raises(TypeError, match=r"^scheduler ShortestPromptFirst is a class: pass an "
                                        r"instance, scheduler=ShortestPromptFirst\(\)$"):
        sim.run(_df([0.0], [10], [1]), scheduler=ShortestPromptFirst,
                cost_model=sim.ConstantCost(0.01))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 3), st.integers(1, 80), st.integers(1, 30)),
                min_size=1, max_size=40),
       st.integers(6, 30), st.integers(1, 6))
def test_shortest_prompt_first_loses_nothing_under_block_pressure(rows, kv_blocks, max_bs):
    rows.sort()
    df = _df(*zip(*rows))
    res = sim.run(df, scheduler=ShortestPromptFirst(), cost_model=sim.ConstantCost(0.01),
                  kv_blocks=kv_blocks, block_size=4, max_batch_size=max_bs)
    req = res.requests
    assert len(req) == len(df) and set(req["status"]) <= {"finished", "rejected"}
    fits = -(-(df.num_prompt_tokens + df.num_output_tokens) // 4) <= kv_blocks
    assert (req["status"] == "finished").tolist() == fits.tolist()
    assert (res.iterations["kv_blocks_used"] <= kv_blocks).all()


def test_a_named_policy_is_one_class_and_one_table_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(POLICIES, "sjf", ShortestPromptFirst)
    df = _df([0.0, 0.0, 0.0], [30, 10, 20], [2, 2, 2])
    res = sim.run(df, scheduler="sjf", cost_model=sim.ConstantCost(0.01), max_batch_size=1)
    assert res.requests.sort_values("finish_time")["num_prompt_tokens"].tolist() == [10, 20, 30]
    wl = tmp_path / "w.csv"
    df.to_csv(wl, index=False)
    assert main(["run", "-w", str(wl), "-s", "sjf", "--cost", "constant:0.01", "--no-plots",
                 "-q", "-o", str(tmp_path / "o")]) == 0
    with pytest.raises(SystemExit):  # not in the table: the CLI refuses it
        monkeypatch.delitem(POLICIES, "sjf")
        main(["run", "-w", str(wl), "-s", "sjf", "-o", str(tmp_path / "o")])
    assert "invalid choice" in capsys.readouterr().err


def test_cli_choices_and_help_come_from_the_table(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    for name, cls in POLICIES.items():
        assert name in out
    assert "Sarathi" in out and "Orca" in out


def test_knobs_left_unset_take_the_policy_default_and_explicit_knobs_win():
    assert SimConfig().policy().chunk_size == sim.CHUNK_SIZE
    assert SimConfig(chunk_size=1024).policy().chunk_size == 1024
    assert SimConfig(scheduler="continuous").policy().token_budget is None
    assert SimConfig(scheduler="continuous", token_budget=300).policy().token_budget == 300
    assert isinstance(SimConfig(scheduler="static").policy(), StaticBatching)
    assert isinstance(SimConfig(scheduler=" Chunked ").policy(), ChunkedPrefill)


@pytest.mark.parametrize("sched, knob", [("continuous", {"chunk_size": 1024}),
                                         ("static", {"chunk_size": 1024}),
                                         ("static", {"token_budget": 100}),
                                         ("chunked", {"token_budget": 100})])
def test_a_knob_the_policy_does_not_use_is_an_error_not_ignored(sched, knob):
    (name, value), = knob.items()
    with pytest.raises(ValueError, match=f"{name}={value} is not used by the '{sched}'"):
        SimConfig(scheduler=sched, **knob)


def test_a_policy_object_carries_its_own_settings():
    policy = ChunkedPrefill(1024)
    assert SimConfig(scheduler=policy).policy() is policy
    with pytest.raises(ValueError, match="carries its own settings"):
        SimConfig(scheduler=policy, chunk_size=512)
    with pytest.raises(TypeError, match="schedule"):
        SimConfig(scheduler=object())
    with pytest.raises(ValueError, match="one of"):
        SimConfig(scheduler="fastest")


def test_policies_validate_their_knobs():
    with pytest.raises(ValueError, match="chunk_size"):
        ChunkedPrefill(0)
    with pytest.raises(ValueError, match="token_budget"):
        ContinuousBatching(-3)
    with pytest.raises(ValueError, match=r"chunk_size \(128\) must be >= max_batch_size \(256\)"):
        SimConfig(chunk_size=128)
    with pytest.raises(TypeError, match="chunk_size"):
        SimConfig(chunk_size="big")


def test_token_budget_caps_admission_per_iteration():
    df = _df([0.0] * 6, [40] * 6, [3] * 6)
    res = sim.run(df, scheduler="continuous", token_budget=100,
                  cost_model=sim.ConstantCost(0.01))
    per_iter = res.iterations["num_prefill_tokens"].to_numpy()
    assert per_iter.max() <= 100 and per_iter.sum() == 240
    assert np.count_nonzero(per_iter) == 3  # 2 prompts of 40 per iteration


def test_a_policy_may_give_some_engine_defaults_and_the_rest_are_ours():
    class Small(ShortestPromptFirst):
        @staticmethod
        def engine_defaults(config):
            return {"max_batch_size": 2}

    r = SimConfig(scheduler=Small()).resolved()
    assert r.max_batch_size == 2 and r.block_size == 16 and r.prefix_caching is False
    res = sim.run(_df([0.0] * 4, [5] * 4, [3] * 4), scheduler=Small(),
                  cost_model=sim.ConstantCost(0.01))
    assert res.iterations["num_running"].max() == 2
