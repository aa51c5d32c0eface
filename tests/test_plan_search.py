"""sim.plan at a target rate: roofline pruning, splits, duplicates, the brute force over the
same space, resuming, the progress bar, Dask."""

import io
import math

import pytest

import sim
import workloads as wl
from sim.tools.plan import plan
from sim.tools.plan_bounds import rate_bound
from test_plan import df  # noqa: F401  (the same 150 requests)

SLO, ATTAINMENT = {"ttft": 1.0, "tpot": 0.05}, 0.9
SPACE = {"gpu": ["a100", "h100", "l40s"], "tensor_parallel": [1, 2], "replicas": [1, 2],
         "split": ["aggregated", "1:1"]}
BASE = sim.SimConfig(model="llama-3.1-8b")
RATE = 100.0


@pytest.fixture(scope="module")
def table(df):
    return plan(df, SLO, attainment=ATTAINMENT, space=SPACE, base=BASE, rate=RATE, workers=1)


def test_every_stage_says_why(table):
    stages = set(table["stage"])
    assert {"", "roofline", "slo", "duplicate", "invalid"} <= stages
    roof = table[table["stage"] == "roofline"]
    assert roof["reason"].str.contains("below the target 100").all()
    dup = table[table["stage"] == "duplicate"]
    assert (dup["split"] == "1:1").all() and (dup["replicas"] == 2).all()
    assert table[table["stage"] == "invalid"]["reason"].str.contains("scale-up link").all()
    a = table.attrs
    assert a["simulated"] + a["pruned_before"] == len(table) == 24 and a["resumed"] == 0
    assert (table.loc[table["status"] == "ranked", "max_rate"].dropna() >= RATE).all()


def test_the_bound_holds_where_it_prunes(df, table):
    """Each candidate pruned by the bound misses the SLO at the target when simulated."""
    for _, row in table[table["stage"] == "roofline"].iterrows():
        knobs = {k: row[k] for k in ("gpu", "tensor_parallel", "replicas")}
        knobs["tensor_parallel"] = int(knobs["tensor_parallel"])
        knobs["replicas"] = int(knobs["replicas"])
        dis = None if row["split"] == "aggregated" else sim.Disaggregation(1, 1)
        config = sim.SimConfig(model="llama-3.1-8b", **knobs, disaggregation=dis)
        if dis is not None:
            config = sim.SimConfig(model="llama-3.1-8b", gpu=knobs["gpu"],
                                   tensor_parallel=knobs["tensor_parallel"], disaggregation=dis)
        s = sim.run(wl.scale_to_rate(df, RATE), config).summary(slo=SLO)
        assert s["slo_attainment"] < ATTAINMENT
        assert rate_bound(config, df, SLO, ATTAINMENT)[0] < RATE


def test_brute_force_at_the_target_finds_nothing_cheaper(df, table):
    best = table.iloc[0]
    cheapest, where = math.inf, None
    for gpu in SPACE["gpu"]:
        for tp in SPACE["tensor_parallel"]:
            for layout in [("aggregated", 1), ("aggregated", 2), ("1:1", 1)]:
                dis = None if layout[0] == "aggregated" else sim.Disaggregation(1, 1)
                config = sim.SimConfig(model="llama-3.1-8b", gpu=gpu, tensor_parallel=tp,
                                       replicas=layout[1], disaggregation=dis)
                try:
                    s = sim.run(wl.scale_to_rate(df, RATE), config).summary(slo=SLO)
                except ValueError:
                    continue  # cannot run at all (no link for the split): nothing to find
                if s["slo_attainment"] >= ATTAINMENT and \
                        s["usd_per_million_output_tokens"] < cheapest:
                    cheapest, where = s["usd_per_million_output_tokens"], (gpu, tp, layout)
    assert cheapest == pytest.approx(best["usd_per_million_output_tokens"]), where


def test_interrupted_and_resumed_gives_the_same_table(df, table, tmp_path, monkeypatch):
    out = tmp_path / "plan.parquet"
    whole = plan(df, SLO, attainment=ATTAINMENT, space=SPACE, base=BASE, rate=RATE,
                 workers=1, out=out)
    out.unlink()
    import sim.tools.plan_run as pr
    real, calls = pr.evaluate, []

    def dies(*a):
        if len(calls) == 4:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*a)
    monkeypatch.setattr(pr, "evaluate", dies)
    with pytest.raises(KeyboardInterrupt):
        plan(df, SLO, attainment=ATTAINMENT, space=SPACE, base=BASE, rate=RATE, workers=1,
             out=out)
    monkeypatch.setattr(pr, "evaluate", real)
    again = plan(df, SLO, attainment=ATTAINMENT, space=SPACE, base=BASE, rate=RATE, workers=1,
                 out=out)
    assert again.attrs["resumed"] == 4 and again.attrs["simulated"] == whole.attrs[
        "simulated"] - 4
    import pandas as pd
    wall = [c for c in whole.columns if "wall" in c]  # the host's timing, not the plan's
    pd.testing.assert_frame_equal(again.drop(columns=wall), whole.drop(columns=wall))
    with pytest.raises(ValueError, match="another plan"):
        plan(df, SLO, attainment=0.5, space=SPACE, base=BASE, rate=RATE, workers=1, out=out)


def test_a_progress_bar_on_a_given_stream(df):
    stream = io.StringIO()
    plan(df, SLO, space={"gpu": ["h100", "a100"]}, base=BASE, rate=8.0, workers=1,
         progress=stream)
    text = stream.getvalue()
    assert "plan" in text and "2/2" in text


def test_processes_and_dask_give_the_same_table(df):
    space = {"gpu": ["h100", "a100"], "tensor_parallel": [1, 2]}
    one = plan(df, SLO, space=space, base=BASE, rate=20.0, workers=1)
    two = plan(df, SLO, space=space, base=BASE, rate=20.0, workers=2)
    import pandas as pd
    wall = [c for c in one.columns if "wall" in c]
    one, two = one.drop(columns=wall), two.drop(columns=wall)
    pd.testing.assert_frame_equal(one, two)
    distributed = pytest.importorskip("distributed")
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=1,
                            dashboard_address=None) as client:
        on_dask = plan(df, SLO, space=space, base=BASE, rate=20.0, client=client)
    pd.testing.assert_frame_equal(one, on_dask.drop(columns=wall))


@pytest.mark.parametrize("split", ["2-1", "x:1", 3])
def test_a_bad_split_names_the_value(df, split):
    with pytest.raises(ValueError, match=r"space\['split'\] value"):
        plan(df, SLO, space={"split": [split]}, base=BASE, rate=1.0)


def test_the_pareto_plot_draws_the_frontier(table):
    from sim.results.plots_plan import plot_pareto
    fig = plot_pareto(table)
    line = fig.axes[0].lines[0]
    assert len(line.get_xdata()) == int(table["pareto"].sum())
    with pytest.raises(ValueError, match="no ranked candidate"):
        plot_pareto(table[table["status"] == "pruned"])


def test_headroom_is_searched_on_the_frontier_or_as_asked(df, table):
    ranked = table[table["status"] == "ranked"]
    assert ranked.loc[~ranked["pareto"], "max_rate"].isna().all()
    front = ranked[ranked["pareto"]]
    assert table.attrs["capacity_searches"] == len(front)
    every = plan(df, SLO, attainment=ATTAINMENT, space={"gpu": ["h100", "a100"],
                 "replicas": [1, 2]}, base=BASE, rate=20.0, workers=1, headroom="all")
    ok = every[every["status"] == "ranked"]
    assert every.attrs["capacity_searches"] == len(ok) and (ok["max_rate"] >= 20.0).all()
    with pytest.raises(ValueError, match="headroom must be one of"):
        plan(df, SLO, space={"gpu": ["h100"]}, base=BASE, rate=1.0, headroom="some")


@pytest.mark.parametrize("kw", [dict(gpu="h100", tensor_parallel=2),
                                dict(gpu="l40s", scheduler="sglang"),
                                dict(gpu="a100", cost_model=sim.LinearCost(0.004, 2e-5, 1e-4))])
def test_the_bound_prices_decodes_as_the_batch_would(df, kw, monkeypatch):  # noqa: F811
    """The decode bound prices b decodes through the cost model's pure-decode price (no
    Batch per b): the same bound, bit for bit, as pricing each batch."""
    import sim.engine.core.batch as batch
    from sim.tools.plan_bounds import _replica_bound, workload_terms
    config, w = sim.SimConfig(model="llama-3.1-8b", **kw), workload_terms(df)
    fast = _replica_bound(config, w, 100)
    monkeypatch.setattr(batch, "decode_pricer", lambda cost: None)
    assert _replica_bound(config, w, 100) == fast


@pytest.mark.parametrize("kw", [dict(gpu="h100", tensor_parallel=4, weight_dtype="fp8"),
                                dict(gpu="h100", tensor_parallel=2, weight_dtype="fp8"),
                                dict(gpu="l40s", scheduler="sglang", replicas=2)])
def test_the_bound_is_above_the_rate_the_simulation_serves(kw):
    """An upper bound: at least the capacity search's answer, here where it is finite (400
    requests, 99 % attainment). (Pricing the prefill side by the shortest prompts' shape put
    H100 TP4's bound at 0.6x the rate it serves, TP2's at 0.8x: many tiny prefills each pay a
    sampled row and per-sequence costs that a long prompt's chunks share.)"""
    df = wl.synthetic(400, rate=10, prompt=wl.LogNormal(400, 0.7, max_tokens=4000),
                      output=wl.LogNormal(200, 0.7, max_tokens=1000), seed=3)
    config = sim.SimConfig(model="llama-3.1-8b", **kw)
    served = sim.max_rate(df, SLO, attainment=0.99, config=config, tol=0.05).rate
    bound = rate_bound(config, df, SLO, 0.99)[0]
    assert served <= bound < math.inf
