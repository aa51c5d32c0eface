"""The settings table (``sim.cli.table``): every row's flag reaches its field, every field the CLI
exposes has a row, a TOML file and the same flags give the same config, unknown keys are named
with their file, and the docs' reference rows come from the same table."""

import dataclasses
import inspect
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.kv.lora import LoRAConfig
from sim.cli.build import config_from, parts, with_request_path
from sim.cli.main import build_parser
from sim.cli.settings import DEFAULTS, Names, given_value, reference_rows, settings_from
from sim.cli.setting import TARGETS
from sim.cli.table import BY_KEY, SETTINGS, help_text, rows_for
from sim.costs.calibrated import shipped_cpu_profile
from sim.engine import Disaggregation, KVTier, SimConfig, SpeculativeConfig

# flag -> (its text on the command line, the value it gives, flags it needs beside it)
SAMPLES = {
    "workload": ("azure-code", "azure-code", []),
    "hash_block_tokens": ("512", 512, []),
    "num_requests": ("7", 7, []),
    "rate": ("2.5", 2.5, []),
    "scheduler": ("VLLM", "vllm", []),
    "model": ("llama-3.1-70b", "llama-3.1-70b", []),
    "gpu": ("a100", "a100", []),
    "tensor_parallel": ("2", 2, []),
    "weight_dtype": ("int8", "int8", []),
    "kv_dtype": ("FP8", "fp8", []),
    "max_batch_size": ("64", 64, []),
    "chunk_size": ("1024", 1024, []),
    "token_budget": ("2048", 2048, ["-s", "continuous"]),
    "gpu_memory_utilization": ("0.5", 0.5, []),
    "free_gpu_memory_fraction": ("0.5", 0.5, ["-s", "tensorrt-llm"]),
    "enable_chunked_context": (None, True, ["-s", "tensorrt-llm"]),
    "capacity_scheduler_policy": ("max_utilization", "max_utilization", ["-s", "tensorrt-llm"]),
    "context_chunking_policy": ("equal_progress", "equal_progress",
                                ["-s", "tensorrt-llm", "--enable-chunked-context"]),
    "kv_blocks": ("300", 300, []),
    "kv_tokens": ("4800", 4800, []),
    "max_model_len": ("4096", 4096, []),
    "prefix_caching": ("OFF", False, []),
    "block_size": ("32", 32, []),
    "seed": ("3", 3, []),
    "bands": ("0.8", 0.8, []),
    "engine_overheads": ("Fitted", "fitted", ["-s", "sglang"]),
    "cost": ("constant:0.01", "constant:0.01", []),
    "profile": (str(shipped_cpu_profile()), str(shipped_cpu_profile()), ["--kv-blocks", "100"]),
    "usd_per_gpu_hour": ("2.5", 2.5, []),
    "gpu_idle_watts": ("60", 60.0, []),
    "gpu_max_watts": ("650", 650.0, []),
    "replicas": ("3", 3, []),
    "router": ("Least_KV", "least_kv", ["--replicas", "2"]),
    "prefill_replicas": ("2", 2, []),
    "decode_replicas": ("3", 3, []),
    "link_bandwidth_gbps": ("50", 50.0, ["--prefill-replicas", "1"]),
    "link_latency_s": ("0.01", 0.01, ["--prefill-replicas", "1"]),
    "prefill_gpu": ("h200", "h200", ["--prefill-replicas", "1"]),
    "decode_gpu": ("a100", "a100", ["--prefill-replicas", "1"]),
    "prefill_tensor_parallel": ("2", 2, ["--prefill-replicas", "1"]),
    "decode_tensor_parallel": ("2", 2, ["--prefill-replicas", "1"]),
    "prefill_usd_per_gpu_hour": ("2.5", 2.5, ["--prefill-replicas", "1"]),
    "decode_usd_per_gpu_hour": ("1.5", 1.5, ["--prefill-replicas", "1"]),
    "closed_loop_users": ("4", 4, []),
    "offload_gb": ("64", 64.0, []),
    "offload_read_bandwidth": ("25", 25.0, ["--offload-gb", "1"]),
    "offload_write_bandwidth": ("12.5", 12.5, ["--offload-gb", "1"]),
    "offload_latency": ("0.001", 0.001, ["--offload-gb", "1"]),
    "offload_preset": ("LMCache", "lmcache", ["--offload-gb", "1"]),
    "offload_lower_gb": ("100", 100.0, ["--offload-gb", "1"]),
    "offload_eviction": ("ARC", "arc", ["--offload-gb", "1"]),
    "offload_write_policy": ("write_through", "write_through", ["--offload-gb", "1"]),
    "offload_write_threshold": ("3", 3, ["--offload-gb", "1"]),
    "offload_link_bandwidth": ("16", 16.0, ["--offload-gb", "1"]),
    "offload_layer_overlap": (None, True, ["--offload-gb", "1"]),
    "offload_prefetch_policy": ("TIMEOUT", "timeout", ["--offload-gb", "1"]),
    "offload_prefetch_timeout": ("0.5", 0.5, ["--offload-gb", "1"]),
    "offload_prefetch_threshold": ("128", 128, ["--offload-gb", "1"]),
    "think_time": ("0.5", 0.5, ["--closed-loop", "2"]),
    "speculative.num_speculative_tokens": ("3", 3, ["--spec-method", "ngram"]),
    "speculative.acceptance_rate": ("0.6", 0.6, ["--spec-tokens", "2", "--spec-method", "ngram"]),
    "speculative.draft_model": ("llama-3.2-1b", "llama-3.2-1b", ["--spec-tokens", "2"]),
    "speculative.draft_cost_ratio": ("0.1", 0.1, ["--spec-tokens", "2"]),
    "speculative.method": ("NGRAM", "ngram", ["--spec-tokens", "2"]),
    "slo.ttft": ("1.5", 1.5, []),
    "slo.itl": ("0.05", 0.05, []),
    "slo.tpot": ("0.04", 0.04, []),
    "slo.e2e": ("9", 9.0, []),
    "output": ("elsewhere", "elsewhere", []),
    "plots": (None, True, []),
    "quiet": (None, True, []),
    "report": ("r.html", "r.html", []),
    "format": ("AIPerf", "aiperf", []),
    "request_path": ("1,2,3", "1,2,3", []),
    "expert_parallel": ("8", 8, ["--model", "mixtral-8x7b", "--tp", "8"]),
    "expert_skew": ("0.5", 0.5, ["--model", "mixtral-8x7b", "--tp", "8", "--ep", "8"]),
    "attention_dp": ("8", 8, ["--model", "mixtral-8x7b", "--ep", "8"]),
    "expert_weight_dtype": ("MXFP4", "mxfp4", ["--model", "gpt-oss-20b"]),
    "random_input_len": ("512", 512, ["-w", "vllm-random"]),
    "random_output_len": ("64", 64, ["-w", "vllm-random"]),
    "random_range_ratio": ("0.25", 0.25, ["-w", "vllm-random"]),
    "random_prefix_len": ("100", 100, ["-w", "vllm-random"]),
    "sharegpt_output_len": ("32", 32, ["-w", "vllm-sharegpt"]),
    "max_concurrency": ("16", 16, []),
    "burstiness": ("0.5", 0.5, ["-w", "vllm-random"]),
    "vllm_formula": ("LEGACY", "legacy", ["-w", "vllm-random"]),
    "enable_lora": (None, True, []),
    "max_loras": ("4", 4, ["--enable-lora", "--max-cpu-loras", "4"]),
    "max_lora_rank": ("64", 64, ["--enable-lora"]),
    "max_cpu_loras": ("8", 8, ["--enable-lora"]),
    "lora_default_rank": ("8", 8, ["--enable-lora"]),
    "lora_cpu_bandwidth": ("12.5", 12.5, ["--enable-lora"]),
    "lora_disk_bandwidth": ("3", 3.0, ["--enable-lora"]),
    "lora_adapters": ("5", 5, []),
    "lora_zipf": ("0.5", 0.5, ["--lora-adapters", "3"]),
}
OBJECTS = {"closed_loop": "closed_loop", "disaggregation": "disaggregation",
           "speculative": "speculative", "kv_offload": "kv_offload",
           "lora": "lora"}  # a row's target -> SimConfig's field holding it


def _argv(key):
    text, _, beside = SAMPLES[key]
    row = BY_KEY[key]
    return [row.flags[0]] + ([] if text is None else [text]) + beside


def test_every_flag_of_sim_run_has_a_sample():
    assert set(SAMPLES) == {row.key for row in rows_for("run") if row.flags}


@pytest.mark.parametrize("key", list(SAMPLES))
def test_every_rows_flag_parses_to_its_field(key):
    """The flag's text, parsed and checked, is the row's value in the settings record and,
    for an engine setting, the field of the config (or of its config object) it names."""
    _, value, _ = SAMPLES[key]
    row = BY_KEY[key]
    args = build_parser().parse_args(["run", *_argv(key)])
    s = settings_from(args)
    top, _, sub = key.partition(".")
    if row.in_toml and top in DEFAULTS:
        assert (s[top][sub] if sub else s[top]) == value
    elif row.flags[0] == "--quiet":
        assert args.quiet is True
    else:
        given, shown = given_value(args, s, key)
        assert (given, shown) == (value, row.flags[0])
    target = row.to[-1]
    if target in ("config", *OBJECTS):
        cfg = config_from(s, Names(None))
        owner = cfg if target == "config" else getattr(cfg, OBJECTS[target])
        assert getattr(owner, row.api_field) == value
    if target == "workload":
        assert parts(s)["workload"][row.api_field] == value
    if target == "request_path":
        path = with_request_path(config_from(s), args, s).request_path
        assert (path.in_s, path.per_prompt_token_s, path.out_s) == pytest.approx((1e-3, 2e-6,
                                                                                  3e-3))


def _fields(cls):
    return {f.name for f in dataclasses.fields(cls)}


def test_every_field_the_cli_exposes_is_in_the_table():
    """Each SimConfig field is a row's (or built from rows: the cost model, the config
    objects); each row names a real field of its target; sweep's grid names agree."""
    import workloads
    from sim.tools.sweep_grid import PARTS
    targets = {"config": _fields(SimConfig), "speculative": _fields(SpeculativeConfig),
               "disaggregation": _fields(Disaggregation),
               "closed_loop": _fields(workloads.ClosedLoop), "kv_offload": _fields(KVTier),
               "lora": _fields(LoRAConfig),
               "workload": set(inspect.signature(workloads.load).parameters)}
    for row in SETTINGS:
        for target in row.to:
            assert target in TARGETS, row.key
            if target in targets:
                assert row.api_field in targets[target], (row.key, target)
    by_rows = {row.api_field for row in SETTINGS if "config" in row.to}
    built = {"cost_model", "speculative", "closed_loop", "disaggregation", "request_path",
             "kv_offload", "lora"}
    not_exposed = {"progress", "check"}  # a terminal's progress bar; the engine's self-check
    assert _fields(SimConfig) == by_rows | built | not_exposed
    for name, (owner, attr) in PARTS.items():  # sweep's grid: sim run's names for them
        row = BY_KEY.get(name) or BY_KEY[f"{owner}.{name}"]
        assert (row.to[-1], row.api_field) == (owner, attr), name


def _toml(values) -> str:
    def text(v):
        return str(v).lower() if isinstance(v, bool) else repr(v) if not isinstance(v, str) \
            else f'"{v}"'
    top = [f"{k} = {text(v)}" for k, v in values.items() if "." not in k]
    tables = {}
    for k, v in values.items():
        if "." in k:
            table, key = k.split(".")
            tables.setdefault(table, []).append(f"{key} = {text(v)}")
    return "\n".join(top + [f"[{t}]\n" + "\n".join(lines) for t, lines in tables.items()]) + "\n"


def _flags(values) -> list:
    argv = []
    for k, v in values.items():
        row = BY_KEY[k]
        argv += [row.flags[0]] if v is True else [row.flags[1]] if v is False else \
            [row.flags[0], str(v)]
    return argv


SETTINGS_DRAWN = st.fixed_dictionaries({}, optional={
    "scheduler": st.sampled_from(["chunked", "vllm", "sarathi"]),
    "max_batch_size": st.integers(1, 512), "chunk_size": st.integers(16, 8192),
    "kv_blocks": st.integers(100, 5000), "block_size": st.sampled_from([16, 32]),
    "seed": st.integers(0, 9), "tensor_parallel": st.sampled_from([1, 2]),
    "weight_dtype": st.sampled_from(["fp16", "FP8", "int8"]),
    "kv_dtype": st.sampled_from(["fp16", "fp8"]), "replicas": st.integers(1, 3),
    "cost": st.sampled_from(["roofline", "constant:0.01", "linear:0.001,1e-5,2e-5,0"]),
    "closed_loop_users": st.integers(1, 8), "num_requests": st.integers(1, 100),
    "speculative.num_speculative_tokens": st.integers(1, 4),
    "speculative.acceptance_rate": st.floats(0.0, 1.0), "slo.ttft": st.floats(0.01, 10.0),
    "plots": st.booleans(), "model": st.sampled_from(["llama-3.1-8b", "qwen2.5-7b"]),
})


@settings(max_examples=40, deadline=None)
@given(values=SETTINGS_DRAWN)
def test_a_toml_file_and_the_same_flags_give_the_same_config(values):
    if "speculative.acceptance_rate" in values:  # (K is needed beside it)
        values.setdefault("speculative.num_speculative_tokens", 2)
    if "speculative.num_speculative_tokens" in values:
        values["speculative.method"] = "ngram"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "exp.toml"
        path.write_text(_toml(values))
        got = []
        for argv in (["run", str(path)], ["run", *_flags(values)]):
            s = settings_from(build_parser().parse_args(argv))
            try:
                got.append((s, config_from(s)))
            except ValueError as e:  # a combination the engine refuses: refused alike
                got.append((s, str(e)))
    (s_file, cfg_file), (s_flags, cfg_flags) = got
    assert s_file == s_flags and cfg_file == cfg_flags


@pytest.mark.parametrize("command, text, shown", [
    ("run", 'shceduler = "vllm"\n', "unknown setting(s) ['shceduler'] (did you mean "
                                    "'scheduler'?)"),
    ("run", "[grid]\nrate = [1.0]\n", "unknown setting(s) ['grid']"),  # sim sweep's key
    ("capacity", 'report = "r.html"\n', "unknown setting(s) ['report']"),  # sim run's own
    ("sweep", 'request_path = "triton"\n', "unknown setting(s) ['request_path']"),
    ("run", "[speculative]\nnum_speculative_token = 2\n", "speculative: unknown key(s) "
     "['num_speculative_token'] (did you mean 'num_speculative_tokens'?)"),
    # a flag's name where its key belongs: --tp's key is tensor_parallel (no close spelling)
    ("run", "tp = 2\n", "unknown setting(s) ['tp'] ('tp' is the --tp flag; its key is "
                        "'tensor_parallel')"),
    ("sweep", "closed_loop = 4\n", "unknown setting(s) ['closed_loop'] ('closed_loop' is the "
                                   "--closed-loop flag; its key is 'closed_loop_users')"),
])
def test_an_unknown_toml_key_names_the_file_and_the_key(command, text, shown, tmp_path,
                                                        capsys):
    from sim.cli import main
    path = tmp_path / "exp.toml"
    path.write_text(text)
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sim {command}: error: {path}: {shown}") and err.count("\n") == 1, err


SWITCHES = [row.key for row in SETTINGS if row.parse is bool and row.in_toml]


@pytest.mark.parametrize("key", SWITCHES)
@pytest.mark.parametrize("text", ['"false"', '"yes"', "0", "1"])
def test_a_switch_in_a_toml_file_takes_only_true_or_false(key, text, tmp_path, capsys):
    """A switch's file value must be a TOML bool: ``enable_lora = "false"`` once turned LoRA
    on (a non-empty string is truthy), a silent substitution."""
    from sim.cli import main
    path = tmp_path / "exp.toml"
    extra = 'scheduler = "tensorrt-llm"\n' if key == "enable_chunked_context" else ""
    path.write_text(f'{extra}workload = "azure-code"\nnum_requests = 2\n{key} = {text}\n')
    assert main(["run", str(path), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{path}: {key} must be true or false, got" in err.replace("True or False",
                                                                     "true or false"), err


def test_block_sizes_default_help_names_every_schedulers_own():
    """--block-size's help gives 16 and each scheduler whose block size differs (it once
    left out tensorrt-llm's 32, so --kv-blocks 400 held twice the tokens the help implied)."""
    from sim.cli.table import choices_of
    said = BY_KEY["block_size"].default_help
    for name in choices_of(BY_KEY["scheduler"]):
        size = SimConfig(scheduler=name).resolved().block_size
        assert (size == 16 and "16" in said) or f"{name} {size}" in said, (name, size, said)


def test_the_reference_rows_are_the_table_and_the_help():
    rows = reference_rows()
    assert [r["key"] for r in rows if r["key"]] == [row.key for row in SETTINGS if row.in_toml]
    assert {r["key"].split(".")[0] for r in rows if r["key"]} >= set(DEFAULTS)
    for r in rows:
        assert r["type"] and r["help"] and r["target"] and r["commands"], r
        assert r["flags"] or r["key"], r
    help_of = {a.option_strings[0]: a.help for a in _subparser("run")._actions
               if a.option_strings}
    for row in rows_for("run"):
        if row.flags:
            assert help_of[row.flags[0]] == help_text(row), row.key
    assert {r["key"]: r["default"] for r in rows}["scheduler"] == "chunked"


def _subparser(name):
    import argparse
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]
