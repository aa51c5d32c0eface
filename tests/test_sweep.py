"""sim/tools/sweep.py with its sweep_grid, sweep_backends and sweep_resume modules: job
validation, one row per job in job order, labels as columns, grids checked before anything runs,
resume, the same table in this process, in a process pool and on Dask."""

import dataclasses
import functools

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import sim
import workloads
from sim.tools.sweep import sweep

N = 150


@pytest.fixture(scope="module")
def df():
    return workloads.load("azure-code", n=N)


def test_is_the_public_sim_sweep():
    assert sim.sweep is sweep


@pytest.mark.parametrize("bad, index", [
    ([{"config": {}}], 0),
    ([{"workload": None}, ["workload"]], 1),
    ([{"workload": None}, {"workload": None}, None], 2),
    ([{"workload": None}, {"Workload": None}], 1),
])
def test_a_malformed_job_is_named_by_its_index(bad, index):
    with pytest.raises(ValueError, match=rf"^jobs\[{index}\] must be a dict with a 'workload' key"):
        sweep(bad, workers=1)


def test_jobs_are_all_checked_before_any_runs(df):
    calls = []

    def cost(batch):
        calls.append(batch.iteration)
        return 0.01

    jobs = [{"workload": df, "config": {"cost_model": cost}}, {"config": {}}]
    with pytest.raises(ValueError, match=r"jobs\[1\]"):
        sweep(jobs, workers=1)
    assert calls == []


def test_no_jobs_no_rows():
    out = sweep([])
    assert isinstance(out, pd.DataFrame) and len(out) == 0


def test_each_row_is_its_runs_summary_with_labels_first(df):
    configs = [{"scheduler": "continuous"}, {"scheduler": "chunked", "chunk_size": 256}, {}]
    jobs = [{"workload": df, "config": c, "label": {"job": i, "name": f"j{i}"}}
            for i, c in enumerate(configs)]
    out = sweep(iter(jobs), workers=1)  # any iterable of jobs
    assert list(out["job"]) == [0, 1, 2] and list(out["name"]) == ["j0", "j1", "j2"]
    assert list(out.columns[:2]) == ["job", "name"]
    for i, c in enumerate(configs):
        expected = sim.run(df, **c).summary()
        row = out.iloc[i]
        assert list(out.columns[2:]) == list(expected)
        for key, value in expected.items():
            if key != "wall_seconds":
                assert row[key] == value or (pd.isna(row[key]) and pd.isna(value)), key


def test_a_job_without_label_or_config_runs_the_defaults(df):
    out = sweep([{"workload": df}], workers=1)
    expected = sim.run(df).summary()
    assert list(out.columns) == list(expected)
    assert out["num_requests"].iloc[0] == N and out["scheduler"].iloc[0] == expected["scheduler"]
    assert out["ttft_p99"].iloc[0] == expected["ttft_p99"]


def test_rows_follow_job_order_not_finish_order(df):
    """Jobs of very different lengths: a pool finishes them out of order, the table does not."""
    jobs = [{"workload": df.iloc[:n], "label": {"n": n}} for n in (150, 5, 120, 1, 60)]
    for workers in (1, 3):
        out = sweep(jobs, workers=workers)
        assert list(out["n"]) == [150, 5, 120, 1, 60]
        assert list(out["num_requests"]) == [150, 5, 120, 1, 60]


def test_in_process_and_process_pool_agree_bit_for_bit_with_slo(df):
    slo = {"ttft": 2.0, "tpot": 0.05}
    jobs = [{"workload": df, "config": {"scheduler": s, "cost_model": cost},
             "label": {"scheduler_asked": s, "cost": name}}
            for s in ("static", "continuous", "chunked")
            for name, cost in (("const", sim.ConstantCost(0.02)),
                               ("linear", sim.LinearCost(base=5e-3, per_prefill_token=2e-5,
                                                         per_decode_token=1e-4)))]
    a = sweep(jobs, slo=slo, workers=1).drop(columns="wall_seconds")
    b = sweep(jobs, slo=slo, workers=2).drop(columns="wall_seconds")
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert a.equals(b)
    assert list(a["scheduler"]) == list(a["scheduler_asked"])
    # slo reaches every summary
    assert (a["slo_ttft"] == 2.0).all() and (a["slo_tpot"] == 0.05).all()
    assert a["slo_attainment"].between(0, 1).all()
    first = sim.run(df, scheduler="static", cost_model=sim.ConstantCost(0.02)).summary(slo=slo)
    assert a["slo_attainment"].iloc[0] == first["slo_attainment"]
    assert a["goodput"].iloc[0] == first["goodput"]


def test_without_slo_there_are_no_slo_columns(df):
    out = sweep([{"workload": df}], workers=1)
    assert not [c for c in out.columns if c.startswith("slo_") or c == "goodput"]


def test_errors_in_a_job_propagate(df):
    with pytest.raises(ValueError, match="slo keys"):
        sweep([{"workload": df}], slo={"latency": 1.0}, workers=1)
    with pytest.raises(TypeError):
        sweep([{"workload": df, "config": {"no_such_setting": 1}}], workers=1)
    with pytest.raises(ValueError, match="max_batch_size"):  # raised in a worker, re-raised here
        sweep([{"workload": df, "config": {"max_batch_size": 0}}] * 2, workers=2)


def test_a_label_named_like_a_metric_is_an_error_not_overwritten():
    import workloads
    df = workloads.load("azure-code", n=20)
    with pytest.raises(ValueError, match=r"\['scheduler'\] would overwrite"):
        sim.sweep([{"workload": df, "label": {"scheduler": "mine"}}], workers=1)


def _grid_df():
    return workloads.load("azure-code", n=120)


def test_grid_is_the_cartesian_product_with_reshaping_fields():
    table = sim.sweep(_grid_df(), {"scheduler": ["chunked", "continuous"], "rate": [1.0, 4.0],
                                   "num_requests": [60, 120]},
                      base=sim.SimConfig(cost_model=sim.ConstantCost(0.01)), workers=1)
    assert len(table) == 8 and (table["error"] == "").all()
    assert list(table.columns[:3]) == ["scheduler", "rate", "num_requests"]
    assert table.groupby("num_requests")["num_finished"].max().to_dict() == {60: 60, 120: 120}
    # a higher rate gives a shorter run for the same requests
    d = table.set_index(["scheduler", "num_requests", "rate"])["duration"]
    assert d[("chunked", 120, 4.0)] < d[("chunked", 120, 1.0)]


def test_a_point_failing_at_run_time_is_a_row_with_its_error_and_the_others_run():
    # the 70B model in fp16 does not fit one H100: found when the point runs, not when built
    table = sim.sweep(_grid_df(), {"model": ["llama-3.1-8b", "llama-3.1-70b"]},
                      base=sim.SimConfig(cost_model=sim.ConstantCost(0.01)), workers=2)
    ok, bad = table.iloc[0], table.iloc[1]
    assert ok["error"] == "" and ok["num_finished"] == 120
    assert bad["error"].startswith("ValueError: model 'llama-3.1-70b' on gpu 'h100'")


@pytest.mark.parametrize("grid, error, message", [
    ({"schedular": ["chunked"]}, ValueError,
     r"\['schedular'\] are neither SimConfig fields .* \(did you mean 'scheduler'\?\)"),
    ({"scheduler": ["vlm"]}, ValueError,
     r"grid point max_batch_size=8, scheduler='vlm': scheduler must be one of"),
    ({"weight_dtype": ["fp16", "fp32"]}, ValueError,
     r"weight_dtype='fp32': weight_dtype must be one of"),
    ({"router": ["least-kv"]}, ValueError, r"router='least-kv': .*did you mean 'least_kv'"),
    ({"rate": [1.0, -2]}, ValueError, r"grid\['rate'\] must be a finite number > 0, got -2"),
    ({"rate": [0]}, ValueError, r"grid\['rate'\] must be a finite number > 0, got 0"),
    ({"rate": ["4"]}, TypeError, r"grid\['rate'\] must be a number, got '4'"),
    ({"seed": [-1]}, ValueError, r"seed=-1: seed must be >= 0, got -1"),
    ({"kv_blocks": [0]}, ValueError, r"kv_blocks=0: kv_blocks must be > 0"),
    ({"num_requests": [0]}, ValueError, r"grid\['num_requests'\] must be > 0, got 0"),
    ({"num_requests": [121]}, ValueError, r"121 is more than the workload's 120 requests"),
    ({"scheduler": ["chunked", "continuous"], "chunk_size": [1024]}, ValueError,
     r"scheduler='continuous', chunk_size=1024: chunk_size=1024 is not used by the"),
    ({"rate": []}, ValueError, r"grid\['rate'\] must be a non-empty list"),
])
def test_a_bad_grid_value_is_refused_before_any_point_runs(grid, error, message, monkeypatch):
    from sim.tools import sweep_backends as module

    def refuse(*args, **kwargs):
        raise AssertionError("a point ran before the grid was checked")
    monkeypatch.setattr(module, "run_point", refuse)
    with pytest.raises(error, match=message):
        sim.sweep(_grid_df(), {"max_batch_size": [8, 16], **grid}, workers=1)


def test_an_interrupted_sweep_resumes_from_its_parquet(tmp_path):
    out = tmp_path / "sweep.parquet"
    grid = {"max_batch_size": [4, 8, 16]}
    base = sim.SimConfig(scheduler="continuous", cost_model=sim.ConstantCost(0.01))
    first = sim.sweep(_grid_df(), grid, base=base, workers=1, out=out)
    assert first.attrs["computed"] == 3 and len(pd.read_parquet(out)) == 3
    pd.read_parquet(out).iloc[:2].to_parquet(out, index=False)  # as if stopped after two points
    again = sim.sweep(_grid_df(), grid, base=base, workers=1, out=out)
    assert again.attrs["computed"] == 1
    cols = ["max_batch_size", "num_finished", "ttft_p50"]
    pd.testing.assert_frame_equal(again[cols], first[cols])


def test_grid_on_a_dask_cluster_matches_local_processes():
    from dask.distributed import Client, LocalCluster
    grid = {"scheduler": ["chunked", "vllm"], "rate": [2.0, 8.0]}
    base = sim.SimConfig(cost_model=sim.ConstantCost(0.01))
    local = sim.sweep(_grid_df(), grid, base=base, workers=2).drop(columns="wall_seconds")
    with LocalCluster(n_workers=2, processes=False, threads_per_worker=1,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        remote = sim.sweep(_grid_df(), grid, base=base, client=client)
    pd.testing.assert_frame_equal(remote.drop(columns="wall_seconds"), local)


def test_a_dask_address_nothing_answers_at_is_a_value_error_naming_it(tmp_path):
    """It was dask's OSError (a traceback from ``sim sweep --dask``) after its 30 s timeout."""
    import dask
    from sim.cli import main
    import dask.distributed  # noqa: F401 (its defaults loaded first: a set() of a key dask
    # does not know yet removes the whole "distributed" section when it is undone)
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        with pytest.raises(ValueError, match=r"^client='tcp://127.0.0.1:1': no Dask scheduler "
                                             r"answers there \(.*tcp://127.0.0.1:1"):
            sim.sweep(_grid_df(), {"rate": [2.0]}, client="tcp://127.0.0.1:1", progress=False)
        toml = tmp_path / "s.toml"
        toml.write_text(f'workload = "azure-code"\nnum_requests = 5\noutput = "{tmp_path}/o"\n'
                        f'[grid]\nrate = [1.0]\n')
        with pytest.raises(ValueError, match=r"^--dask 'tcp://127.0.0.1:1': no Dask scheduler"):
            main(["--debug", "sweep", str(toml), "--dask", "tcp://127.0.0.1:1"])
    assert not (tmp_path / "o" / "sweep.parquet").exists()


SHAREGPT = functools.partial(workloads.load, "sharegpt", n=40, rate=4.0)  # seed -> DataFrame
COST = sim.SimConfig(cost_model=sim.ConstantCost(0.01))


def test_repeats_run_each_point_with_successive_seeds_and_match_direct_runs():
    grid = {"max_batch_size": [4, 16]}
    table = sim.sweep(SHAREGPT, grid, base=COST, repeats=3, workers=1)
    assert list(table.columns[:3]) == ["max_batch_size", "repeat", "seed"]
    assert list(table["max_batch_size"]) == [4, 4, 4, 16, 16, 16]
    assert list(table["repeat"]) == [0, 1, 2] * 2 and list(table["seed"]) == [0, 1, 2] * 2
    for row in table.itertuples():
        direct = sim.run(SHAREGPT(seed=row.seed), COST, max_batch_size=row.max_batch_size,
                         seed=row.seed).summary()
        assert row.ttft_p99 == direct["ttft_p99"] and row.e2e_mean == direct["e2e_mean"]
    assert table["ttft_p99"].iloc[:3].nunique() == 3  # the repeats differ: new arrivals each
    pool = sim.sweep(SHAREGPT, grid, base=dataclasses.replace(COST), repeats=3, workers=2)
    pd.testing.assert_frame_equal(pool.drop(columns="wall_seconds"),
                                  table.drop(columns="wall_seconds"))  # bit for bit


def test_the_seed_of_the_base_config_or_the_grid_starts_the_repeats():
    base = dataclasses.replace(COST, seed=7)
    table = sim.sweep(SHAREGPT, {"max_batch_size": [8]}, base=base, repeats=2, workers=1)
    assert list(table["seed"]) == [7, 8]
    one = sim.sweep(SHAREGPT, {"seed": [3, 5]}, base=COST, workers=1)
    assert list(one["seed"]) == [3, 5] and list(one["repeat"]) == [0, 0]
    assert one["ttft_p99"].iloc[0] == sim.run(SHAREGPT(seed=3), COST).summary()["ttft_p99"]


@pytest.mark.parametrize("kwargs, error, message", [
    ({"workload": "df", "repeats": 2}, ValueError, "repeats=2 needs a workload that depends on "
                                                   "the seed"),
    ({"repeats": 0}, ValueError, "repeats must be > 0, got 0"),
    ({"repeats": 1.5}, TypeError, "repeats must be an integer, got 1.5"),
    ({"grid": {"seed": [1, 2]}, "repeats": 2}, ValueError, r"grid\['seed'\] with repeats > 1"),
    ({"grid": None, "workload": [], "repeats": 2}, ValueError, "repeats= need the grid form"),
])
def test_bad_repeats_are_named(kwargs, error, message):
    args = {"workload": SHAREGPT, "grid": {"max_batch_size": [8]}, "repeats": 1}
    args.update(kwargs)
    if args["workload"] == "df":
        args["workload"] = SHAREGPT(seed=0)
    with pytest.raises(error, match=message):
        sim.sweep(args.pop("workload"), args.pop("grid"), base=COST, workers=1, **args)


def test_an_interrupted_sweep_with_repeats_resumes_the_missing_repeats(tmp_path):
    out = tmp_path / "sweep.parquet"
    grid = {"max_batch_size": [4, 16]}
    first = sim.sweep(SHAREGPT, grid, base=COST, repeats=2, workers=1, out=out)
    assert first.attrs["computed"] == 4
    saved = pd.read_parquet(out)
    saved[~((saved["max_batch_size"] == 16) & (saved["repeat"] == 1))].to_parquet(out, index=False)
    again = sim.sweep(SHAREGPT, grid, base=COST, repeats=2, workers=1, out=out)
    assert again.attrs["computed"] == 1
    pd.testing.assert_frame_equal(again.drop(columns="wall_seconds"),
                                  first.drop(columns="wall_seconds"))
    more = sim.sweep(SHAREGPT, grid, base=COST, repeats=3, workers=1, out=out)
    assert more.attrs["computed"] == 2 and list(more["repeat"]) == [0, 1, 2] * 2


def test_progress_bar_only_when_asked_or_on_a_terminal(capsys):
    grid = {"max_batch_size": [4, 16]}
    df = SHAREGPT(seed=0)
    sim.sweep(df, grid, base=COST, workers=1, progress=True)
    err = capsys.readouterr().err
    assert "sweep:" in err and "0/2" in err and "point" in err  # (cleared when done: leave=False)
    sim.sweep(df, grid, base=COST, workers=1)  # stderr is not a terminal under pytest
    sim.sweep(df, grid, base=COST, workers=1, progress=False)
    assert capsys.readouterr().err == ""


def test_repeats_of_one_dataframe_vary_the_speculative_draws():
    import pandas as pd
    from sim import SimConfig, SpeculativeConfig, sweep
    df = pd.DataFrame({"arrival_time": [0.0, 0.2], "num_prompt_tokens": [64, 64],
                       "num_output_tokens": [300, 300]})
    spec = SpeculativeConfig(num_speculative_tokens=3, acceptance_rate=0.6, method="ngram")
    table = sweep(df, {"max_batch_size": [8]}, base=SimConfig(speculative=spec), repeats=3,
                  workers=1, progress=False)
    assert table["seed"].tolist() == [0, 1, 2]
    assert table["spec_acceptance_rate"].nunique() > 1 and table["e2e_mean"].nunique() == 3
    with pytest.raises(ValueError, match="identical"):
        sweep(df, {"max_batch_size": [8]}, repeats=2, workers=1, progress=False)


def test_resume_refuses_rows_of_another_base_config_or_workload(tmp_path):
    import pandas as pd
    from sim import SimConfig, sweep
    df = pd.DataFrame({"arrival_time": [0.0, 0.5, 1.0], "num_prompt_tokens": [64, 128, 32],
                       "num_output_tokens": [20, 10, 30]})
    out = tmp_path / "s.parquet"
    first = sweep(df, {"max_batch_size": [4, 8]}, out=out, workers=1, progress=False)
    assert first.attrs["computed"] == 2 and first["sweep_context"].nunique() == 1
    again = sweep(df, {"max_batch_size": [4, 8]}, out=out, workers=1, progress=False)
    assert again.attrs["computed"] == 0  # the same sweep resumes
    with pytest.raises(ValueError, match="another sweep"):
        sweep(df, {"max_batch_size": [4, 8]}, base=SimConfig(kv_dtype="fp8"), out=out,
              workers=1, progress=False)
    with pytest.raises(ValueError, match="another sweep"):
        sweep(df.assign(num_output_tokens=[5, 5, 5]), {"max_batch_size": [4, 8]}, out=out,
              workers=1, progress=False)


def test_resume_refuses_rows_of_a_grid_with_other_fields(tmp_path):
    """Rows are found again by their grid fields' values: with ``scheduler`` dropped from the
    grid, its vllm rows were taken for the base config's (chunked) points, silently; with a
    field added that is also a summary column (``scheduler``), the other sweep's rows were
    dropped from the file. Both are another sweep: refused."""
    import pandas as pd
    from sim import sweep
    df = pd.DataFrame({"arrival_time": [0.0, 0.0, 0.0, 0.0],
                       "num_prompt_tokens": [3000, 3000, 3000, 3000],
                       "num_output_tokens": [40, 40, 40, 40]})
    out = tmp_path / "s.parquet"
    both = sweep(df, {"scheduler": ["vllm", "chunked"], "kv_blocks": [4000]}, out=out,
                 workers=1, progress=False)
    fresh = sweep(df, {"kv_blocks": [4000]}, workers=1, progress=False)  # chunked, the base
    assert both["ttft_p99"].iloc[0] != fresh["ttft_p99"].iloc[0]  # vllm's differs
    assert both["ttft_p99"].iloc[1] == fresh["ttft_p99"].iloc[0]
    with pytest.raises(ValueError, match="another sweep"):
        sweep(df, {"kv_blocks": [4000]}, out=out, workers=1, progress=False)
    out2 = tmp_path / "s2.parquet"
    sweep(df, {"kv_blocks": [4000]}, out=out2, workers=1, progress=False)
    with pytest.raises(ValueError, match="another sweep"):
        sweep(df, {"scheduler": ["chunked", "vllm"], "kv_blocks": [4000]}, out=out2, workers=1,
              progress=False)
    assert len(pd.read_parquet(out2)) == 1  # kept, not rewritten


def test_resume_with_other_grid_values_keeps_the_other_points_rows(tmp_path):
    """A re-run whose grid holds other values of the same fields (newcomer review: the first
    run's rows disappeared from the file) resumes the points they share and keeps the others'
    rows in the file, after the grid's own; the table returned is the grid's points only."""
    df = pd.DataFrame({"arrival_time": [0.0, 0.5, 1.0], "num_prompt_tokens": [64, 128, 32],
                       "num_output_tokens": [20, 10, 30]})
    out = tmp_path / "s.parquet"
    first = sweep(df, {"max_batch_size": [1, 4]}, out=out, workers=1, progress=False)
    second = sweep(df, {"max_batch_size": [4, 8]}, out=out, workers=1, progress=False)
    assert second.attrs["computed"] == 1 and second.attrs["kept"] == 1
    assert second["max_batch_size"].tolist() == [4, 8]
    kept = pd.read_parquet(out)
    assert kept["max_batch_size"].tolist() == [4, 8, 1]
    cols = ["max_batch_size", "ttft_p50", "e2e_mean"]
    pd.testing.assert_frame_equal(kept[cols].iloc[[2, 0]].reset_index(drop=True), first[cols])
    third = sweep(df, {"max_batch_size": [1, 4, 8]}, out=out, workers=1, progress=False)
    assert third.attrs["computed"] == 0 and third.attrs["kept"] == 0  # all three resumed
    assert third["max_batch_size"].tolist() == [1, 4, 8]
    assert sorted(pd.read_parquet(out)["max_batch_size"]) == [1, 4, 8]  # nothing lost


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(runs=st.lists(st.sets(st.sampled_from([1, 2, 4, 8]), min_size=1), min_size=1, max_size=3))
def test_successive_grids_lose_no_row_and_repeat_none(tmp_path_factory, runs):
    """Any sequence of grids over one field into one file: the file holds one row per value
    ever run (nothing lost, nothing twice) and each table its own grid's points, in order."""
    df = pd.DataFrame({"arrival_time": [0.0, 0.5, 1.0], "num_prompt_tokens": [64, 128, 32],
                       "num_output_tokens": [20, 10, 30]})
    out = tmp_path_factory.mktemp("runs") / "s.parquet"
    seen = set()
    for values in runs:
        grid = sorted(values)
        table = sweep(df, {"max_batch_size": grid}, out=out, workers=1, progress=False)
        assert table["max_batch_size"].tolist() == grid
        assert table.attrs["computed"] == len(set(grid) - seen)
        seen |= set(grid)
        assert table.attrs["kept"] == len(seen - set(grid))
        assert sorted(pd.read_parquet(out)["max_batch_size"]) == sorted(seen)


def test_a_grid_mixing_ints_floats_and_none_resumes_without_rerunning(tmp_path):
    """A column of 1 and 2.5 reads back from parquet as 1.0 and 2.5, one of None and 512 as
    NaN and 512.0: a re-run took those for other points, ran them again and kept the old rows
    beside the new (4 rows for 2 points)."""
    df = pd.DataFrame({"arrival_time": [0.0, 0.5, 1.0], "num_prompt_tokens": [64, 128, 32],
                       "num_output_tokens": [20, 10, 30]})
    for name, grid in (("rate", {"rate": [1, 2.5]}),
                       ("budget", {"token_budget": [None, 512], "scheduler": ["continuous"]})):
        out = tmp_path / f"{name}.parquet"
        first = sweep(df, grid, out=out, workers=1, progress=False)
        again = sweep(df, grid, out=out, workers=1, progress=False)
        assert first.attrs["computed"] == 2
        assert again.attrs["computed"] == 0 and again.attrs["kept"] == 0
        assert len(pd.read_parquet(out)) == 2
        assert again["e2e_mean"].tolist() == first["e2e_mean"].tolist()


def test_a_grid_of_config_objects_writes_its_parquet_and_resumes(tmp_path):
    """SpeculativeConfig, Disaggregation and ClosedLoop values are SimConfig fields like any
    other: with out= the sweep stopped at its first point (pyarrow cannot write the objects);
    the file holds their reprs, and a re-run finds every point again."""
    from sim import Disaggregation, SpeculativeConfig
    df = pd.DataFrame({"arrival_time": [0.0, 0.5, 1.0], "num_prompt_tokens": [64, 128, 32],
                       "num_output_tokens": [20, 10, 30]})
    spec = SpeculativeConfig(num_speculative_tokens=2, acceptance_rate=0.6, method="ngram")
    grid = {"speculative": [None, spec], "disaggregation": [None, Disaggregation(1, 1)],
            "closed_loop": [None, workloads.ClosedLoop(2, 0.5)]}
    out = tmp_path / "s.parquet"
    first = sweep(df, grid, out=out, workers=1, progress=False)
    assert (first["error"] == "").all() and len(first) == 8
    assert first["speculative"].tolist() == [None] * 4 + [spec] * 4  # the table: the objects
    kept = pd.read_parquet(out)
    assert kept["speculative"].iloc[:4].isna().all()  # (None, read back as a missing string)
    assert kept["speculative"].iloc[4:].tolist() == [repr(spec)] * 4
    again = sweep(df, grid, out=out, workers=1, progress=False)
    assert again.attrs["computed"] == 0 and again.attrs["kept"] == 0 and len(
        pd.read_parquet(out)) == 8
    assert again["e2e_mean"].tolist() == first["e2e_mean"].tolist()


def test_a_rate_grid_beside_a_closed_loop_is_refused_before_anything_runs(df):
    """Its users issue the requests as theirs finish: every rate gave the same row."""
    loop = workloads.ClosedLoop(4, 0.0)
    with pytest.raises(ValueError, match=r"^grid point rate=1: rate applies to an open loop"):
        sweep(df, {"rate": [1, 8]}, base=sim.SimConfig(closed_loop=loop), workers=1,
              progress=False)
    with pytest.raises(ValueError, match=r"^grid point rate=1, closed_loop=ClosedLoop"):
        sweep(df, {"rate": [1, 8], "closed_loop": [None, loop]}, workers=1, progress=False)
    users = sweep(df, {"closed_loop": [loop, workloads.ClosedLoop(8, 0.0)]},
                  base=sim.SimConfig(cost_model=sim.ConstantCost(0.01)), workers=1,
                  progress=False)
    assert users["error"].tolist() == ["", ""]  # the users, not the rate, vary


def test_a_grid_over_one_field_of_a_config_object_builds_it_per_point():
    """closed_loop_users, think_time, prefill/decode_replicas, the link and speculation
    settings under sim run's names: each point is the config that object would make (the
    sweep refused them: 'neither SimConfig fields nor ...')."""
    from sim import Disaggregation, SpeculativeConfig
    from sim.engine import run
    df = _grid_df()
    cost = sim.ConstantCost(0.01)
    table = sweep(df, {"closed_loop_users": [2, 8], "think_time": [0.0, 0.5]},
                  base=sim.SimConfig(cost_model=cost), workers=1, progress=False)
    assert (table["error"] == "").all() and len(table) == 4
    for row in table.itertuples():
        loop = workloads.ClosedLoop(row.closed_loop_users, row.think_time)
        assert row.e2e_mean == run(df, cost_model=cost, closed_loop=loop).summary()["e2e_mean"]
    # a pool split over a base without one: Disaggregation(p, d) with the base's defaults
    split = sweep(df, {"prefill_replicas": [1, 2], "link_latency_s": [0.0, 0.01]},
                  base=sim.SimConfig(cost_model=cost), workers=1, progress=False)
    for row in split.itertuples():
        d = Disaggregation(row.prefill_replicas, 1, link_latency_s=row.link_latency_s)
        assert row.ttft_p99 == run(df, cost_model=cost, disaggregation=d).summary()["ttft_p99"]
    assert split["kv_transfer_time_p99"].iloc[1] > split["kv_transfer_time_p99"].iloc[0]
    # speculation: the base's SpeculativeConfig with the point's field
    spec = SpeculativeConfig(num_speculative_tokens=2, acceptance_rate=0.6, method="ngram")
    acc = sweep(df, {"acceptance_rate": [0.3, 0.9]},
                base=sim.SimConfig(cost_model=cost, speculative=spec), workers=1,
                progress=False)
    assert acc["spec_mean_acceptance_length"].is_monotonic_increasing
    assert acc["spec_mean_acceptance_length"].iloc[0] == run(
        df, cost_model=cost, speculative=dataclasses.replace(spec, acceptance_rate=0.3)
    ).summary()["spec_mean_acceptance_length"]


def test_a_config_objects_field_without_the_object_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match=r"^grid point think_time=0.5: think_time set\(s\) "
                                         r"closed_loop's \['think_time'\], but the base config "
                                         r"has no closed_loop"):
        sweep(_grid_df(), {"think_time": [0.5]}, workers=1, progress=False)
    with pytest.raises(ValueError, match=r"prefill_replicas=0: prefill_replicas must be"):
        sweep(_grid_df(), {"prefill_replicas": [0]}, workers=1, progress=False)


@pytest.mark.parametrize("workers", [0, -1, 1.5, True, "2"])
def test_workers_is_none_or_a_count_of_processes_in_sweep_and_plan(df, workers):
    """0 is not "the default" (None is): a bad count is an error before anything runs."""
    said = r"workers must be None \(one process per CPU\) or an integer >= 1, got "
    with pytest.raises(ValueError, match=said):
        sweep([{"workload": df}], workers=workers)
    with pytest.raises(ValueError, match=said):
        sim.plan(df, {"ttft": 1.0}, space={"max_batch_size": [8]}, workers=workers)
