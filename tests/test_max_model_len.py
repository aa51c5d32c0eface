"""max_model_len: a request whose prompt + output tokens exceed it is rejected at arrival with its
own reason (vLLM's OpenAI server refuses prompt + max_tokens > max_model_len, SGLang's tokenizer
manager input + max_new_tokens > context_len); the limit is the model's context length unless
set, and never more. Every other request is served as if the long ones had not come: one
replica, clusters, disaggregated pools, closed loops."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import workloads
from sim.costs.simple import ConstantCost, LinearCost
from sim.engine import SimConfig, run
from sim.engine.fleet.disaggregation import SHARED_KNOBS, Disaggregation
from sim.specs.models import get_model
from sim.tools.sweep import sweep

COST = LinearCost(0.005, 1e-5, 1e-4)
BIG = 10**6  # KV blocks: no request is rejected for the pool
TIMES = ["first_scheduled_time", "first_token_time", "finish_time", "ttft", "e2e",
         "num_preemptions"]


def _df(prompts, outputs, gap=0.05):
    return pd.DataFrame({"arrival_time": np.arange(len(prompts)) * gap,
                         "num_prompt_tokens": prompts, "num_output_tokens": outputs})


def _codes(res):
    return [f.code for f in res.diagnose()]


def test_a_request_at_the_limit_finishes_and_one_token_over_is_rejected():
    df = _df([4000, 4001, 4095, 1, 3000], [96, 96, 1, 4095, 1097])  # 4,096 4,097 4,096 4,096 4,097
    res = run(df, model="llama-2-7b", cost_model=COST, kv_blocks=BIG)
    req = res.requests
    assert list(req["status"]) == ["finished", "rejected", "finished", "finished", "rejected"]
    assert req["reason"][1] == ("context_length: 4,097 tokens (4,001 prompt + 96 output) exceed "
                                "max_model_len 4,096")
    assert req["reason"][4].startswith("context_length: 4,097 tokens (3,000 prompt + 1,097 ")
    assert req.loc[[1, 4], ["ttft", "e2e", "finish_time"]].isna().all().all()
    s = res.summary()
    assert (s["num_finished"], s["num_rejected"], s["num_rejected_context_length"]) == (3, 2, 2)
    f = next(f for f in res.diagnose() if f.code == "context_length")
    assert f.value == 2 and "2 of 5 requests" in f.message and "up to 4,097" in f.message
    assert "max_model_len 4,096 (the model's context length)" in f.message
    assert "longer context" in f.action and "rejected" not in _codes(res)  # (the pool's finding)


def test_the_default_limit_is_the_models_context_length():
    assert SimConfig().resolved_max_model_len() == 131_072  # llama-3.1-8b, the default model
    assert SimConfig(model="llama-2-70b").resolved_max_model_len() == 4_096
    assert SimConfig(model="tinyllama-1.1b").resolved_max_model_len() == 2_048
    assert SimConfig(model="qwen3-8b").resolved_max_model_len() == 40_960
    # no model given: Llama-3.1-8B's 131,072 tokens, whatever the cost model
    df = _df([131_072 - 8, 131_072 - 7], [8, 8], gap=100.0)
    res = run(df, cost_model=ConstantCost(0.01), kv_blocks=BIG)
    assert list(res.requests["status"]) == ["finished", "rejected"]
    assert res.requests["reason"][1].endswith("exceed max_model_len 131,072")


def test_a_model_without_a_context_length_has_no_limit():
    unknown = dataclasses.replace(get_model("llama-2-7b"), max_position_embeddings=0)
    cfg = SimConfig(model=unknown, cost_model=COST, kv_blocks=BIG)
    assert cfg.resolved_max_model_len() is None and cfg.model_context_length() is None
    res = run(_df([9000, 20], [100, 5]), cfg)
    assert (res.requests["status"] == "finished").all()
    assert SimConfig(model=unknown, max_model_len=50_000).resolved_max_model_len() == 50_000


def test_max_model_len_overrides_the_model_and_cannot_exceed_it():
    df = _df([1000, 1001, 5000, 3], [24, 24, 10, 2])
    res = run(df, model="llama-2-7b", max_model_len=1024, cost_model=COST, kv_blocks=BIG)
    assert list(res.requests["status"]) == ["finished", "rejected", "rejected", "finished"]
    assert res.requests["reason"][2] == ("context_length: 5,010 tokens (5,000 prompt + 10 output)"
                                         " exceed max_model_len 1,024")
    f = next(f for f in res.diagnose() if f.code == "context_length")
    assert "max_model_len 1,024," in f.message and "(the model's" not in f.message
    assert f.action == "raise max_model_len (up to the model's context length, 4,096)"
    with pytest.raises(ValueError, match=r"max_model_len=4,097 is more than the context length "
                                         r"of model 'llama-2-7b', 4,096 tokens"):
        SimConfig(model="llama-2-7b", max_model_len=4097)
    with pytest.raises(ValueError, match="max_model_len=131,073 .* 'llama-3.1-8b', 131,072"):
        SimConfig(max_model_len=131_073)  # the default model's
    # a rope-scaled variant: its config with the longer context (VLLM_ALLOW_LONG_MAX_MODEL_LEN)
    long = dataclasses.replace(get_model("llama-2-7b"), max_position_embeddings=8192)
    res = run(df, model=long, max_model_len=8192, cost_model=COST, kv_blocks=BIG)
    assert (res.requests["status"] == "finished").all()
    for bad, error in ((0, ValueError), (-5, ValueError), (1.5, TypeError), (True, TypeError),
                       ("4096", TypeError)):
        with pytest.raises(error, match=f"max_model_len must be .*got {bad!r}"):
            SimConfig(max_model_len=bad)
    assert SimConfig(max_model_len=2048.0).max_model_len == 2048
    assert "max_model_len" in SHARED_KNOBS  # one limit for both pools of a disaggregated run
    with pytest.raises(ValueError, match="'max_model_len' cannot differ between pools"):
        Disaggregation(1, 1, decode={"max_model_len": 10})


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 300)), min_size=1,
                        max_size=25),
       gaps=st.lists(st.sampled_from([0.0, 0.001, 0.02, 0.3]), min_size=25, max_size=25),
       limit=st.integers(2, 600), scheduler=st.sampled_from(["continuous", "chunked", "vllm",
                                                              "sglang"]),
       replicas=st.sampled_from([1, 2, 3, "pools"]), users=st.sampled_from([None, 1, 3]))
def test_every_request_comes_out_once_and_exactly_the_long_ones_are_rejected(
        lengths, gaps, limit, scheduler, replicas, users):
    prompts, outputs = (np.array(x) for x in zip(*lengths))
    df = _df(prompts, outputs).assign(arrival_time=np.cumsum(gaps[:len(prompts)]))
    loop = workloads.ClosedLoop(users, 0.01) if users else None
    layout = (dict(disaggregation=Disaggregation(2, 1, link_bandwidth_gbps=100.0))
              if replicas == "pools" else dict(replicas=replicas))
    res = run(df, scheduler=scheduler, max_model_len=limit, cost_model=COST, kv_blocks=BIG,
              closed_loop=loop, check=True, **layout)
    req = res.requests
    over = prompts + outputs > limit
    assert len(req) == len(df)
    assert list(req["status"]) == ["rejected" if o else "finished" for o in over]
    assert req["reason"][over].str.startswith("context_length: ").all()
    assert (req["reason"][~over] == "").all()
    assert res.summary()["num_rejected_context_length"] == over.sum()
    assert ("context_length" in _codes(res)) == bool(over.any())
    if replicas == 1 and users is None and not over.all():
        # the others are served as if the long ones had never come, bit for bit
        alone = run(df[~over], scheduler=scheduler, max_model_len=limit, cost_model=COST,
                    kv_blocks=BIG)
        got = req[~over][TIMES].reset_index(drop=True)
        pd.testing.assert_frame_equal(got, alone.requests[TIMES], check_exact=True)


def test_clusters_reject_at_the_replica_the_router_picked():
    df = _df([100, 5000, 200, 6000, 50], [10, 10, 10, 10, 10])
    res = run(df, model="llama-2-7b", cost_model=COST, kv_blocks=BIG, replicas=2,
              router="round_robin")
    req = res.requests
    assert list(req["status"]) == ["finished", "rejected", "finished", "rejected", "finished"]
    assert list(req["replica"]) == [0, 1, 0, 1, 0]  # routed (a real router forwards it too)
    assert res.replica_summary()["num_requests"].tolist() == [3, 2]


def test_disaggregated_pools_reject_at_arrival_and_the_context_reason_comes_first():
    # the decode pool holds 10 blocks of 16 tokens: 160
    d = Disaggregation(1, 1, decode={"kv_blocks": 10}, link_bandwidth_gbps=100.0)
    df = _df([100, 5000, 150, 300], [10, 10, 5, 10])
    res = run(df, model="llama-2-7b", cost_model=COST, kv_blocks=BIG, disaggregation=d)
    req = res.requests
    assert list(req["status"]) == ["finished", "rejected", "finished", "rejected"]
    assert req["reason"][1].startswith("context_length: 5,010 tokens")  # (over both limits)
    assert req["reason"][3] == "kv_pool: needs 310 tokens of KV but a decode replica's pool holds 160 " \
                               "(10 blocks)"
    assert _codes(res).count("context_length") == 1 and "rejected" in _codes(res)


def test_a_closed_loop_user_moves_on_after_a_rejection():
    df = _df([100, 9000, 100], [10, 10, 10])
    think = 0.5
    res = run(df, model="llama-2-7b", cost_model=COST, kv_blocks=BIG,
              closed_loop=workloads.ClosedLoop(1, think))
    req = res.requests
    assert list(req["status"]) == ["finished", "rejected", "finished"]
    done = req["finish_time"][0]
    assert req["arrival_time"][1] == done + think  # rejected the moment it was issued
    assert req["arrival_time"][2] == pytest.approx(done + 2 * think, abs=1e-12)


def test_sim_run_max_model_len_flag_and_toml_key(tmp_path, capsys):
    from sim.cli import main
    wl = tmp_path / "w.csv"
    _df([1000, 3000, 20], [100, 100, 5]).to_csv(wl, index=False)
    out = tmp_path / "o"
    run_ = ["run", "-w", str(wl), "--cost", "constant:0.01", "-o", str(out)]
    assert main(run_ + ["--model", "llama-2-7b", "--max-model-len", "2048"]) == 0
    text = capsys.readouterr().out
    assert "2 finished, 1 rejected of 3 (1 over max_model_len)" in text
    assert "exceed max_model_len 2,048" in text and "try: raise max_model_len" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["max_model_len"] == 2048
    assert summary["summary"]["num_rejected_context_length"] == 1
    assert [f["code"] for f in summary["findings"]] == ["context_length"]
    req = pd.read_parquet(out / "requests.parquet")
    assert req["reason"][1].startswith("context_length: 3,100 tokens")
    cfg = tmp_path / "exp.toml"
    cfg.write_text(f'workload = "{wl}"\ncost = "constant:0.01"\nmax_model_len = 1000\n'
                   f'output = "{out}"\n')
    assert main(["run", str(cfg), "-q"]) == 0
    assert json.loads((out / "summary.json").read_text())["summary"]["num_rejected"] == 2
    assert main(["run", "-w", str(wl), "--cost", "constant:0.01", "-o", str(out), "-q"]) == 0
    summary = json.loads((out / "summary.json").read_text())  # the default: the model's
    assert summary["settings"]["max_model_len"] == 131_072 and not summary["findings"]


def test_a_sweep_varies_max_model_len_like_any_field():
    df = _df([1000, 2000, 3000, 4000], [96, 96, 96, 96])
    table = sweep(df, {"max_model_len": [1100, 2100, 4096]}, workers=1,
                  base=SimConfig(model="llama-2-7b", cost_model=COST, kv_blocks=BIG))
    assert table["num_rejected_context_length"].tolist() == [3, 2, 0]
    assert table["num_finished"].tolist() == [1, 2, 4]


def test_a_closed_loop_without_think_time_survives_thousands_of_rejections_in_a_row():
    # every request over the limit, no think time: each user moves straight on to the next;
    # this recursed once per rejection (RecursionError past ~1,000) before
    n = 5000
    df = _df([9000] * n + [100], [10] * (n + 1))
    res = run(df, model="llama-2-7b", cost_model=COST, kv_blocks=BIG,
              closed_loop=workloads.ClosedLoop(4, 0.0))
    req = res.requests
    assert (req["status"][:n] == "rejected").all() and req["status"][n] == "finished"
    assert (req["arrival_time"] == 0.0).all()  # all issued at time 0, the last one too
