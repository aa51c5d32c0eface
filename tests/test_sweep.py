"""sim/tools/sweep.py: job validation, one row per job in job order, labels as columns, the same
table in this process and in a process pool. (The Dask path: tests/test_experiments.py.)"""

import pandas as pd
import pytest

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
