"""The independent validation set (sim/data/validation_runs.csv, experiments/
validate_independent.py): complete and sourced rows, the stated split rule, the benchmark's
random sampler reproduced (its totals equal the published ones), and a rerun that reproduces
the stored report (sim/data/independent_check.json) exactly."""

import json
import math
import sys
from importlib import resources
from pathlib import Path

import pandas as pd
import pytest

import workloads

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import validate_independent as vi  # noqa: E402

# the source's own misprint, stated in the CSV's header (the same command on the other pages
# prints the sampler's totals)
MISPRINTED_INPUT = {"sglang-cookbook:Llama4:L186", "sglang-cookbook:Llama4:L238"}


@pytest.fixture(scope="module")
def runs():
    return vi.load_runs()


@pytest.fixture(scope="module")
def stored():
    return json.loads(resources.files("sim").joinpath("data/independent_check.json").read_text())


def test_rows_cover_three_gpus_two_engines_with_full_setups(runs):
    assert len(runs) >= 30 and runs["gpu"].nunique() >= 3 and runs["engine"].nunique() >= 2
    assert runs["run_id"].is_unique
    for col in vi.REQUIRED:
        assert runs[col].notna().all(), col


def test_split_alternates_within_each_source_page(runs):
    page = runs["run_id"].str.rsplit(":", n=1).str[0]
    for _, g in runs.groupby(page, sort=False):
        expect = ["fit" if i % 2 == 0 else "held_out" for i in range(len(g))]
        assert list(g["split"]) == expect


def test_random_sampler_reproduces_published_totals(runs):
    rnd = runs[runs["lengths"] == "sglang-random"]
    assert len(rnd) >= 25
    for r in rnd.itertuples():
        p, o = vi.sglang_random_lengths(r.num_prompts, r.input_len, r.output_len,
                                        r.output_min, r.seed)
        assert o.sum() == r.total_output_tokens, r.run_id
        if r.run_id not in MISPRINTED_INPUT:
            assert p.sum() == r.total_input_tokens, r.run_id


def test_vllm_random_lengths_lie_in_the_tools_range():
    p, o = vi.vllm_random_lengths(2000, 20000, 2000, 0.15, 0)
    assert p.min() >= 17000 and p.max() <= 23000 and o.min() >= 1700 and o.max() <= 2300
    assert p.mean() == pytest.approx(20000, rel=0.01) and o.mean() == pytest.approx(2000, rel=0.01)
    p0, o0 = vi.vllm_random_lengths(5, 100, 10, 0.0, 0)
    assert (p0 == 100).all() and (o0 == 10).all()  # range ratio 0: fixed lengths


def test_sharegpt_rows_keep_the_published_means(runs):
    rows = runs[runs["lengths"].isin(["sharegpt-scaled", "vllm-sharegpt"])]
    assert (rows["lengths"] == "vllm-sharegpt").sum() >= 15
    for r in rows.itertuples():
        w = vi.workload(r)
        assert len(w) == r.num_prompts
        assert w["num_prompt_tokens"].mean() == pytest.approx(
            r.total_input_tokens / r.num_prompts, rel=0.15)
        if r.lengths == "vllm-sharegpt":  # the tool's draw scaled: means within rounding
            assert w["num_prompt_tokens"].sum() == pytest.approx(r.total_input_tokens, rel=2e-3)
            assert w["num_output_tokens"].sum() == pytest.approx(r.total_output_tokens, rel=2e-3)


def test_vllm_sharegpt_rows_are_the_tools_draw_scaled(runs):
    """The lengths are vllm bench serve's ShareGPT sampler's (its shuffle and filter), each
    scaled by one factor: their order by length is the draw's, and the first 100 of a
    1,000-prompt row are a 100-prompt row's draw (one shuffle, taken in order)."""
    r = next(runs[(runs["lengths"] == "vllm-sharegpt") & (runs["num_prompts"] == 1000)]
             .itertuples())
    w, draw = vi.workload(r), workloads.vllm_sharegpt(1000, seed=int(r.seed))
    ratio = w["num_prompt_tokens"].to_numpy() / draw["num_prompt_tokens"].to_numpy()
    assert ratio.max() - ratio.min() < 0.5 / draw["num_prompt_tokens"].min() * 2 + 1e-9
    small = workloads.vllm_sharegpt(100, seed=int(r.seed))
    assert (small["num_prompt_tokens"].to_numpy() ==
            draw["num_prompt_tokens"].to_numpy()[:100]).all()


def test_gpustack_random_rows_generated_every_asked_token(runs):
    """The inclusion rule of the GPUStack rows: a random block is in only where its answers
    ran to the asked length (fixed lengths: range ratio 0), so the replay's lengths are the
    run's; the inputs match the client's counts to its tokenisation round trip (< 1 %)."""
    rnd = runs[runs["run_id"].str.startswith("gpustack") & (runs["lengths"] == "vllm-random")]
    assert len(rnd) >= 8
    for r in rnd.itertuples():
        assert r.total_output_tokens == r.num_prompts * r.output_len, r.run_id
        p, o = vi.vllm_random_lengths(r.num_prompts, r.input_len, r.output_len,
                                      r.range_ratio, r.seed)
        assert o.sum() == r.total_output_tokens
        assert p.sum() == pytest.approx(r.total_input_tokens, rel=1e-2), r.run_id


def test_each_engine_is_measured_on_three_gpus_in_both_splits(runs):
    for engine, g in runs.groupby("engine"):
        assert g["gpu"].nunique() >= 3, engine
        assert g[g["split"] == "held_out"]["gpu"].nunique() >= 3, engine


def test_no_measurement_is_in_the_set_twice(runs):
    """A page that prints one run twice keeps it once (else it could sit in both splits)."""
    key = ["engine", "gpu", "model", "num_prompts", "concurrency", "total_input_tokens",
           "total_output_tokens", "ttft_p50_ms", "output_throughput"]
    assert not runs.duplicated(key).any()


def test_bad_rows_are_refused(monkeypatch, tmp_path, runs):
    bad = runs.copy()
    bad.loc[0, "split"] = "train"
    path = tmp_path / "validation_runs.csv"
    bad.to_csv(path, index=False)
    monkeypatch.setattr(vi, "DATA", tmp_path)
    with pytest.raises(ValueError, match="split 'train'"):
        vi.load_runs()


def test_rerun_reproduces_the_stored_report(runs, stored):
    part = runs[runs["concurrency"] <= 16].head(6)
    table = vi.validate(part, workers=1, runs_all=runs)  # (warm: the whole page's history)
    want = {(r["run_id"], r["metric"]): r["predicted"] for r in stored["rows"]}
    for r in table.itertuples():
        assert r.predicted == want[r.run_id, r.metric]
    # the medians stored are the rows' medians
    full = pd.DataFrame(stored["rows"])
    m = vi.medians(full, ("metric", "split")).to_dict("records")
    assert len(m) == len(stored["by_metric"])
    for a, b in zip(m, stored["by_metric"]):
        assert (a["metric"], a["split"], a["rows"]) == (b["metric"], b["split"], b["rows"])
        assert a["median_abs_error"] == pytest.approx(b["median_abs_error"], abs=1e-12)


def test_median_abs_columns_sets_variants_side_by_side():
    """One column per variant, the median |error| of each group (closed form), groups a
    variant lacks as NaN."""
    t = pd.DataFrame({"metric": ["a", "a", "a", "b"], "split": ["fit"] * 4,
                      "error": [-0.3, 0.1, 0.2, -0.5]})
    out = vi.median_abs_columns({"x": t, "y": t.iloc[:3].assign(error=[0.4, -0.4, 1.0])},
                                ("metric", "split"))
    assert list(out.columns) == ["metric", "split", "x", "y"]
    assert out["x"].tolist() == [0.2, 0.5]
    assert out["y"].iloc[0] == 0.4 and math.isnan(out["y"].iloc[1])
