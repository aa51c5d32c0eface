"""sim run --format vllm-bench|aiperf|guidellm: a run written in each tool's schema reads back
through workloads.from_benchmark as the same workload, loop and metrics (the round trip), and
the files hold what each tool's own definitions give."""

import json

import numpy as np
import pandas as pd
import pytest

import sim
import workloads
from sim.cli import main
from sim.results.bench import FORMATS
from sim.results.bench.files import export
from sim.results.bench.metrics import tool_metrics

MAIN = {"vllm-bench": "vllm-bench.json", "aiperf": "profile_export_aiperf.json",
        "guidellm": "benchmarks.json"}


def _write(res, fmt, info, folder):
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in export(res, fmt, info).items():
        (folder / name).write_text(text)
    return folder / MAIN[fmt]


@pytest.fixture(scope="module")
def runs():
    df = workloads.load("sharegpt", n=40, rate=5.0, seed=3)
    df["num_output_tokens"] = df["num_output_tokens"].clip(upper=80)
    df.loc[5, "num_output_tokens"] = 1  # a one-token request: no TPOT, no gap
    open_loop = sim.run(df, model="llama-3.1-8b", gpu="h100")
    closed = sim.run(df, model="llama-3.1-8b", gpu="h100", closed_loop=workloads.ClosedLoop(3))
    return df, {"open": (open_loop, {"model": "llama-3.1-8b", "rate": 5.0, "concurrency": None}),
                "closed": (closed, {"model": "llama-3.1-8b", "rate": None, "concurrency": 3})}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("loop", ["open", "closed"])
def test_round_trip(fmt, loop, runs, tmp_path):
    _, by_loop = runs
    res, info = by_loop[loop]
    m = workloads.from_benchmark(_write(res, fmt, info, tmp_path))
    assert m.tool == fmt and m.per_request and m.num_failed == 0
    assert m.concurrency == info["concurrency"]
    if loop == "open" and fmt != "guidellm":
        assert m.rate == 5.0
    req = res.requests.sort_values("arrival_time", kind="stable")
    assert m.workload["num_prompt_tokens"].tolist() == req["num_prompt_tokens"].tolist()
    assert m.workload["num_output_tokens"].tolist() == req["num_output_tokens"].tolist()
    t = req["arrival_time"].to_numpy()
    assert np.allclose(m.workload["arrival_time"], t - t.min(), atol=1e-9)
    sim_m = tool_metrics(res, fmt)
    common = [k for k in m.metrics if k in sim_m]
    assert len(common) >= 15
    for k in common:  # AIPerf's times are whole nanoseconds
        assert m.metrics[k] == pytest.approx(sim_m[k], rel=1e-6, nan_ok=True), k


def test_the_replay_of_an_export_is_the_run(runs, tmp_path, capsys):
    """sim run --format, then sim compare on its file: every metric within rounding."""
    df, _ = runs
    wl = tmp_path / "w.csv"
    df.to_csv(wl, index=False)
    for fmt in FORMATS:
        out = tmp_path / fmt
        assert main(["run", "-w", str(wl), "--closed-loop", "3", "--format", fmt.upper(),
                     "-o", str(out), "-q"]) == 0
        assert main(["compare", str(out / MAIN[fmt]), "--all"]) == 0
        text = capsys.readouterr().out
        errors = [line.split()[-1] for line in text.splitlines() if line.endswith("%")]
        assert len(errors) >= 15 and set(errors) == {"+0.0%"}, text


def test_vllm_file_holds_vllms_definitions(runs, tmp_path):
    _, by_loop = runs
    res, info = by_loop["closed"]
    doc = json.loads(_write(res, "vllm-bench", info, tmp_path).read_text())
    assert doc["max_concurrency"] == 3 and doc["request_rate"] == "inf"
    assert doc["max_concurrent_requests"] == 3
    for ttft, itl, lat, n in zip(doc["ttfts"], doc["itls"], doc["latencies"],
                                 doc["output_lens"]):
        assert len(itl) == n - 1 and ttft + sum(itl) == pytest.approx(lat)
    pooled = np.array([g for gaps in doc["itls"] for g in gaps]) * 1000
    assert doc["median_itl_ms"] == pytest.approx(np.median(pooled))
    assert doc["p99_e2el_ms"] == pytest.approx(1000 * np.percentile(doc["latencies"], 99))


def test_rejected_requests_are_the_tools_failed_ones(tmp_path):
    df = pd.DataFrame({"arrival_time": [0.0, 0.1, 0.2], "num_prompt_tokens": [100, 5000, 80],
                       "num_output_tokens": [4, 4, 6]})
    res = sim.run(df, cost_model=lambda b: 0.01, kv_blocks=200, max_model_len=1000)
    assert res.summary()["num_rejected"] == 1
    for fmt in FORMATS:
        m = workloads.from_benchmark(_write(res, fmt, {"model": "x", "rate": None,
                                                       "concurrency": None}, tmp_path / fmt))
        assert m.num_failed == 1 and m.workload["num_prompt_tokens"].tolist() == [100, 80]
    doc = json.loads((tmp_path / "vllm-bench" / "vllm-bench.json").read_text())
    assert doc["failed"] == 1 and doc["errors"][1].startswith("context_length")


def test_format_setting_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "-w", "azure-code", "-n", "5", "--format", "csv", "-o", str(tmp_path / "o")])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
    cfg = tmp_path / "x.toml"
    cfg.write_text(f'workload = "azure-code"\nnum_requests = 5\nformat = "json"\n'
                   f'output = "{tmp_path / "o"}"\n')
    assert main(["run", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "format 'json' is not a format" in err
    cfg.write_text(f'workload = "azure-code"\nnum_requests = 5\nformat = "GuideLLM"\n'
                   f'output = "{tmp_path / "o"}"\n')
    assert main(["run", str(cfg), "-q"]) == 0
    assert (tmp_path / "o" / "benchmarks.json").is_file()
