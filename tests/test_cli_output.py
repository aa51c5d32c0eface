"""What ``sim run`` prints and writes: the default-scenario banner only for the default scenario,
a summary that says what each share is a share of, strict JSON with the values used, files
renamed into place, and help with a default for every flag."""

import argparse
import json
import math

import pandas as pd
import pytest

from sim.cli import main
from sim.cli.main import build_parser
from sim.cli.run import format_summary
from sim.cli.settings import is_default_scenario, settings_from

SMALL = ["run", "-w", "azure-code", "-n", "30", "--cost", "constant:0.01", "--no-plots"]


def _settings(argv):
    return settings_from(build_parser().parse_args(["run", *argv]))


def _strict_load(path):
    def refuse(constant):
        raise AssertionError(f"{path} holds {constant}: not valid JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


def test_default_scenario_only_when_nothing_that_is_simulated_changes():
    assert is_default_scenario(_settings([]))
    assert is_default_scenario(_settings(["--gpu", "h100", "-o", "elsewhere", "--no-plots",
                                          "--slo-ttft", "2"]))
    for override in (["-n", "100"], ["--rate", "4"], ["--cost", "constant:0.01"],
                     ["--kv-blocks", "4000"], ["--seed", "3"], ["--closed-loop", "4"],
                     ["--max-batch-size", "128"], ["-w", "azure-code"]):
        assert not is_default_scenario(_settings(override)), override


def test_banner_not_printed_with_overrides(tmp_path, capsys):
    assert main(SMALL + ["-o", str(tmp_path / "o")]) == 0
    assert "default scenario" not in capsys.readouterr().out
    assert main(["run", "-n", "30", "--kv-blocks", "4000", "--no-plots",
                 "-o", str(tmp_path / "o")]) == 0
    assert "default scenario" not in capsys.readouterr().out


def test_summary_says_what_each_share_is_of(tmp_path, capsys):
    assert main(SMALL + ["--max-batch-size", "64", "-o", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    s = _strict_load(tmp_path / "o" / "summary.json")["summary"]
    batch = next(line for line in out.splitlines() if line.startswith("batch"))
    assert f"{s['mean_batch_size']:.1f} requests running on average of 64" in batch
    assert f"({s['slot_utilization']:.0%} of the batch slots)" in batch
    busy = next(line for line in out.splitlines() if line.startswith("busy"))
    assert f"an iteration was running {s['busy_fraction']:.0%} of the time" in busy
    assert "in use on average" in out and "at peak" in out


def test_format_summary_shows_undefined_values_as_n_a():
    s = {"num_finished": 3, "num_rejected": 0, "num_requests": 3, "request_throughput": 1.0,
         "output_token_throughput": 3.0, "total_token_throughput": 9.0, "mean_batch_size": 1.0,
         "slot_utilization": 0.5, "busy_fraction": 0.25, "kv_blocks": 10, "kv_usage_mean": 0.1,
         "kv_usage_max": 0.2, "num_preemptions": 0, "wall_seconds": 0.01}
    for key in ("ttft", "itl", "tpot", "e2e"):
        for stat in ("mean", "p50", "p90", "p99"):
            s[f"{key}_{stat}"] = float("nan") if key == "tpot" else 0.5
    text = format_summary(s, max_batch_size=2)
    assert "TPOT (s)    mean n/a  p50 n/a" in text and "nan" not in text
    assert "1.0 requests running on average of 2 (50% of the batch slots)" in text


def test_summary_json_is_strict_with_reasons_for_nulls(tmp_path, capsys):
    wl = tmp_path / "one_token.csv"  # one output token each: no TPOT, no ITL
    pd.DataFrame({"arrival_time": [0.0, 0.1, 0.2], "num_prompt_tokens": [10, 20, 30],
                  "num_output_tokens": [1, 1, 1]}).to_csv(wl, index=False)
    assert main(["run", "-w", str(wl), "--cost", "constant:0.01", "--no-plots", "-q",
                 "--slo-itl", "0.5", "-o", str(tmp_path / "o")]) == 0
    s = _strict_load(tmp_path / "o" / "summary.json")["summary"]
    assert s["tpot_p50"] is None and s["itl_p99"] is None
    assert s["null_reasons"]["tpot_p50"] == "no finished request has two or more output tokens"
    assert all(s[k] is None for k in s["null_reasons"])
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in s.values())


def test_summary_json_records_the_values_used(tmp_path, capsys):
    assert main(SMALL + ["-q", "-o", str(tmp_path / "o")]) == 0
    settings = _strict_load(tmp_path / "o" / "summary.json")["settings"]
    assert settings["chunk_size"] == 512 and settings["block_size"] == 16
    t = pd.read_parquet(tmp_path / "o" / "requests.parquet")["arrival_time"]
    assert settings["rate"] == pytest.approx((len(t) - 1) / (t.max() - t.min()))
    assert settings["num_requests"] == 30


def test_resampled_length_set_is_said(tmp_path, capsys):
    n = 31_000  # the sharegpt length set holds 30,731 pairs
    assert main(["run", "-w", "sharegpt", "-n", str(n), "--rate", "5000", "--cost",
                 "constant:0.0001", "--no-plots", "-o", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "note: sharegpt holds 30,731 length pairs; the 31,000 requests sample them" in out
    assert _strict_load(tmp_path / "o" / "summary.json")["settings"]["resampled_from"] == 30731


def test_interrupted_run_leaves_the_previous_files(tmp_path, monkeypatch, capsys):
    out = tmp_path / "o"
    assert main(SMALL + ["-q", "-o", str(out)]) == 0
    before = (out / "summary.json").read_text()
    from sim.results import plots

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(plots, "save_plots", interrupted)
    assert main(["run", "-w", "azure-code", "-n", "40", "--cost", "constant:0.01", "-q",
                 "--plots", "-o", str(out)]) == 130  # (one line: "sim run: interrupted")
    assert (out / "summary.json").read_text() == before  # not half a new set of files
    assert sorted(p.name for p in out.iterdir()) == ["iterations.parquet", "requests.parquet",
                                                     "summary.json", "timing.json"]  # (no
    # temporary left)


def test_every_flag_has_help_with_its_default():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for command, p in [("sim", parser), *sub.choices.items()]:
        for action in p._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) \
                    or action.help == argparse.SUPPRESS:  # (parsed to be refused, not listed)
                continue
            if not action.option_strings:  # positionals: say what they are
                ok = bool(action.help)
            else:
                ok = bool(action.help) and "default" in action.help
            if not ok:
                missing.append(f"{command} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, missing
    run = sub.choices["run"]
    scheduler = next(a for a in run._actions if "--scheduler" in a.option_strings).help
    from sim.engine.schedulers import POLICIES
    assert all(f"{name}: " in scheduler for name in POLICIES)
    assert "``" not in scheduler and ";;" not in scheduler and "; a;" not in scheduler
    assert "chunked: Chunked prefill (Sarathi-style);" in scheduler


def test_run_help_gives_the_valid_range_of_each_number_and_short_metavars():
    run = next(a for a in build_parser()._actions
               if isinstance(a, argparse._SubParsersAction)).choices["run"]
    flags = {o: a for a in run._actions for o in a.option_strings}
    expected = {"--spec-tokens": "K in 1..64", "--acceptance-rate": "in [0, 1]",
                "--draft-cost-ratio": "C >= 0", "--replicas": ">= 1", "--prefill-replicas": ">= 1",
                "--decode-replicas": ">= 1", "--link-bandwidth": "> 0",
                "--tp": "must divide the model's attention heads, and divide its KV heads",
                "--max-batch-size": ">= 1", "--chunk-size": ">= 1", "--token-budget": ">= 1",
                "--kv-blocks": ">= 1", "--block-size": ">= 1",
                "--draft-model": "a model preset (as --model)",
                "--model": "model preset such as llama-3.1-70b (an unknown name lists them)",
                "--rate": "length-only set such as sharegpt, where it is required",
                "--cost": "linear:BASE,PREFILL,DECODE,CONTEXT (all four numbers)"}
    for flag, text in expected.items():
        assert text in " ".join(flags[flag].help.split()), (flag, flags[flag].help)
    assert "vllm 8,192" in flags["--chunk-size"].help and "the scheduler's" in flags[
        "--chunk-size"].help
    for flag in ("--max-batch-size", "--chunk-size", "--token-budget", "--kv-blocks",
                 "--block-size"):
        assert flags[flag].metavar in ("N", "TOKENS"), flag


@pytest.mark.parametrize("flag, dest, typed, value", [
    ("--weight-dtype", "weight_dtype", "FP8", "fp8"), ("--kv-dtype", "kv_dtype", "Fp8", "fp8"),
    ("--scheduler", "scheduler", "VLLM", "vllm"), ("--router", "router", "Least_KV", "least_kv"),
    ("--prefix-caching", "prefix_caching", "OFF", "off"),
    ("--spec-method", "speculative_method", "NGRAM", "ngram")])
def test_choice_flags_take_any_case_as_the_toml_file_does(flag, dest, typed, value):
    assert getattr(build_parser().parse_args(["run", flag, typed]), dest) == value


def test_an_upper_case_flag_runs_like_the_lower_case_one(tmp_path, capsys):
    common = ["run", "-w", "azure-code", "-n", "20", "--cost", "constant:0.01", "--no-plots",
              "-q", "--replicas", "2"]
    for case, flags in (("upper", ["--weight-dtype", "FP8", "-s", "VLLM", "--router", "LEAST_KV"]),
                        ("lower", ["--weight-dtype", "fp8", "-s", "vllm", "--router", "least_kv"])):
        assert main(common + flags + ["-o", str(tmp_path / case)]) == 0
    toml = tmp_path / "upper.toml"  # the same names in a file
    toml.write_text('weight_dtype = "FP8"\nscheduler = "VLLM"\nrouter = "LEAST_KV"\n'
                    'prefix_caching = "OFF"\n[speculative]\nnum_speculative_tokens = 2\n'
                    'method = "NGRAM"\n')
    assert main(common + [str(toml), "-o", str(tmp_path / "file")]) == 0
    doc = json.loads((tmp_path / "file" / "summary.json").read_text())
    assert doc["settings"]["prefix_caching"] is False
    assert doc["settings"]["speculative"]["method"] == "ngram"
    upper, lower = (json.loads((tmp_path / c / "summary.json").read_text())
                    for c in ("upper", "lower"))
    assert upper["settings"]["weight_dtype"] == "fp8" and upper["settings"]["router"] == "least_kv"
    assert upper["summary"]["ttft_p99"] == lower["summary"]["ttft_p99"]


def test_prefix_caching_radix_from_the_flag_and_the_sglang_default(tmp_path):
    common = ["run", "-w", "mooncake-conversation", "-n", "40", "--rate", "0.05", "--cost",
              "constant:0.01", "--no-plots", "-q", "--kv-blocks", "2000000"]
    assert main(common + ["-s", "continuous", "--block-size", "1", "--prefix-caching", "RADIX",
                          "-o", str(tmp_path / "flag")]) == 0
    assert main(common + ["-s", "sglang", "-o", str(tmp_path / "preset")]) == 0
    flag, preset = (json.loads((tmp_path / c / "summary.json").read_text())
                    for c in ("flag", "preset"))
    assert flag["settings"]["prefix_caching"] == preset["settings"]["prefix_caching"] == "radix"
    assert flag["summary"]["prefix_hit_rate"] > 0.02 and preset["summary"]["prefix_hit_rate"] > 0.02


def test_parquet_outputs_round_trip_with_dictionaries_only_on_text(tmp_path):
    import pyarrow.parquet as pq
    from sim.cli.output import write_parquet
    df = pd.DataFrame({"request_id": ["a", "b", "c"], "ttft": [0.5, float("nan"), 0.25],
                       "num_output_tokens": [3, 4, 5], "status": ["finished"] * 3})
    write_parquet(df, tmp_path / "r.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "r.parquet"), df)
    meta = pq.ParquetFile(tmp_path / "r.parquet").metadata.row_group(0)
    dictionary = {meta.column(i).path_in_schema: any("DICTIONARY" in e for e in
                                                     meta.column(i).encodings)
                  for i in range(meta.num_columns)}
    assert dictionary == {"request_id": True, "ttft": False, "num_output_tokens": False,
                          "status": True}
    delta = {meta.column(i).path_in_schema for i in range(meta.num_columns)
             if "DELTA_BINARY_PACKED" in meta.column(i).encodings}
    assert delta == {"num_output_tokens"}  # integers delta-encoded, the rest as before


def test_the_printed_summary_shows_the_prefix_cache_when_it_is_on(tmp_path, capsys):
    """sglang's radix cache is on by default: its hit rate is printed (it was only in
    summary.json); a run without caching prints no such row."""
    base = ["run", "-w", "mooncake-conversation", "-n", "30", "--cost", "constant:0.01",
            "--no-plots"]
    assert main(base + ["-s", "sglang", "-o", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    s = _strict_load(tmp_path / "a" / "summary.json")["summary"]
    row = next(line for line in out.splitlines() if line.startswith("prefix cache"))
    assert f"radix: {s['prefix_hit_rate']:.1%} of prompt tokens served from the cache" in row
    assert s["prefix_hit_rate"] > 0
    assert "names no prefix block" not in row
    assert main(base + ["-o", str(tmp_path / "b")]) == 0
    assert "prefix cache" not in capsys.readouterr().out
    # a workload without hash_ids: said once, on the row, and no "no prefix hits" finding
    assert main(["run", "-w", "azure-code", "-n", "30", "--cost", "constant:0.01", "-s", "vllm",
                 "-o", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("prefix cache"))
    assert row.endswith("(the workload names no prefix block: no hash_ids covering one, so "
                        "nothing can hit)") and "no prefix hits" not in out


def test_a_lora_run_prints_its_slots_and_adapter_loads(tmp_path, capsys):
    """Newcomer review: the printed summary had no LoRA line. It says the slots as configured
    and the summary's lora_* metrics (summary.json's numbers); a run without LoRA has none."""
    argv = SMALL + ["--enable-lora", "--max-loras", "2", "--max-cpu-loras", "4",
                    "--lora-adapters", "6"]
    assert main(argv + ["-o", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    s = _strict_load(tmp_path / "a" / "summary.json")["summary"]
    line = next(x for x in out.splitlines() if x.startswith("LoRA"))
    assert line.split(None, 1)[1] == (
        f"2 GPU slots of rank 16, 4 in the CPU cache; {s['lora_adapter_loads']} adapter loads "
        f"({s['lora_disk_loads']} from disk), {s['lora_load_seconds']:.3g} s loading in all, "
        f"{s['lora_load_time_per_request'] * 1e3:.3g} ms per LoRA request; "
        f"{s['lora_distinct_per_batch_mean']:.2f} distinct adapters per batch on average, "
        f"{s['lora_distinct_per_batch_max']} at most")
    assert s["lora_adapter_loads"] >= 6 and s["lora_disk_loads"] >= 6  # each read once at least
    assert main(SMALL + ["-o", str(tmp_path / "b")]) == 0
    assert "LoRA" not in capsys.readouterr().out
