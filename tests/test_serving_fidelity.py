"""The serving check (experiments/validate_serving.py): its data file is complete and sourced,
its workloads are what the sources describe, and a rerun of part of it reproduces the stored
report (sim/data/serving_check.json) exactly - whatever the errors are."""

import dataclasses
import json
from importlib import resources

import numpy as np
import pandas as pd
import pytest

from sim.costs.roofline_params import fitted_params


@pytest.fixture(scope="module")
def vs():
    import importlib.util
    import sys
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "experiments" / "validate_serving.py"
    spec = importlib.util.spec_from_file_location("validate_serving", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves its annotations in its module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def rows(vs):
    return vs.load_rows()


@pytest.fixture(scope="module")
def stored():
    return json.loads(resources.files("sim").joinpath("data/serving_check.json").read_text())


def test_data_file_is_complete_and_sourced(vs, rows):
    assert list(rows.columns) == list(vs.COLUMNS)
    assert len(rows) == 521
    assert set(rows["engine"]) == set(vs.ENGINES)
    assert (rows["split"] == "held-out").all()  # nothing in this file is fitted
    assert (rows["value"] > 0).all() and (rows["num_requests"] >= 1).all()
    for r in rows.itertuples():
        # a repository at a 40-hex commit, the file and the table the number comes from
        repo, rest = r.source.split(" @ ", 1)
        assert "/" in repo and len(rest.split(" ")[0]) == 40, r.source
        assert ".md" in rest and "'" in rest, r.source
    closed = rows[rows["scenario"] == "closed_loop"]
    assert closed["concurrency"].notna().all() and (closed["lengths"] == "sharegpt-scaled").all()
    offline = rows[rows["scenario"] == "offline"]
    assert offline["concurrency"].isna().all() and offline["request_rate"].isna().all()
    assert (rows.loc[rows["scenario"] == "poisson", "request_rate"] > 0).all()
    notice = resources.files("sim").joinpath("data/NOTICE.md").read_text()
    assert "published_serving.csv" in notice and "serving_check.json" in notice


def test_a_row_without_a_source_or_split_is_refused(vs, rows, monkeypatch, tmp_path):
    bad = rows.copy()
    bad.loc[3, "source"] = "a blog"
    path = tmp_path / "published_serving.csv"
    bad.to_csv(path, index=False)
    monkeypatch.setattr(vs, "DATA", tmp_path)
    with pytest.raises(ValueError, match="row 3: source 'a blog'"):
        vs.load_rows()
    bad = rows.copy()
    bad.loc[5, "split"] = "maybe"
    bad.to_csv(path, index=False)
    with pytest.raises(ValueError, match="row 5: split 'maybe'"):
        vs.load_rows()
    bad = rows.copy()
    poisson = rows.index[rows["scenario"] == "poisson"][0]
    bad.loc[poisson, "request_rate"] = None
    bad.to_csv(path, index=False)
    with pytest.raises(ValueError, match=f"row {poisson}: scenario 'poisson' without"):
        vs.load_rows()


def test_workloads_are_what_the_sources_describe(vs, rows):
    fixed = rows[rows["lengths"] == "fixed"].iloc[0]
    df = vs.workload(fixed)
    assert len(df) == fixed.num_requests and (df["arrival_time"] == 0).all()
    assert (df["num_prompt_tokens"] == fixed.input_tokens).all()
    assert (df["num_output_tokens"] == fixed.output_tokens).all()
    for r in rows[rows["lengths"] == "sharegpt-scaled"].drop_duplicates("input_tokens").itertuples():
        df = vs.workload(r)
        assert len(df) == 3000
        # scaled to the row's published means; the 3,000 drawn keep them within 4 %
        assert df["num_prompt_tokens"].mean() == pytest.approx(r.input_tokens, rel=0.04)
        assert df["num_output_tokens"].mean() == pytest.approx(r.output_tokens, rel=0.04)
        assert df["num_prompt_tokens"].min() >= 1 and df["num_output_tokens"].min() >= 1
    assert vs.workload(fixed, max_requests=10).shape[0] == 10
    pd.testing.assert_frame_equal(vs.workload(r), vs.workload(r))  # seeded
    for r in rows[rows["scenario"] == "poisson"].drop_duplicates("request_rate").itertuples():
        t = vs.workload(r)["arrival_time"].to_numpy()
        assert len(t) == 500 and (np.diff(t) >= 0).all()
        # 500 exponential gaps: their mean is 1 / rate within 15 % (6.7 standard errors)
        assert len(t) / t[-1] == pytest.approx(r.request_rate, rel=0.15)


def test_configs_follow_each_engines_documented_settings(vs, rows):
    trt = rows[(rows["engine"] == "tensorrt-llm-1.0") & (rows["tensor_parallel"] == 2)].iloc[0]
    c = vs.config(trt)
    assert (c.scheduler, c.max_batch_size, c.token_budget) == ("tensorrt-llm", 2048, 8192)
    assert c.resolved().block_size == 32  # TensorRT-LLM's tokens_per_block
    assert c.cost_model.params.cuda_graph_max_batch == 8192
    assert c.cost_model.params.custom_allreduce_max_bytes == fitted_params(
        "h100").custom_allreduce_max_bytes > 0
    assert c.closed_loop is None and (c.weight_dtype, c.kv_dtype) == ("fp8", "fp8")
    # the pool: TensorRT-LLM's accounting at the 0.95 its published runs used (0.9 behind
    # Triton, the executor's default), max_num_tokens 8,192 sizing the activations
    from sim.specs.gpus import get_gpu
    from sim.specs.memory import memory_budget

    def trt_blocks(r, f):
        return memory_budget(r.model, get_gpu(r.gpu).memory_gb,
                             tensor_parallel=int(r.tensor_parallel), weight_dtype=r.weight_dtype,
                             kv_dtype=r.kv_dtype, accounting="tensorrt-llm", block_size=32,
                             max_num_batched_tokens=8192, free_gpu_memory_fraction=f).kv_blocks
    assert c.kv_blocks is None and c.free_gpu_memory_fraction == 0.95  # the preset's knob
    assert c.resolved_kv_blocks() == trt_blocks(trt, 0.95)
    assert vs.ENGINES["tensorrt-llm-1.0"].kv_fraction == 0.95
    # trtllm-bench runs with chunked context (its --enable_chunked_context default)
    assert c.enable_chunked_context is True
    old = rows[rows["engine"] == "tensorrt-llm-0.17"].iloc[0]
    c = vs.config(old)
    assert (c.scheduler, c.max_batch_size, c.token_budget) == ("tensorrt-llm", 4096, 8192)
    assert c.cost_model.params.cuda_graph_max_batch == vs.NO_DECODE_GAPS
    assert c.resolved_kv_blocks() == trt_blocks(old, 0.95) and c.enable_chunked_context
    tight = rows[(rows["engine"] == "tensorrt-llm-0.17") & (rows["gpu"] == "h100")
                 & (rows["model"] == "llama-3.1-70b") & (rows["tensor_parallel"] == 1)].iloc[0]
    # 2,218 blocks of 32 tokens (4,436 of 16); vLLM's accounting at 0.9 gave 1,753 of 16
    assert vs.config(tight).resolved_kv_blocks() == 2_218
    triton = rows[rows["engine"] == "tensorrt-llm-0.14-triton"].iloc[0]
    assert vs.config(triton).resolved_kv_blocks() == trt_blocks(triton, 0.9)
    assert vs.config(triton).scheduler == "tensorrt-llm"  # Triton's default policy too
    assert not vs.config(triton).resolved().enable_chunked_context  # the backend's default
    lmd = rows[(rows["engine"] == "lmdeploy-0.1-turbomind") & (rows["concurrency"] == 256)].iloc[0]
    c = vs.config(lmd)
    assert c.max_batch_size == 256 and c.closed_loop.num_users == 256
    assert c.cost_model.params.custom_allreduce_max_bytes == 0  # NCCL only
    assert c.tensor_parallel == 4 and c.model == "llama-2-70b" and c.gpu == "a100"
    assert c.kv_blocks is None  # LMDeploy's pool: vLLM's accounting (SimConfig's)
    assert c.scheduler == "continuous"


def _subset(rows):
    """A cheap part (each run well under a second on the build VM): every engine and scenario,
    every GPU, TP 1-8, a dense, a grouped-query and a mixture-of-experts model, all metrics."""
    pick = [("tensorrt-llm-1.0", "h100", "llama-3.1-8b", 1, 2048, 128, None),
            ("tensorrt-llm-0.17", "l40s", "llama-3.1-70b", 4, 2048, 128, None),
            ("tensorrt-llm-0.17", "a100", "mixtral-8x7b", 2, 5000, 500, None),
            ("tensorrt-llm-0.17", "h200", "llama-3.1-405b", 8, 2048, 128, None),
            ("tensorrt-llm-0.14-triton", "h100", "llama-3.1-70b", 4, 467, 16, 8),
            ("tensorrt-llm-0.14-triton", "h200", "llama-3.1-8b", 1, 202, 214, None)]
    out = []
    for engine, gpu, model, tp, i, o, rate in pick:
        m = ((rows["engine"] == engine) & (rows["gpu"] == gpu) & (rows["model"] == model)
             & (rows["tensor_parallel"] == tp) & (rows["input_tokens"] == i)
             & (rows["output_tokens"] == o)
             & (rows["request_rate"].isna() if rate is None else rows["request_rate"] == rate))
        assert m.any(), (engine, gpu, model, tp, i, o, rate)
        out += list(rows.index[m])
    return out + list(rows.index[(rows["engine"] == "lmdeploy-0.1-turbomind")
                                 & (rows["concurrency"] == 256)])


@pytest.mark.determinism  # (.ci/run: under two OpenBLAS kernels)
def test_a_rerun_reproduces_the_stored_report_exactly(vs, rows, stored):
    assert len(stored["rows"]) == len(rows) and stored["seed"] == vs.SEED
    subset = _subset(rows)
    assert len(subset) == 11
    table = vs.validate(rows.loc[subset])
    for got, i in zip(table.to_dict(orient="records"), subset):
        want = stored["rows"][i]
        assert got["row"] == want["row"] == i
        assert (got["engine"], got["metric"], got["measured"]) == (
            want["engine"], want["metric"], want["measured"]), i
        assert got["requests"] == want["requests"] == rows.loc[i, "num_requests"]
        # deterministic: the same config and seed give the same number bit for bit
        assert got["predicted"] == want["predicted"], (
            f"row {i}: {got['predicted']} != stored {want['predicted']}: the simulator's "
            f"predictions changed; rerun python experiments/validate_serving.py --write and "
            f"update the README's serving rows")
        assert got["error"] == want["predicted"] / want["measured"] - 1.0


def test_the_stored_summary_is_the_medians_of_the_stored_rows(vs, stored):
    table = pd.DataFrame(stored["rows"])
    assert np.allclose(table["error"], table["predicted"] / table["measured"] - 1, rtol=0,
                       atol=1e-15)
    summary = vs.report(table)
    for got, want in zip(summary.to_dict(orient="records"), stored["summary"]):
        assert got == pytest.approx(want)
    assert {(s["engine"], s["metric"]) for s in stored["summary"]} == set(
        zip(table["engine"], table["metric"]))


def test_tensorrt_llm_rows_reserve_whole_requests_and_never_preempt(vs, rows):
    """The memory-tight row (Llama-3.1-70B FP8 on one H100, 2,048 + 128 tokens): the preset's
    GUARANTEED_NO_EVICT admission preempts nothing and, with fixed lengths, runs at most the
    pool's blocks over one request's blocks to completion at once; the preempting
    ``continuous`` scheduler on the same pool preempts."""
    import sim
    r = rows[(rows["engine"] == "tensorrt-llm-0.17") & (rows["gpu"] == "h100")
             & (rows["model"] == "llama-3.1-70b") & (rows["tensor_parallel"] == 1)
             & (rows["input_tokens"] == 2048) & (rows["output_tokens"] == 128)].iloc[0]
    cfg = vs.config(r)
    blocks = cfg.resolved_kv_blocks()
    per_request = -(-(2048 + 128) // 32)
    df = vs.workload(r, max_requests=300)
    res = sim.run(df, cfg)
    assert res.summary()["num_preemptions"] == 0
    assert res.iterations["num_running"].max() == blocks // per_request < cfg.max_batch_size
    old = dataclasses.replace(cfg, scheduler="continuous", block_size=32, kv_blocks=blocks,
                              free_gpu_memory_fraction=None, enable_chunked_context=None)
    assert sim.run(df, old).summary()["num_preemptions"] > 0  # the pool is tight here


def test_every_request_comes_out(vs, rows):
    import sim
    r = rows[rows["concurrency"] == 256].iloc[0]  # closed loop, 256 users, 3,000 requests
    result = sim.run(vs.workload(r), vs.config(r))
    s = result.summary()
    assert s["num_finished"] == 3000 and s["num_rejected"] == 0
    assert s["output_token_throughput"] == pytest.approx(
        result.requests["num_output_tokens"].sum() / s["duration"])


def test_main_prints_and_refuses_bad_arguments(vs, rows, capsys, monkeypatch):
    part = rows.loc[_subset(rows)]
    monkeypatch.setattr(vs, "load_rows", lambda: part)
    table, summary = vs.main(["--max-requests", "20", "--workers", "1"])
    out = capsys.readouterr().out
    assert "median_abs_error" in out and "ran fewer requests than published" in out
    assert all(f"  {name}: {e.note}" in out for name, e in vs.ENGINES.items())
    assert (table["requests"] <= 20).all() and len(table) == 11
    assert set(summary["engine"]) == set(vs.ENGINES)
    with pytest.raises(SystemExit):
        vs.main(["--max-requests", "0"])
    with pytest.raises(SystemExit):
        vs.main(["--write", "--max-requests", "20"])
    with pytest.raises(SystemExit):
        vs.main(["--workers", "0"])
