"""workloads.from_benchmark: the three tools' result files read back (fixtures in
tests/fixtures/benchmarks/, their schemas' sources in its README), the workload they ran and the
metrics in each tool's names; bad files a one-line error naming the file and the field."""

import json
import shutil

import numpy as np
import pytest

import workloads
from workloads.benchmarks.common import Measured

FIX = __import__("pathlib").Path(__file__).parent / "fixtures" / "benchmarks"
# a real AIPerf 0.13.0 run against sim serve (examples/aiperf/README.md)
REAL_AIPERF = FIX.parents[1].parent / "examples" / "aiperf" / "profile_export_aiperf.json"


def test_vllm_detailed_workload_and_metrics():
    m = workloads.from_benchmark(FIX / "vllm_bench_detailed.json")
    doc = json.loads((FIX / "vllm_bench_detailed.json").read_text())
    assert isinstance(m, Measured) and m.tool == "vllm-bench" and m.per_request
    assert m.num_failed == 1 and m.rate == 2.0 and m.concurrency is None
    ok = [i for i, e in enumerate(doc["errors"]) if not e]
    assert m.workload["num_prompt_tokens"].tolist() == [doc["input_lens"][i] for i in ok]
    assert m.workload["num_output_tokens"].tolist() == [doc["output_lens"][i] for i in ok]
    t0 = doc["start_times"][0]
    assert np.allclose(m.workload["arrival_time"], [doc["start_times"][i] - t0 for i in ok])
    for key in ("mean_ttft_ms", "p99_itl_ms", "median_tpot_ms", "std_e2el_ms",
                "request_throughput", "output_throughput", "duration", "completed"):
        assert m.metrics[key] == doc[key]
    # the fixture follows vLLM's definitions: TPOT excludes the first token, ITL pooled
    tpot = [(doc["latencies"][i] - doc["ttfts"][i]) / (doc["output_lens"][i] - 1) for i in ok]
    assert m.metrics["mean_tpot_ms"] == pytest.approx(1000 * np.mean(tpot))
    itl = [x for i in ok for x in doc["itls"][i]]
    assert m.metrics["median_itl_ms"] == pytest.approx(1000 * np.median(itl))


def test_vllm_summary_is_rebuilt_as_a_closed_loop():
    m = workloads.from_benchmark(FIX / "vllm_bench_summary.json")
    assert not m.per_request and m.concurrency == 4 and m.rate is None
    assert len(m.workload) == 40
    assert set(m.workload["num_prompt_tokens"]) == {256}
    assert set(m.workload["num_output_tokens"]) == {64}
    assert "mean_e2el_ms" not in m.metrics  # not in the default --percentile-metrics
    assert any("--save-detailed" in n for n in m.notes)


def test_aiperf_records_follow_aiperfs_definitions():
    m = workloads.from_benchmark(FIX / "aiperf" / "profile_export.jsonl")
    recs = [json.loads(x) for x in (FIX / "aiperf" / "profile_export.jsonl").open()]
    good = [r for r in recs if r["error"] is None]
    assert m.tool == "aiperf" and m.num_failed == 1 and len(m.workload) == 4
    assert m.workload["num_prompt_tokens"].tolist() == [
        r["metrics"]["input_sequence_length"]["value"] for r in good]
    starts = [r["metadata"]["request_start_ns"] for r in good]
    assert np.allclose(m.workload["arrival_time"], (np.array(starts) - starts[0]) / 1e9)
    ttft = [r["metrics"]["time_to_first_token"]["value"] for r in good]
    assert m.metrics["time_to_first_token.avg"] == pytest.approx(np.mean(ttft))
    assert m.metrics["time_to_first_token.p99"] == pytest.approx(np.percentile(ttft, 99))
    ends = [r["metadata"]["request_end_ns"] for r in good]
    duration = (max(ends) - min(starts)) / 1e9
    assert m.metrics["benchmark_duration.avg"] == pytest.approx(duration)
    assert m.metrics["request_throughput.avg"] == pytest.approx(4 / duration)
    # the summary the tool wrote for the same records agrees with what we derive from them
    s = workloads.from_benchmark(FIX / "aiperf" / "profile_export_aiperf.json")
    for key in ("time_to_first_token.avg", "inter_token_latency.p50", "request_latency.std",
                "request_throughput.avg", "output_token_throughput.avg"):
        assert s.metrics[key] == pytest.approx(m.metrics[key])


def test_aiperf_summary_reads_its_records_and_its_concurrency():
    s = workloads.from_benchmark(FIX / "aiperf" / "profile_export_aiperf.json")
    assert s.per_request and s.concurrency == 2 and len(s.workload) == 4


def test_a_real_aiperf_0_13_run_reads_its_phases():
    """AIPerf 0.13.0's own files (run against sim serve): the load is in input_config.phases."""
    s = workloads.from_benchmark(REAL_AIPERF)
    assert s.tool == "aiperf" and s.concurrency == 3 and s.per_request and s.num_failed == 0
    assert len(s.workload) == 6 and set(s.workload["num_prompt_tokens"]) == {300}
    assert set(s.workload["num_output_tokens"]) == {8}
    assert s.metrics["request_count.avg"] == 6
    assert 0 < s.metrics["time_to_first_token.avg"] < s.metrics["request_latency.avg"]


def test_a_run_against_a_slowed_server_is_brought_back_to_simulated_time():
    path = REAL_AIPERF
    wall = workloads.from_benchmark(path)
    assert workloads.from_benchmark(path, time_scale=1).metrics == wall.metrics
    s = workloads.from_benchmark(path, time_scale=4)
    m, w = s.metrics, wall.metrics
    assert m["time_to_first_token.p99"] == pytest.approx(w["time_to_first_token.p99"] / 4)
    assert m["benchmark_duration.avg"] == pytest.approx(w["benchmark_duration.avg"] / 4)
    assert m["request_throughput.avg"] == pytest.approx(w["request_throughput.avg"] * 4)
    assert m["output_token_throughput_per_user.avg"] == pytest.approx(
        w["output_token_throughput_per_user.avg"] * 4)
    assert m["request_count.avg"] == 6 and m["input_sequence_length.avg"] == 300
    assert np.allclose(s.workload["arrival_time"], wall.workload["arrival_time"] / 4)
    assert "--time-scale 4" in s.notes[-1] and s.concurrency == 3
    v = workloads.from_benchmark(FIX / "vllm_bench_detailed.json", time_scale=2)
    v1 = workloads.from_benchmark(FIX / "vllm_bench_detailed.json")
    assert v.metrics["mean_ttft_ms"] == v1.metrics["mean_ttft_ms"] / 2
    assert v.metrics["completed"] == v1.metrics["completed"] and v.rate == 2 * v1.rate
    with pytest.raises(ValueError, match="time_scale must be a number > 0"):
        workloads.from_benchmark(path, time_scale=0)


def test_aiperf_phases_name_the_bad_field(tmp_path):
    doc = json.loads(REAL_AIPERF.read_text())
    doc["input_config"]["phases"][0]["concurrency"] = 0
    path = tmp_path / "profile_export_aiperf.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"input_config.phases\[0\].concurrency: must be an "
                                         r"integer >= 1, got 0"):
        workloads.from_benchmark(path)
    doc["input_config"]["phases"][0].update(type="poisson", rate=2.5)
    path.write_text(json.dumps(doc))
    m = workloads.from_benchmark(path)
    assert m.concurrency is None and m.rate == 2.5  # a rate phase: an open loop
    doc["input_config"]["phases"] = [{"kind": "warmup", "type": "concurrency"}]
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="input_config.phases: no phase of kind 'profiling'"):
        workloads.from_benchmark(path)


def test_aiperf_summary_alone_is_rebuilt_at_its_rate():
    s = workloads.from_benchmark(FIX / "aiperf_summary_only" / "profile_export_aiperf.json")
    assert not s.per_request and s.rate == 4.0 and s.concurrency is None
    assert len(s.workload) == 4 and np.allclose(np.diff(s.workload["arrival_time"]), 0.25)
    assert set(s.workload["num_prompt_tokens"]) == {round(s.metrics["input_sequence_length.avg"])}


def test_guidellm_concurrent_benchmark():
    m = workloads.from_benchmark(FIX / "guidellm_benchmarks.json")
    doc = json.loads((FIX / "guidellm_benchmarks.json").read_text())
    b = doc["benchmarks"][0]
    assert m.tool == "guidellm" and m.concurrency == 2 and m.rate is None
    reqs = b["requests"]["successful"]
    assert m.workload["num_output_tokens"].tolist() == [r["output_tokens"] for r in reqs]
    got = b["metrics"]["time_to_first_token_ms"]["successful"]
    assert m.metrics["time_to_first_token_ms.mean"] == got["mean"]
    assert m.metrics["inter_token_latency_ms.p99"] == \
        b["metrics"]["inter_token_latency_ms"]["successful"]["percentiles"]["p99"]
    assert m.metrics["duration"] == b["duration"]
    # guidellm's TPOT includes the first token; its ITL is vLLM's TPOT
    r = reqs[1]
    t = r["info"]["timings"]
    assert r["time_per_output_token_ms"] == pytest.approx(
        1000 * (t["last_token_iteration"] - t["request_start"]) / r["output_tokens"])


def test_guidellm_sweep_needs_an_index():
    with pytest.raises(ValueError, match=r"guidellm_sweep.json: benchmarks: holds 2"):
        workloads.from_benchmark(FIX / "guidellm_sweep.json")
    m = workloads.from_benchmark(FIX / "guidellm_sweep.json", index=1)
    assert m.rate == 3.0 and len(m.workload) == 5


def _broken(tmp_path, name, edit):
    doc = json.loads((FIX / name).read_text())
    edit(doc)
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("name, edit, field", [
    ("vllm_bench_detailed.json", lambda d: d.pop("duration"), "duration"),
    ("vllm_bench_detailed.json", lambda d: d["input_lens"].pop(), "input_lens"),
    ("vllm_bench_detailed.json", lambda d: d["output_lens"].__setitem__(0, -3),
     r"output_lens\[0\]"),
    ("vllm_bench_detailed.json", lambda d: d.__setitem__("mean_ttft_ms", "fast"),
     "mean_ttft_ms"),
    ("guidellm_benchmarks.json",
     lambda d: d["benchmarks"][0]["config"]["strategy"].__setitem__("type_", "warp"),
     r"benchmarks\[0\].config.strategy.type_"),
    ("guidellm_benchmarks.json",
     lambda d: d["benchmarks"][0]["requests"]["successful"][2].pop("request_start_time")
     and d["benchmarks"][0]["requests"]["successful"][2]["info"]["timings"].pop(
         "request_start"),
     r"benchmarks\[0\].requests.successful\[2\].request_start_time"),
])
def test_bad_files_name_the_file_and_the_field(tmp_path, name, edit, field):
    path = _broken(tmp_path, name, edit)
    with pytest.raises(ValueError, match=rf"{name}: {field}") as e:
        workloads.from_benchmark(path)
    assert "\n" not in str(e.value)


def test_bad_jsonl_and_unknown_files(tmp_path):
    bad = tmp_path / "profile_export.jsonl"
    shutil.copy(FIX / "aiperf" / "profile_export.jsonl", bad)
    with bad.open("a") as f:
        f.write('{"metadata": {"request_start_ns": 1, "request_end_ns": 9}, "metrics": {"time_to_first_token": '
                '{"value": 3, "unit": "ms"}}, "error": null}\n')
    with pytest.raises(ValueError, match=r"profile_export.jsonl: line 6.metrics."
                                         r"input_sequence_length: missing"):
        workloads.from_benchmark(bad)
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    with pytest.raises(ValueError, match=r"other.json: not a vllm bench serve"):
        workloads.from_benchmark(other)
    other.write_text('{"hello": ')
    with pytest.raises(ValueError, match=r"other.json: line 1: not JSON"):
        workloads.from_benchmark(other)
    with pytest.raises(ValueError, match=r"nope.json: no such file"):
        workloads.from_benchmark(tmp_path / "nope.json")


def test_a_folder_is_named_as_one_with_the_result_files_it_holds(tmp_path):
    with pytest.raises(ValueError, match=r": a folder, not a result file$"):
        workloads.from_benchmark(tmp_path)
    (tmp_path / "vllm-bench.json").write_text("{}")
    with pytest.raises(ValueError, match=r"a folder, not a result file .give one of its files: "
                                         r"vllm-bench.json.$"):
        workloads.from_benchmark(tmp_path)


@pytest.mark.parametrize("path,index,said", [
    (None, None, "path must be a file path .str or Path., got NoneType"),
    (42, None, "path must be a file path .str or Path., got int"),
    ("x.json", "a", "index must be an integer .which benchmark of a guidellm sweep., got 'a'"),
    ("x.json", 1.5, "index must be an integer .* got 1.5"),
    ("x.json", True, "index must be an integer .* got True")])
def test_a_path_or_index_of_the_wrong_type_is_named(path, index, said):
    with pytest.raises(TypeError, match=said):
        workloads.from_benchmark(path, index=index)


@pytest.mark.parametrize("doc,has", [({"completed": 5, "request_throughput": 1.0},
                                      "completed, request_throughput"),
                                     ({"benchmarks": 5}, "benchmarks")])
def test_a_near_miss_says_what_each_tool_needs(tmp_path, doc, has):
    path = tmp_path / "near.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=rf"one of 'backend', 'endpoint_type', 'num_prompts' "
                                         rf"\(vllm\), metric tables \(AIPerf\) or a "
                                         rf"'benchmarks' list \(guidellm\) \(it has {has}\)"):
        workloads.from_benchmark(path)
