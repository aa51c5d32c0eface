"""sim.plan: pruning with reasons, a capacity search per survivor, ranked by dollars per million
tokens at the SLO; a brute-force grid over the same space finds nothing cheaper that meets it,
and the winner replayed at its rate meets the SLO."""

import math

import numpy as np
import pytest

import sim
import workloads as wl
from sim.tools.plan import plan

SLO, ATTAINMENT, TOL = {"ttft": 1.0, "tpot": 0.05}, 0.9, 0.01
SPACE = {"gpu": ["a100", "h100", "l40s"], "tensor_parallel": [1, 2, 3],
         "scheduler": ["chunked", "vllm"]}
BASE = sim.SimConfig(model="llama-3.1-8b")


@pytest.fixture(scope="module")
def df():
    return wl.synthetic(150, rate=4.0, prompt=wl.LogNormal(400, 0.7, max_tokens=3000),
                        output=wl.LogNormal(150, 0.7, max_tokens=800), seed=3)


@pytest.fixture(scope="module")
def table(df):
    return plan(df, SLO, attainment=ATTAINMENT, space=SPACE, base=BASE, tol=TOL)


def test_every_candidate_has_a_row_ranked_or_pruned_with_a_reason(table):
    assert len(table) == 3 * 3 * 2
    ranked, pruned = table[table["status"] == "ranked"], table[table["status"] == "pruned"]
    assert len(ranked) and len(pruned)
    assert (ranked["rank"].to_numpy() == np.arange(1, len(ranked) + 1)).all()
    assert ranked["usd_per_million_output_tokens"].is_monotonic_increasing
    assert pruned["rank"].isna().all() and (pruned["reason"].str.len() > 0).all()
    tp3 = table[table["tensor_parallel"] == 3]  # 8 KV heads: 3 GPUs cannot split them
    assert (tp3["stage"] == "invalid").all() and tp3["reason"].str.contains("divide").all()
    assert list(table.columns[:2]) == ["rank", "pareto"]
    assert {"max_rate", "num_gpus", "ttft_p99"} <= set(table)
    assert set(pruned["stage"]) <= {"invalid", "slo", "workload"}
    short = pruned[pruned["stage"] == "workload"]  # 150 requests never load 2 H100s past it
    assert short["reason"].str.contains("give more requests").all()


def test_a_model_that_does_not_fit_is_pruned_for_memory(df):
    t = plan(df, SLO, space={"gpu": ["l40s", "h200"]}, base=sim.SimConfig(model="llama-3.1-70b"))
    assert (t["stage"] == "memory").all()  # 131 GiB of fp16 weights on one GPU
    assert t["reason"].str.contains("does not fit").all()
    assert t["reason"].str.contains("add GPUs").all()  # the budget's advice comes along


def test_a_gpu_without_a_price_is_pruned_when_ranking_by_dollars(df):
    custom = sim.GPU(name="unpriced", memory_gb=80.0, memory_bandwidth_gbps=3000.0,
                     fp16_tflops=900.0)
    t = plan(df, SLO, space={"gpu": [custom]}, base=BASE)
    assert t.iloc[0]["stage"] == "price" and "usd_per_gpu_hour" in t.iloc[0]["reason"]


def _meets(df, config, r):
    s = sim.run(wl.scale_to_rate(df, r), config).summary(slo=SLO)
    return s["slo_attainment"] >= ATTAINMENT, s["usd_per_million_output_tokens"]


def test_brute_force_finds_nothing_cheaper_that_meets_the_slo(df, table):
    best = table.iloc[0]
    assert best["status"] == "ranked"
    rates = np.geomspace(0.25, 64.0, 25)
    cheapest = math.inf
    for gpu in SPACE["gpu"]:
        for tp in SPACE["tensor_parallel"]:
            for sched in SPACE["scheduler"]:
                try:
                    config = sim.SimConfig(model="llama-3.1-8b", gpu=gpu, tensor_parallel=tp,
                                           scheduler=sched)
                    config.resolved_kv_blocks()
                except ValueError:
                    continue  # cannot run at all: nothing to find
                for r in rates:
                    ok, usd = _meets(df, config, r)
                    if ok:
                        cheapest = min(cheapest, usd)
    assert cheapest >= best["usd_per_million_output_tokens"] * (1 - TOL)


def test_the_winner_replayed_at_its_rate_meets_the_slo(df, table):
    best = table.iloc[0]
    config = sim.SimConfig(model="llama-3.1-8b", gpu=best["gpu"],
                           tensor_parallel=int(best["tensor_parallel"]),
                           scheduler=best["scheduler"])
    ok, usd = _meets(df, config, best["max_rate"])
    assert ok and usd == pytest.approx(best["usd_per_million_output_tokens"])


def test_a_target_rate_prunes_the_candidates_below_it(df, table):
    fastest = table["max_rate"].max()
    t = plan(df, SLO, space=SPACE, base=BASE, rate=fastest * 1.5)
    # ranked at the target: only those whose edge the 150 requests could not find (stage
    # workload without a target); they meet it, their max_rate unknown
    short = table.loc[table["stage"] == "workload", ["gpu", "tensor_parallel", "scheduler"]]
    ranked = t.loc[t["status"] == "ranked", ["gpu", "tensor_parallel", "scheduler"]]
    assert sorted(map(tuple, ranked.to_numpy())) == sorted(map(tuple, short.to_numpy()))
    assert t.loc[t["status"] == "ranked", "max_rate"].isna().all()
    assert t["reason"].str.contains("below the target").any()


@pytest.mark.parametrize("space", [{}, {"gpuu": ["h100"]}, {"gpu": "h100"}, {"gpu": []}])
def test_a_bad_space_names_the_problem(df, space):
    with pytest.raises(ValueError, match="space"):
        plan(df, SLO, space=space)


def test_a_value_invalid_on_its_own_is_an_error_one_invalid_beside_others_is_pruned(df,
                                                                                   tmp_path):
    """tensor_parallel 0 and -2 fail in every candidate whatever else is set: an error naming
    the key and the value, before any candidate runs; TP 3 (the 8B's 8 KV heads refuse it, a
    combination with the model) and a TensorRT-LLM knob beside vLLM stay pruned rows."""
    from sim.tools.plan_space import SpaceValueError
    for space, value in (({"gpu": ["h100"], "tensor_parallel": [1, 0, -2]}, 0),
                         ({"tensor_parallel": [-2, 1]}, -2),
                         ({"replicas": [1, 2], "decode_gpu": ["h100", "h9"],
                           "split": ["1:1"]}, "h9")):
        with pytest.raises(SpaceValueError, match=rf"^space\['\w+'\] value '?{value}'? is "
                                                   rf"invalid on its own \(so in every "
                                                   rf"candidate\): ") as e:
            plan(df.head(20), SLO, space=space, base=BASE, workers=1,
                 out=tmp_path / "p.parquet")
        assert e.value.value == value and not (tmp_path / "p.parquet").exists()  # (none ran)
    t = plan(df.head(20), SLO, space={"tensor_parallel": [3], "scheduler": ["vllm", "chunked"]},
             base=BASE, workers=1)
    assert t["stage"].tolist() == ["invalid", "invalid"]
    t = plan(df.head(20), SLO, space={"scheduler": ["vllm"], "free_gpu_memory_fraction": [0.8]},
             base=BASE, workers=1)
    assert t["stage"].tolist() == ["invalid"]
    # TP 16 is past an HGX H100's 8-GPU scale-up domain, within a GB200 NVL72's 72: pruned
    t = plan(df.head(20), SLO, space={"gpu": ["h100"], "tensor_parallel": [16]},
             base=sim.SimConfig(model="llama-3.1-70b"), workers=1)
    assert t["stage"].tolist() == ["invalid"] and "scale-up domain" in t["reason"][0]


@pytest.mark.parametrize("slo,kw,said", [
    ({}, {}, "slo must be a non-empty dict"), ({"ttft": -1}, {}, r"slo\['ttft'\] must be"),
    (SLO, {"attainment": 1.5}, "attainment must be in"), (SLO, {"tol": 5}, "tol must be in"),
    ({"ttfb": 1.0}, {}, r"slo keys \['ttfb'\] are neither")])
def test_a_bad_slo_or_search_setting_is_an_error_not_every_candidate_pruned(df, slo, kw, said):
    with pytest.raises(ValueError, match=said):
        plan(df.head(20), slo, space={"tensor_parallel": [1, 2]}, base=BASE, **kw)


def test_the_pareto_column_is_the_cost_latency_frontier(table):
    ranked = table[table["status"] == "ranked"]
    assert table.loc[table["status"] == "pruned", "pareto"].eq(False).all()
    assert ranked.iloc[0]["pareto"]  # the cheapest is on it
    for _, row in ranked.iterrows():
        dominated = ((ranked["usd_per_million_output_tokens"]
                      <= row["usd_per_million_output_tokens"])
                     & (ranked["ttft_p99"] <= row["ttft_p99"])
                     & ((ranked["usd_per_million_output_tokens"]
                         < row["usd_per_million_output_tokens"])
                        | (ranked["ttft_p99"] < row["ttft_p99"]))).any()
        assert row["pareto"] == (not dominated)
