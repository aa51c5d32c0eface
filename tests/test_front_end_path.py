"""experiments/front_end_path.py and the sourced front ends
(``request_path.front_end_path``): the tokeniser's rate is request_overheads.csv's fit row, a
zero path leaves the validation's replay as it is, the sourced one moves a burst's engine
arrivals by the cumulative tokenisation, and the stored tables are consistent with themselves
(their choice is the fit scores' argmin; every variant for every metric and split)."""

import json
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import sim
from sim.costs.overheads import EngineOverheads
from sim.engine.fleet.request_path import front_end_path, overheads

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import front_end_path as fe  # noqa: E402
import validate_independent as vi  # noqa: E402

ROW = "sglang-cookbook:Qwen3:L367"  # (no earlier block on its server)


@pytest.fixture(scope="module")
def runs():
    return vi.load_runs()


@pytest.fixture(scope="module")
def stored():
    return json.loads(resources.files("sim").joinpath("data/front_end_path.json").read_text())


def test_the_front_ends_tokenise_at_the_fit_rows_rate():
    rows = overheads()
    fit = rows[(rows.split == "fit") & (rows.front_end == "hf-tokenizers")]
    for engine in ("sglang", "vllm"):
        path = front_end_path(engine)
        assert path.per_prompt_token_s == pytest.approx(fit["seconds"].mean(), rel=1e-12)
        assert path.per_prompt_token_s == pytest.approx(1.1e-6, rel=1e-12)  # 1.1 s / 1M tokens
        assert path.in_s == path.out_s == 0.0
    with pytest.raises(ValueError, match="engine must be one of sglang, vllm, got 'trt'"):
        front_end_path("trt")


def test_a_zero_path_is_the_validations_replay(runs):
    sub = runs[runs.run_id.isin([ROW, "sglang-cookbook:Qwen3:L423"])]
    ov = {"sglang": "fitted"}
    want = vi.validate(sub, 1, ov, runs_all=runs)
    got = vi.validate(sub, 1, ov, runs_all=runs, paths={"sglang": sim.RequestPath()})
    pd.testing.assert_frame_equal(want, got, check_exact=True)


def test_a_burst_reaches_the_engine_one_tokenisation_apart(runs):
    """The row's closed loop of N clients sending at t = 0 through the sourced front end: the
    first N engine arrivals are the cumulative sums of 1.1 us x their prompts."""
    r = next(runs[runs.run_id == "sglang-cookbook:Qwen3:L479"].itertuples())
    df = vi.workload(r)
    res = sim.run(df, vi.config(r, "fitted", front_end_path("sglang"))).requests
    n = int(r.concurrency)
    np.testing.assert_allclose(res["engine_arrival_time"].to_numpy()[:n],
                               np.cumsum(1.1e-6 * df["num_prompt_tokens"].to_numpy()[:n]),
                               rtol=0, atol=1e-12)
    assert (res["arrival_time"].to_numpy()[:n] == 0).all()


def test_stored_tables_are_consistent(stored):
    scores = stored["fit_scores"]
    assert set(scores) == set(fe.VARIANTS)
    assert stored["best_on_fit"] == min(fe.VARIANTS, key=lambda v: scores[v])
    for r in stored["by_metric"] + stored["per_gpu"]:
        assert all(r[v] is not None and r[v] >= 0 for v in fe.VARIANTS), r
    splits = {(r["metric"], r["split"]) for r in stored["by_metric"]}
    assert {m for m, _ in splits} == set(vi.METRICS) and {s for _, s in splits} == set(vi.SPLITS)
    for e, p in stored["paths"].items():
        assert p["per_prompt_token_s"] == front_end_path(e).per_prompt_token_s


def test_front_end_option_uses_the_stored_refit(runs, stored):
    ov, paths = vi.front_end(runs)
    for e, t in stored["refit"].items():
        assert isinstance(ov[e], EngineOverheads) and ov[e].per_request_s == t["per_request_s"]
        assert ov[e].per_seq_s == t["per_seq_s"] and ov[e].overlap == t["overlap"]
        assert paths[e] == front_end_path(e)
    with pytest.raises(SystemExit):
        vi.main(["--front-end", "--overheads"])
