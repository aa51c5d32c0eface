"""sim compare and sim.results.bench.metrics: a measured run replayed, its metrics computed by
each tool's definitions (checked against the summary's and against closed forms), measured vs
simulated printed with the relative error, a bad file one line."""

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import sim
import workloads
from sim.cli import main
from sim.results.bench.gaps import token_gaps
from sim.results.bench.metrics import compare_rows, tool_metrics

FIX = Path(__file__).parent / "fixtures" / "benchmarks"
COST = ["--cost", "constant:0.01"]


@pytest.fixture(scope="module")
def result():
    df = workloads.load("sharegpt", n=60, rate=6.0, seed=1)
    return sim.run(df, model="llama-3.1-8b", gpu="h100")


def test_each_tools_definitions_against_the_summary(result):
    s = result.summary()
    v = tool_metrics(result, "vllm-bench")
    assert v["mean_ttft_ms"] == pytest.approx(1000 * s["ttft_mean"])
    assert v["p99_tpot_ms"] == pytest.approx(1000 * s["tpot_p99"])
    assert v["p99_itl_ms"] == pytest.approx(1000 * s["itl_p99"])  # pooled, as vLLM's
    assert v["request_throughput"] == pytest.approx(s["request_throughput"])
    a = tool_metrics(result, "aiperf")
    assert a["inter_token_latency.avg"] == pytest.approx(1000 * s["tpot_mean"])  # per request
    assert a["inter_chunk_latency.avg"] == pytest.approx(1000 * s["itl_mean"])
    assert a["benchmark_duration.avg"] == pytest.approx(s["duration"])
    g = tool_metrics(result, "guidellm")
    fin = result.requests[result.requests["status"] == "finished"]
    assert g["time_per_output_token_ms.mean"] == pytest.approx(  # TTFT included
        1000 * (fin["e2e"] / fin["num_output_tokens"]).mean())
    assert g["inter_token_latency_ms.mean"] == pytest.approx(1000 * fin["tpot"].mean())
    assert g["request_latency.p99"] == pytest.approx(s["e2e_p99"])


def test_per_request_gaps_are_the_pooled_itl(result):
    gaps, even = token_gaps(result)
    assert even == 0
    assert np.array_equal(np.sort(np.concatenate(gaps)), np.sort(result.itl()))
    fin = result.requests
    for g, n, ttft, e2e in zip(gaps, fin["num_output_tokens"], fin["ttft"], fin["e2e"]):
        assert len(g) == max(n - 1, 0) and g.sum() == pytest.approx(e2e - ttft)


def test_one_request_alone_closed_form():
    """10 ms a step: the first token after one step, each other after one more."""
    df = pd.DataFrame({"arrival_time": [0.0], "num_prompt_tokens": [100],
                       "num_output_tokens": [5]})
    res = sim.run(df, cost_model=lambda b: 0.01, kv_blocks=100)
    v = tool_metrics(res, "vllm-bench")
    assert v["mean_ttft_ms"] == pytest.approx(10) and v["mean_tpot_ms"] == pytest.approx(10)
    assert v["mean_e2el_ms"] == pytest.approx(50) and v["output_throughput"] == pytest.approx(100)
    g = tool_metrics(res, "guidellm")
    assert g["time_per_output_token_ms.mean"] == pytest.approx(10)  # 50 ms / 5 tokens


def test_compare_rows_relative_error():
    rows = compare_rows({"a": 10.0, "b": 0.0, "c": 1.0}, {"a": 12.0, "b": 1.0, "d": 3.0})
    assert rows[0] == ("a", 10.0, 12.0, pytest.approx(0.2))
    assert rows[1][0] == "b" and rows[1][3] != rows[1][3]  # measured 0: no relative error
    assert [r[0] for r in rows] == ["a", "b"]


@pytest.mark.parametrize("name, loop", [("vllm_bench_detailed.json", "open loop"),
                                        ("vllm_bench_summary.json", "closed loop of 4"),
                                        ("aiperf/profile_export_aiperf.json", "closed loop of 2"),
                                        ("guidellm_benchmarks.json", "closed loop of 2")])
def test_sim_compare_prints_measured_simulated_and_error(name, loop, capsys):
    assert main(["compare", str(FIX / name), *COST]) == 0
    out = capsys.readouterr().out
    assert loop in out
    m = workloads.from_benchmark(FIX / name)
    rows = [line.split() for line in out.splitlines() if re.match(r"^\S+\s+[\d.,]+\s+[\d.,]+", line)]
    assert len(rows) >= 10
    for key, measured, simulated, err in rows:
        assert float(measured.replace(",", "")) == pytest.approx(m.metrics[key], rel=1e-3)
        expect = float(simulated.replace(",", "")) / float(measured.replace(",", "")) - 1
        assert float(err.rstrip("%")) / 100 == pytest.approx(expect, abs=2e-3)


def test_sim_compare_closed_form_of_one_request(tmp_path, capsys):
    doc = json.loads((FIX / "vllm_bench_detailed.json").read_text())
    doc.update({"input_lens": [100], "output_lens": [5], "start_times": [7.0], "ttfts": [0.01],
                "itls": [[0.01] * 4], "errors": [""], "generated_texts": ["abcde"],
                "latencies": [0.05], "mean_ttft_ms": 10.0, "mean_tpot_ms": 12.5})
    path = tmp_path / "one.json"
    path.write_text(json.dumps(doc))
    assert main(["compare", str(path), *COST, "--all"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"mean_ttft_ms\s+10\s+10\s+\+0\.0%", out)
    assert re.search(r"mean_tpot_ms\s+12\.5\s+10\s+-20\.0%", out)


def test_sim_compare_report(tmp_path, capsys):
    page = tmp_path / "r.html"
    assert main(["compare", str(FIX / "vllm_bench_summary.json"), *COST,
                 "--report", str(page)]) == 0
    text = page.read_text()
    assert "Measured (vllm-bench) vs simulated" in text and "p99_ttft_ms" in text


def test_sim_compare_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"backend": "openai", "completed": 3, "request_throughput": 1}))
    assert main(["compare", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sim compare: error:" in err and "bad.json: duration" in err
    assert main(["compare", str(FIX / "guidellm_sweep.json"), *COST]) == 2
    assert "pass index=" in capsys.readouterr().err
    assert main(["compare", str(FIX / "guidellm_sweep.json"), "--index", "0", "--tp", "3"]) == 2
    assert "--tp" in capsys.readouterr().err


def test_sim_compare_help_has_the_engine_flags_not_the_workloads(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    out = capsys.readouterr().out
    assert "--model" in out and "--scheduler" in out and "--workload" not in out


@pytest.mark.parametrize("drop", ["input_lens", "output_lens", "start_times"])
def test_a_detailed_file_missing_one_list_is_named_not_replayed_as_means(drop, tmp_path,
                                                                          capsys):
    """Dropping one per-request list made sim compare replay mean lengths, evenly spaced,
    under a note blaming --save-detailed (-80 % on TTFT P99): now the list is named."""
    doc = json.loads((FIX / "vllm_bench_detailed.json").read_text())
    del doc[drop]
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(doc))
    assert main(["compare", str(path), *COST]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cut.json: {drop}: missing while " in err
