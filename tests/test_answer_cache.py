"""A conversation's answers in the prefix cache (``Request.output_keys``): a finished turn's
prompt and answer (less the last token, whose KV is never computed) are cached under the names
its conversation's next turn gives them (vLLM v1 caches every full block of a request's
tokens; SGLang's ``cache_finished_req`` inserts them), so the next turn hits them; without
``session_id`` nothing changes."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import sim
import workloads
from sim.engine.simulation import _requests_from
from workloads.prefix import answer_block_keys, block_key_ids, next_turns


def _two_turns(p1, o1, user, gap=100.0, hash_bs=16, sessions=True):
    """Turn 1 (``p1`` prompt tokens, ``o1`` output) and turn 2 of the same conversation: its
    prompt is turn 1's prompt, answer and ``user`` new tokens (``multi_turn``'s ids)."""
    ids = workloads.generators._BlockIds()
    rows = []
    context = 0
    for turn, (u, o) in enumerate([(p1, o1), (user, 4)]):
        prompt = context + u
        rows.append((turn * gap, prompt, o, 0, turn, workloads.generators._hash_ids(
            ids, ("conv", 0), prompt, hash_bs)))
        context = prompt + o
    df = pd.DataFrame(rows, columns=["arrival_time", "num_prompt_tokens", "num_output_tokens",
                                     "session_id", "turn", "hash_ids"])
    if not sessions:
        df = df.drop(columns=["session_id", "turn"])
    df.attrs["block_size"] = hash_bs
    return df


def _run(df, scheduler, **kw):
    kw.setdefault("cost_model", sim.ConstantCost(0.01))
    return sim.run(df, scheduler=scheduler, check=True, **kw)


@pytest.mark.parametrize("p1, o1, user", [(100, 60, 40), (96, 33, 7), (5, 200, 20),
                                          (130, 1, 50), (64, 17, 16)])
def test_turn_two_hits_turn_ones_prompt_and_answer_full_blocks(p1, o1, user):
    df = _two_turns(p1, o1, user)
    p2 = p1 + o1 + user
    kv = p1 + o1 - 1  # turn 1's tokens with KV: the last output token's never computed
    block = _run(df, "vllm").requests["num_cached_tokens"].tolist()
    assert block == [0, min(kv // 16, (p2 - 1) // 16) * 16]
    radix = _run(df, "sglang").requests["num_cached_tokens"].tolist()
    assert radix == [0, min(kv, p2 - 1)]  # (page size 1: token-granular)
    # without sessions only turn 1's prompt is known to be in turn 2's: its whole blocks
    # (radix: its whole hash ids; the last, partly filled, is another id in turn 2)
    bare = _two_turns(p1, o1, user, sessions=False)
    assert _run(bare, "vllm").requests["num_cached_tokens"].tolist() == [0, p1 // 16 * 16]
    assert _run(bare, "sglang").requests["num_cached_tokens"].tolist() == [0, p1 // 16 * 16]


def test_a_next_turn_already_running_takes_nothing_from_the_answer():
    # turn 2 arrives while turn 1 still decodes: it computes the answer's blocks itself
    df = _two_turns(100, 300, 40, gap=0.5)
    res = _run(df, "vllm")
    assert res.requests["num_cached_tokens"].tolist() == [0, 96]
    assert res.requests["status"].tolist() == ["finished"] * 2


@pytest.mark.parametrize("scheduler", ["vllm", "sglang"])
def test_single_turn_sessions_change_nothing(scheduler):
    df = workloads.multi_turn(40, turns=1, user_tokens=workloads.LogNormal(200, 1.0),
                              output=workloads.LogNormal(100, 1.0), rate=5.0,
                              system_prompt_tokens=100, seed=3)
    with_ids = sim.run(df, scheduler=scheduler).requests
    without = sim.run(df.drop(columns=["session_id", "turn"]), scheduler=scheduler).requests
    pd.testing.assert_frame_equal(with_ids, without)


def test_output_keys_are_the_next_turns_keys_past_this_prompt():
    df = _two_turns(100, 60, 40)
    _, reqs = _requests_from(df, 16)
    keys = [r.block_keys for r in reqs]
    assert np.array_equal(reqs[0].output_keys, keys[1][6:9])  # blocks 6..8: tokens 96..143
    assert reqs[1].output_keys is None  # the last turn: nobody names its answer
    _, reqs = _requests_from(df, 16, mode="radix")
    assert reqs[0].output_keys == reqs[1].block_keys[:10]  # units 0..9 cover 159 tokens
    _, reqs = _requests_from(_two_turns(100, 60, 40, sessions=False), 16)
    assert reqs[0].output_keys is None


def test_answers_that_are_not_the_next_prompt_are_not_cached():
    df = _two_turns(100, 60, 40)
    other = df.copy()
    other.at[1, "hash_ids"] = [10**6 + k for k in range(len(df.hash_ids[1]))]  # another text
    _, reqs = _requests_from(other, 16)
    assert reqs[0].output_keys is None
    short = df.copy()
    short.at[1, "num_prompt_tokens"] = 150  # shorter than turn 1's prompt and answer
    short.at[1, "hash_ids"] = df.hash_ids[1][:10]  # (its ids: ceil(150 / 16), no more)
    _, reqs = _requests_from(short, 16)
    assert reqs[0].output_keys is None
    unnamed = df.copy()
    unnamed.at[0, "hash_ids"] = None
    _, reqs = _requests_from(unnamed, 16)
    assert reqs[0].output_keys is None


def test_next_turns_follow_workload_order_and_skip_rows_without_a_session():
    assert next_turns(["a", "b", "a", None, float("nan"), "b", "a"]) == [2, 5, 6, -1, -1, -1, -1]
    ids = [[1, 2], [1, 2, 3, 4]]
    keys = block_key_ids(ids, 16, [32, 56], 16)  # turn 2: 32 + 20 answer + 4 new tokens
    got = answer_block_keys(keys, ["s", "s"], [32, 56], [20, 1], 16, ids)
    assert got[0].tolist() == keys[1][2:3].tolist() and got[1] is None  # block 2: 32..47


@pytest.mark.parametrize("mode, page", [("block", 16), ("radix", 16), ("radix", 1)])
def test_engine_reaches_the_ideal_hit_rate_with_answers(mode, page):
    # no two requests overlap and the pool never evicts: the engine hits what the ideal does
    df = workloads.multi_turn(30, turns=workloads.Uniform(2, 6),
                              user_tokens=workloads.LogNormal(100, 1.0, max_tokens=600),
                              output=workloads.LogNormal(80, 1.0, max_tokens=400), rate=1.0,
                              system_prompt_tokens=70, seed=1)
    df = df.assign(arrival_time=np.arange(len(df)) * 1000.0)
    ideal = workloads.ideal_prefix_hit_rate(df, page, mode=mode, answers=True)
    before = workloads.ideal_prefix_hit_rate(df, page, mode=mode)
    res = sim.run(df, scheduler="continuous", prefix_caching=mode, block_size=page,
                  kv_blocks=10**6 // page, cost_model=sim.ConstantCost(0.01), max_batch_size=1,
                  check=True)
    assert res.summary()["prefix_hit_rate"] == pytest.approx(ideal, abs=1e-12)
    assert ideal > before + 0.1  # the answers are a good part of the next prompts
    with pytest.raises(ValueError, match="session_id"):
        workloads.ideal_prefix_hit_rate(df.drop(columns="session_id"), answers=True)
    with pytest.raises(TypeError, match="answers must be True or False, got 'yes'"):
        workloads.ideal_prefix_hit_rate(df, answers="yes")


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 10**6), st.integers(12, 200),
       st.sampled_from([("vllm", "block", 16), ("sglang", "radix", 1),
                        ("continuous", "radix", 4), ("chunked", "block", 4)]),
       st.booleans(), st.booleans())
def test_nothing_is_lost_and_the_pool_stays_exact(seed, kv_blocks, setup, closed, spec):
    from sim.engine.speculation.settings import SpeculativeConfig
    scheduler, mode, page = setup
    df = workloads.multi_turn(6, turns=workloads.Uniform(1, 4),
                              user_tokens=workloads.LogNormal(30, 1.0, max_tokens=120),
                              output=workloads.LogNormal(20, 1.0, max_tokens=80), rate=5.0,
                              think_time=0.05, system_prompt_tokens=10, block_size=4,
                              seed=seed)
    loop = workloads.ClosedLoop(2, 0.01) if closed else None
    res = sim.run(df, scheduler=scheduler, prefix_caching=mode, block_size=page,
                  kv_blocks=kv_blocks * 4 // page, cost_model=sim.ConstantCost(0.01),
                  max_batch_size=4, closed_loop=loop, check=True,  # (check: every iteration)
                  speculative=SpeculativeConfig(num_speculative_tokens=3, acceptance_rate=0.7,
                                                method="ngram") if spec else None)
    req = res.requests
    assert len(req) == len(df) and req["status"].isin(["finished", "rejected"]).all()
    assert (req["num_cached_tokens"] <= (req["num_prompt_tokens"] - 1).clip(lower=0)).all()


@pytest.mark.parametrize("mode", ["block", "radix"])
def test_disaggregated_answers_stay_on_the_decode_pool_uncached(mode):
    # the answer's KV is on a decode replica, the next turn prefills on a prefill replica:
    # no pool holds the prompt and the answer, so turn 2 hits turn 1's prompt only
    from sim.engine.fleet.disaggregation import Disaggregation
    df = _two_turns(100, 60, 40)
    res = sim.run(df, cost_model=sim.ConstantCost(0.01), prefix_caching=mode, check=True,
                  disaggregation=Disaggregation(1, 1))
    assert res.requests["num_cached_tokens"].tolist() == [0, 96]
    assert res.requests["status"].tolist() == ["finished"] * 2


def test_readme_multi_turn_numbers():
    # README: 300 conversations, 32 closed-loop users, a pool that holds them: vLLM's hit rate
    # is exactly the ideal with answers (87.0 %, from 78.8 % without them)
    df = workloads.multi_turn(300, turns=workloads.Uniform(2, 8),
                              user_tokens=workloads.LogNormal(200, 1.0, max_tokens=2000),
                              output=workloads.LogNormal(150, 1.0, max_tokens=1000), rate=5.0,
                              think_time=1.0, system_prompt_tokens=500, seed=0)
    res = sim.run(df, scheduler="vllm", closed_loop=workloads.ClosedLoop(32, 1.0),
                  kv_blocks=20000)
    ideal = workloads.ideal_prefix_hit_rate(df, 16, answers=True)
    assert res.summary()["prefix_hit_rate"] == pytest.approx(ideal, abs=1e-12)
    assert round(ideal, 3) == 0.870 and round(workloads.ideal_prefix_hit_rate(df, 16), 3) == 0.788
    assert int(res.requests["num_prefill_computed"].sum()) == 303695
