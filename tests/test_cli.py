import json

import pandas as pd
import pytest

import sim
from sim.cli import main


def test_run_small_trace_writes_outputs(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["run", "--workload", "azure-code", "-n", "300", "--scheduler", "continuous",
               "--max-batch-size", "32", "--kv-blocks", "4000", "--slo-ttft", "1.0",
               "--slo-itl", "0.1", "--plots", "-o", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "TTFT (s)" in text and "SLOs" in text
    req = pd.read_parquet(out / "requests.parquet")
    assert len(req) == 300
    it = pd.read_parquet(out / "iterations.parquet")
    assert len(it) > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["summary"]["num_requests"] == 300
    assert "slo_attainment" in summary["summary"]
    assert summary["settings"]["scheduler"] == "continuous"
    for png in ("latency_cdfs.png", "timeline.png"):
        assert (out / png).stat().st_size > 10_000


def test_run_toml_config_and_flags_override(tmp_path, capsys):
    cfg = tmp_path / "exp.toml"
    wl = tmp_path / "w.csv"
    pd.DataFrame({"arrival_time": [0.0, 0.5, 1.0], "num_prompt_tokens": [100, 200, 300],
                  "num_output_tokens": [10, 20, 30]}).to_csv(wl, index=False)
    cfg.write_text(f'workload = "{wl}"\nscheduler = "static"\ncost = "constant:0.01"\n'
                   f'plots = false\noutput = "{tmp_path / "o"}"\n[slo]\ne2e = 1.0\n')
    assert main(["run", str(cfg), "--max-batch-size", "2"]) == 0
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["settings"]["scheduler"] == "static" and s["settings"]["max_batch_size"] == 2
    assert s["summary"]["slo_e2e"] == 1.0
    assert not (tmp_path / "o" / "timeline.png").exists()
    assert main(["run", str(cfg), "--plots", "-q"]) == 0  # the flag overrides the file
    assert (tmp_path / "o" / "timeline.png").exists()
    # 3 requests, batch 2 static, 0.01 s per iteration
    assert s["summary"]["num_finished"] == 3


def test_run_plots_only_when_asked(tmp_path):
    """PNG figures cost ~1 s (matplotlib and drawing), ~4 s at 1M requests: written only with
    --plots (or plots = true), never by default; --no-plots overrides plots = true."""
    small = ["run", "-w", "azure-code", "-n", "20", "--cost", "constant:0.01", "-q"]
    assert main(small + ["-o", str(tmp_path / "a")]) == 0
    assert not list((tmp_path / "a").glob("*.png"))
    cfg = tmp_path / "p.toml"
    cfg.write_text(f'plots = true\noutput = "{tmp_path / "b"}"\n')
    assert main(["run", str(cfg)] + small[1:] + ["--no-plots"]) == 0
    assert not list((tmp_path / "b").glob("*.png"))
    assert main(["run", str(cfg)] + small[1:]) == 0
    assert sorted(p.name for p in (tmp_path / "b").glob("*.png")) == ["latency_cdfs.png",
                                                                      "timeline.png"]
    # the next run into that folder without plots: no figure of the previous run is left
    # beside its files (a user opening timeline.png saw the old run's); another file stays
    (tmp_path / "b" / "notes.png").write_text("the user's")
    assert main(small + ["-o", str(tmp_path / "b")]) == 0
    assert sorted(p.name for p in (tmp_path / "b").glob("*.png")) == ["notes.png"]


def test_run_errors_are_clear(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_time,num_prompt_tokens,num_output_tokens\n0,5,5\n1,-5,5\n")
    assert main(["run", "-w", str(bad), "-o", str(tmp_path / "x")]) == 2
    assert "num_prompt_tokens: line 3" in capsys.readouterr().err  # (the file's own line)
    assert main(["run", "-w", "azure-code", "-n", "5", "--max-batch-size", "0",
                 "-o", str(tmp_path / "x")]) == 2
    assert "--max-batch-size must be > 0" in capsys.readouterr().err
    cfg = tmp_path / "c.toml"
    cfg.write_text('shceduler = "static"\n')
    assert main(["run", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "unknown setting" in err and "did you mean 'scheduler'" in err


def test_workload_describe_and_memory(tmp_path, capsys):
    assert main(["workload", "describe", "azure-conv", "--plot", str(tmp_path / "w.png")]) == 0
    out = capsys.readouterr().out
    assert "19366" in out.replace(",", "") and (tmp_path / "w.png").exists()
    assert "num_requests     19,366" in out and "prompt_max       14,050" in out  # separators
    # a figure in a folder not made yet: made, as --output and --report make theirs
    new = tmp_path / "new" / "sub" / "w.png"
    assert main(["workload", "describe", "azure-conv", "-n", "50", "--plot", str(new)]) == 0
    assert new.exists()
    assert main(["workload", "list"]) == 0
    assert "mooncake-conversation" in capsys.readouterr().out
    assert main(["memory", "llama-3.1-70b", "--gpu", "a100"]) == 1
    assert "quantize the weights to 8 bits" in capsys.readouterr().out.lower()
    # each engine's knobs reach its accounting; left out, the library's defaults
    from sim import memory_budget
    from sim.specs.gpus import get_gpu
    gb = get_gpu("h100").memory_gb
    for argv, kw in ((["llama-3.1-8b"], {}),
                     (["llama-3.1-8b", "--utilization", "0.5", "--max-num-seqs", "1024"],
                      dict(gpu_memory_utilization=0.5, max_num_seqs=1024)),
                     (["llama-3.1-8b", "--accounting", "sglang", "--mem-fraction-static", "0.5"],
                      dict(accounting="sglang", mem_fraction_static=0.5)),
                     (["llama-3.1-8b", "--accounting", "tensorrt-llm",
                       "--free-gpu-memory-fraction", "0.5", "--max-num-batched-tokens", "2048"],
                      dict(accounting="tensorrt-llm", free_gpu_memory_fraction=0.5,
                           max_num_batched_tokens=2048))):
        assert main(["memory", *argv]) == 0
        # in the engine's own blocks (vLLM 16 tokens, SGLang's page of 1, TensorRT-LLM 32),
        # the pool sim run gives that engine's preset (review6: always blocks of 16 here)
        accounting = kw.get("accounting", "vllm")
        size = {"vllm": 16, "sglang": 1, "tensorrt-llm": 32}[accounting]
        blocks = memory_budget("llama-3.1-8b", gb, block_size=size, **kw).kv_blocks
        out = capsys.readouterr().out  # (the whole blocks' tokens, not the bytes': review8)
        assert f"= {blocks:,} blocks of {size} token{'s' * (size > 1)} ({blocks * size:,} " \
               f"tokens;" in out
        if accounting == "tensorrt-llm":
            assert sim.SimConfig(scheduler="tensorrt-llm", model="llama-3.1-8b", gpu="h100",
                                 free_gpu_memory_fraction=0.5, token_budget=2048
                                 ).resolved_kv_blocks() == blocks
    assert main(["memory", "llama-3.1-8b", "--accounting", "sglang"]) == 0
    pages = sim.SimConfig(scheduler="sglang", model="llama-3.1-8b", gpu="h100"
                          ).resolved_kv_blocks()
    assert f"= {pages:,} blocks of 1 token ({pages:,} tokens;" in capsys.readouterr().out
    assert memory_budget("llama-3.1-8b", gb).kv_blocks == 28_343  # the README's pool


def test_run_with_a_flagged_profile_warns_on_stderr(tmp_path, capsys):
    import json as _json

    from sim.costs.calibrated import shipped_cpu_profile
    profile = _json.loads(open(str(shipped_cpu_profile())).read())
    profile["weights"]["base_s"] = -1e-6  # a profile written before non-negative fits
    profile.pop("quality", None)
    path = tmp_path / "p.json"
    path.write_text(_json.dumps(profile))
    assert main(["run", "-w", "azure-code", "-n", "20", "--profile", str(path), "--no-plots",
                 "-q", "-o", str(tmp_path / "o")]) in (0, 2)
    err = capsys.readouterr().err
    assert "warning" in err and "base_s" in err


def test_run_with_a_profile_of_another_model_than_the_pool_warns(tmp_path, capsys):
    """The shipped CPU profile timed 'cpu-tiny'; without --kv-blocks the pool is the default
    Llama-3.1-8B's on an H100: one line says prices and pool describe different models."""
    from sim.costs.calibrated import shipped_cpu_profile
    args = ["run", "-w", "azure-code", "-n", "10", "--profile", str(shipped_cpu_profile()),
            "--no-plots", "-q", "-o", str(tmp_path / "o")]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "'cpu-tiny'" in err and "'llama-3.1-8b' on 'h100'" in err and "--kv-blocks" in err
    assert main(args + ["--kv-blocks", "2000"]) == 0
    assert "cpu-tiny" not in capsys.readouterr().err


def test_capacity_help_lists_no_flag_it_refuses(capsys):
    # sim run's output and closed-loop flags are refused by sim capacity (test_cli_errors.py)
    # and were listed in its --help all the same
    with pytest.raises(SystemExit):
        main(["capacity", "--help"])
    text = capsys.readouterr().out
    for flag in ("--output", "--quiet", "--plots", "--closed-loop", "--think-time"):
        assert flag not in text, flag
    assert "--slo-ttft" in text and "--rate" in text and "--attainment" in text


def test_capacity_command_and_findings_in_run_output(tmp_path, capsys):
    wl = tmp_path / "w.csv"
    import numpy as np
    rng = np.random.default_rng(0)
    pd.DataFrame({"arrival_time": np.cumsum(rng.exponential(1.0, 400)),
                  "num_prompt_tokens": 8, "num_output_tokens": 1}).to_csv(wl, index=False)
    assert main(["capacity", "-w", str(wl), "-s", "continuous", "--max-batch-size", "1",
                 "--cost", "constant:0.01", "--slo-e2e", "0.05", "--attainment", "0.9"]) == 0
    out = capsys.readouterr().out
    assert "max rate" in out and "rates tried" in out and "per GPU" in out
    assert main(["capacity", "-w", str(wl)]) == 2
    assert "needs at least one SLO" in capsys.readouterr().err
    # limits no rate meets: exit status 1 and how far down the search went
    assert main(["capacity", "-w", str(wl), "-s", "continuous", "--max-batch-size", "1",
                 "--cost", "constant:0.01", "--slo-e2e", "0.005"]) == 1
    out = capsys.readouterr().out
    assert "no rate tried meets the SLOs, down to " in out and "best attainment 0.0%" in out
    # an overloaded run says so, on the screen and in summary.json
    assert main(["run", "-w", str(wl), "--rate", "500", "-s", "continuous", "--max-batch-size",
                 "1", "--cost", "constant:0.01", "--no-plots", "-o", str(tmp_path / "o")]) == 0
    assert "findings:" in capsys.readouterr().out
    doc = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert [f["code"] for f in doc["findings"]] == ["overloaded"]


def test_capacity_of_a_length_only_set_needs_no_rate(capsys):
    """sim capacity searches the rate itself, yet refused ShareGPT without --rate ('sharegpt'
    has no arrival times): its arrivals are drawn at the reference 1 req/s and re-scaled, the
    same search as with --rate 1; sim run still needs the rate."""
    args = ["capacity", "-w", "sharegpt", "-n", "60", "--cost", "constant:0.01",
            "--slo-ttft", "0.5"]
    assert main(args) == 0
    without = capsys.readouterr().out
    assert main(args + ["--rate", "1"]) == 0
    assert capsys.readouterr().out == without and "max rate" in without
    assert main(["run", "-w", "sharegpt", "-n", "60", "-q"]) == 2
    assert "give --rate" in capsys.readouterr().err


def test_sweep_command_writes_table_and_plots_and_resumes(tmp_path, capsys):
    cfg = tmp_path / "sweep.toml"
    cfg.write_text('workload = "azure-code"\nnum_requests = 200\ncost = "constant:0.01"\n'
                   f'output = "{tmp_path / "o"}"\nmetrics = ["ttft_p99", "num_finished"]\n'
                   '[grid]\nrate = [1.0, 4.0]\nmodel = ["llama-3.1-8b", "llama-3.1-70b"]\n')
    assert main(["sweep", str(cfg), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "4 points (4 run now, 2 failed)" in out  # 70B does not fit: rows, not a crash
    table = pd.read_csv(tmp_path / "o" / "sweep.csv")
    assert len(table) == 4 and table["error"].notna().sum() == 2
    assert (tmp_path / "o" / "ttft_p99.png").stat().st_size > 5_000
    assert main(["sweep", str(cfg), "--workers", "1"]) == 0  # the 2 good points are kept
    assert "(2 run now, 2 failed)" in capsys.readouterr().out
    cfg.write_text(cfg.read_text().replace("rate = [1.0, 4.0]", "rate = [4.0]"))
    assert main(["sweep", str(cfg), "--workers", "1"]) == 0  # other grid values: rows kept
    out = capsys.readouterr().out
    assert "(1 run now, 1 failed)" in out and "also keeps 2 rows of grid points not in" in out
    assert len(pd.read_parquet(tmp_path / "o" / "sweep.parquet")) == 4
    assert len(pd.read_csv(tmp_path / "o" / "sweep.csv")) == 2  # this grid's points
    cfg.write_text('workload = "azure-code"\n')
    assert main(["sweep", str(cfg)]) == 2
    assert "needs a [grid] table" in capsys.readouterr().err


def test_sweep_grids_users_and_pool_sizes_by_sim_runs_names(tmp_path, capsys):
    """A concurrency sweep (closed_loop_users x think_time) and a prefill:decode split from a
    TOML file, under the names sim run's settings use (refused before: not SimConfig fields)."""
    # (sharegpt has no arrival times: a grid of users needs no rate)
    for workload, grid, cols in (
            ("sharegpt", "closed_loop_users = [2, 8]\nthink_time = [0.0, 0.5]",
             ["closed_loop_users", "think_time"]),
            ("azure-code", "prefill_replicas = [1, 2]\ndecode_replicas = [1]",
             ["prefill_replicas", "decode_replicas"])):
        cfg = tmp_path / "s.toml"
        out = tmp_path / cols[0]
        cfg.write_text(f'workload = "{workload}"\nnum_requests = 40\ncost = "constant:0.01"\n'
                       f'output = "{out}"\nmetrics = ["request_throughput"]\n[grid]\n{grid}\n')
        assert main(["sweep", str(cfg), "--workers", "1", "--no-progress"]) == 0
        table = pd.read_csv(out / "sweep.csv")
        assert list(table.columns[:2]) == cols and (table["error"].isna()).all()
    assert table["kv_transfer_time_p99"].notna().all()  # disaggregated runs
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("grid, message", [
    ('scheduler = ["vlm"]', "grid point scheduler='vlm': scheduler must be one of"),
    ('weight_dtype = ["fp32"]', "grid point weight_dtype='fp32': weight_dtype must be one of"),
    ('router = ["least-kv"]', "(did you mean 'least_kv'?)"),
    ('rate = [-2, 0]', "grid['rate'] must be a finite number > 0, got -2.0"),
    ('seed = [-1]', "grid point seed=-1: seed must be >= 0, got -1"),
    ('kv_blocks = [0]', "grid point kv_blocks=0: kv_blocks must be > 0, got 0"),
    ('shceduler = ["vllm"]', "['shceduler'] are neither SimConfig fields nor ('rate', "
                             "'num_requests') nor ['acceptance_rate', 'closed_loop_users', "
                             "'decode_replicas', 'draft_cost_ratio', 'draft_model', "
                             "'link_bandwidth_gbps', 'link_latency_s', "
                             "'num_speculative_tokens', 'prefill_replicas', 'think_time'] "
                             "(did you mean 'scheduler'?)"),
    ('think_time = [0.5]', "grid point think_time=0.5: think_time set(s) closed_loop's "
                           "['think_time'], but the base config has no closed_loop and these "
                           "alone cannot make one: give the base a ClosedLoop (sim run's "
                           "closed_loop_users)"),
    ('scheduler = ["continuous"]\nchunk_size = [1024]', "chunk_size=1024 is not used by"),
])
def test_sweep_refuses_a_bad_grid_before_running_naming_the_file(grid, message, tmp_path, capsys,
                                                                   monkeypatch):
    from sim.tools import sweep_backends as module

    def refuse(*args, **kwargs):
        raise AssertionError("a point ran before the grid was checked")
    monkeypatch.setattr(module, "run_point", refuse)
    # sharegpt: a length-only set, whose rate comes from the grid: checked before it is built
    for workload in ("azure-code", "sharegpt") if grid.startswith("rate") else ("azure-code",):
        cfg = tmp_path / "bad.toml"
        cfg.write_text(f'workload = "{workload}"\nnum_requests = 20\ncost = "constant:0.01"\n'
                       f'output = "{tmp_path / "o"}"\n[grid]\n{grid}\n')
        assert main(["sweep", str(cfg), "--workers", "1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"sim sweep: error: {cfg}: grid") and err.count("\n") == 1, err
        assert message in err, err
        assert not (tmp_path / "o").exists()


def test_the_sample_toml_files_are_valid(tmp_path):
    from pathlib import Path

    from sim.cli.settings import read_toml
    root = Path(__file__).resolve().parents[1] / "examples"
    assert read_toml(root / "experiment.toml")["scheduler"] == "vllm"
    assert set(read_toml(root / "sweep.toml", "sweep")["grid"]) == {
        "rate", "scheduler"}


def test_sweep_repeats_from_the_file_and_the_flag(tmp_path, capsys):
    cfg = tmp_path / "sweep.toml"
    cfg.write_text('workload = "sharegpt"\nnum_requests = 40\nrate = 4.0\ncost = "constant:0.01"\n'
                   f'output = "{tmp_path / "o"}"\nmetrics = ["ttft_p99"]\nrepeats = 2\n'
                   '[grid]\nmax_batch_size = [8, 32]\n')
    assert main(["sweep", str(cfg), "--workers", "1"]) == 0
    assert "4 runs (4 run now, 0 failed)" in capsys.readouterr().out
    table = pd.read_csv(tmp_path / "o" / "sweep.csv")
    assert list(table["repeat"]) == [0, 1, 0, 1] and list(table["seed"]) == [0, 1, 0, 1]
    assert table["ttft_p99"].iloc[0] != table["ttft_p99"].iloc[1]  # arrivals drawn per seed
    assert main(["sweep", str(cfg), "--workers", "1", "--repeats", "3", "--no-progress"]) == 0
    assert "6 runs (2 run now, 0 failed)" in capsys.readouterr().out  # resumed
    cfg.write_text(cfg.read_text().replace("repeats = 2", "repeats = 0"))
    assert main(["sweep", str(cfg)]) == 2
    assert capsys.readouterr().err == (f"sim sweep: error: {cfg}: repeats must be an integer "
                                       f">= 1, got 0\n")


@pytest.mark.parametrize("knob, value", [("chunk_size", 4096), ("token_budget", 4096),
                                         ("free_gpu_memory_fraction", 0.8),
                                         ("enable_chunked_context", True),
                                         ("capacity_scheduler_policy", "max_utilization")])
def test_a_policy_knobs_flag_help_names_every_scheduler_that_uses_it(knob, value):
    """The sglang preset uses both knobs; the help once named only chunked/sarathi/vllm and
    continuous."""
    import argparse
    import re
    from sim.cli.main import build_parser
    from sim.engine import SimConfig
    from sim.engine.schedulers import POLICIES
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = next(a.help for a in sub.choices["run"]._actions if a.dest == knob)
    head = text.split("(default")[0]
    for name in POLICIES:
        try:
            SimConfig(scheduler=name, **{knob: value})
            uses = True
        except ValueError as e:
            assert "not used" in str(e) or "read only by" in str(e), e
            uses = False
        assert bool(re.search(rf"\b{name}\b", head)) == uses, (name, head)


def test_run_sets_vllms_gpu_memory_utilization(tmp_path):
    """--gpu-memory-utilization sizes the pool as SimConfig's knob does (before, sim run had no
    way to set it: only the API); summary.json records it."""
    from sim.engine import SimConfig
    got = {}
    for u in ("0.5", "0.9"):
        assert main(["run", "-n", "5", "--gpu-memory-utilization", u, "--no-plots", "-q",
                     "-o", str(tmp_path / u)]) == 0
        got[u] = json.loads((tmp_path / u / "summary.json").read_text())["settings"]
        assert got[u]["gpu_memory_utilization"] == float(u)
        assert got[u]["kv_blocks"] == SimConfig(
            model="llama-3.1-8b", gpu="h100", gpu_memory_utilization=float(u)
        ).resolved_kv_blocks()
    assert got["0.5"]["kv_blocks"] < got["0.9"]["kv_blocks"] / 2


def test_run_sets_tensorrt_llms_memory_fraction_and_chunked_context(tmp_path, capsys):
    """--free-gpu-memory-fraction sizes the tensorrt-llm preset's pool (as sim memory's flag
    does: the same check); --enable-chunked-context runs a prompt over max_num_tokens in
    chunks where without it the request is rejected; --capacity-scheduler-policy (any case);
    summary.json records them."""
    wl = tmp_path / "w.csv"
    pd.DataFrame({"arrival_time": [0.0, 0.1, 0.2], "num_prompt_tokens": [100, 3000, 200],
                  "num_output_tokens": [10, 20, 30]}).to_csv(wl, index=False)
    base = ["run", "-w", str(wl), "-s", "tensorrt-llm", "--token-budget", "1024", "--no-plots",
            "-q"]
    settings = {}
    for name, extra in (("default", []), ("fraction", ["--free-gpu-memory-fraction", "0.5"]),
                        ("chunked", ["--enable-chunked-context"]),
                        ("max_util", ["--capacity-scheduler-policy", "MAX_UTILIZATION"]),
                        ("equal", ["--enable-chunked-context", "--context-chunking-policy",
                                   "equal_progress"])):
        assert main(base + extra + ["-o", str(tmp_path / name)]) == 0
        doc = json.loads((tmp_path / name / "summary.json").read_text())
        settings[name] = doc["settings"]
        req = pd.read_parquet(tmp_path / name / "requests.parquet")
        assert req["status"].tolist() == (["finished"] * 3 if name in ("chunked", "equal") else
                                          ["finished", "rejected", "finished"])
        assert doc["settings"]["capacity_scheduler_policy"] == (
            "max_utilization" if name == "max_util" else "guaranteed_no_evict")
    assert settings["fraction"]["free_gpu_memory_fraction"] == 0.5
    assert settings["default"]["free_gpu_memory_fraction"] is None  # TensorRT-LLM's 0.9
    assert settings["fraction"]["kv_blocks"] < settings["default"]["kv_blocks"] * 0.6
    assert settings["chunked"]["enable_chunked_context"] is True
    assert settings["chunked"]["context_chunking_policy"] == "first_come_first_served"
    assert settings["equal"]["context_chunking_policy"] == "equal_progress"
    assert settings["default"]["enable_chunked_context"] is False
    assert capsys.readouterr().err == ""
    # the rejection said as what it is, not as a request larger than the KV pool
    assert main(base[:-1] + ["-o", str(tmp_path / "said")]) == 0
    text = capsys.readouterr().out
    assert "2 finished, 1 rejected of 3 (1 over max_num_tokens)" in text
    assert "1 of 3 requests were rejected at arrival: their prompts (up to 3,000 tokens) " \
        "exceed max_num_tokens 1,024 without chunked context" in text
    assert "KV blocks than the whole pool" not in text
    doc = json.loads((tmp_path / "said" / "summary.json").read_text())
    assert doc["summary"]["num_rejected_max_num_tokens"] == 1
    assert [f["code"] for f in doc["findings"]] == ["max_num_tokens"]


def test_hash_block_tokens_lets_a_csv_with_hash_ids_use_the_prefix_cache(tmp_path, capsys):
    """A CSV file's hash_ids need their tokens per id (newcomer review: no way to say it from
    the CLI): --hash-block-tokens 512 or the TOML key; the hit rate is the closed form of
    tests/test_workload_files.py, (1024 - 16 + 512) / 3072."""
    wl = tmp_path / "w.csv"
    wl.write_text('request_id,arrival_time,num_prompt_tokens,num_output_tokens,hash_ids\n'
                  'a,0.0,1024,10,"[1, 2]"\nb,0.5,1024,10,"[1, 2]"\nc,1.0,1024,10,"[1, 3]"\n')
    argv = ["run", "-w", str(wl), "-s", "vllm", "--cost", "constant:0.01", "-q"]
    assert main(argv + ["-o", str(tmp_path / "a")]) == 2
    assert "--hash-block-tokens N" in capsys.readouterr().err
    assert main(argv + ["--hash-block-tokens", "512", "-o", str(tmp_path / "b")]) == 0
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'workload = "{wl}"\nhash_block_tokens = 512\nscheduler = "vllm"\n'
                   f'cost = "constant:0.01"\noutput = "{tmp_path / "c"}"\n')
    assert main(["run", str(cfg), "-q"]) == 0
    for out in ("b", "c"):
        summary = json.loads((tmp_path / out / "summary.json").read_text())["summary"]
        assert summary["prefix_hit_rate"] == (1024 - 16 + 512) / 3072


def test_counts_of_one_read_in_the_singular(tmp_path, capsys):
    """ "1 request", "1 point", "1 plot" (newcomer review: "1 requests" ...)."""
    assert main(["run", "-w", "azure-code", "-n", "1", "--cost", "constant:0.01", "--kv-blocks",
                 "1", "-o", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "workload azure-code: 1 request; " in out and "KV cache    1 block = 16 tokens (kv_blocks): " in out
    assert "1 of 1 request was rejected: it needs more KV blocks" in out
    cfg = tmp_path / "sweep.toml"
    cfg.write_text('workload = "azure-code"\nnum_requests = 20\ncost = "constant:0.01"\n'
                   f'output = "{tmp_path / "o"}"\nmetrics = ["ttft_p99"]\n'
                   '[grid]\nmax_batch_size = [8]\n')
    assert main(["sweep", str(cfg), "--workers", "1"]) == 0
    assert "\n1 point (1 run now, 0 failed); wrote sweep.parquet, sweep.csv and 1 plot to " in \
        capsys.readouterr().out


def test_a_length_only_sweep_resumes_when_its_rates_change(tmp_path, capsys):
    """sharegpt draws its arrivals at a fixed reference rate, each point re-scaled to its own:
    before, the base workload was drawn at the grid's first rate, so changing the rates made
    the file "another sweep" and the run was refused."""
    cfg = tmp_path / "sweep.toml"
    text = ('workload = "sharegpt"\nnum_requests = 30\ncost = "constant:0.01"\n'
            f'output = "{tmp_path / "o"}"\nmetrics = ["ttft_p99"]\n[grid]\nrate = RATES\n')
    cfg.write_text(text.replace("RATES", "[2.0, 4.0]"))
    assert main(["sweep", str(cfg), "--workers", "1"]) == 0
    first = pd.read_parquet(tmp_path / "o" / "sweep.parquet")
    cfg.write_text(text.replace("RATES", "[4.0, 8.0]"))
    assert main(["sweep", str(cfg), "--workers", "1"]) == 0
    assert "(1 run now, 0 failed)" in capsys.readouterr().out
    rows = pd.read_parquet(tmp_path / "o" / "sweep.parquet")
    assert rows["rate"].tolist() == [4.0, 8.0, 2.0]
    assert rows.set_index("rate").loc[[2.0, 4.0], "ttft_p99"].tolist() == first[
        "ttft_p99"].tolist()


def test_run_plots_says_when_no_request_finished(tmp_path, capsys):
    """Every request rejected (each needs more KV blocks than the pool): --plots writes no
    figure and says why for each, instead of leaving them out (the timeline's absence went
    unsaid: no iteration ran)."""
    wl = tmp_path / "w.csv"
    pd.DataFrame({"arrival_time": [0.0, 1.0], "num_prompt_tokens": [5000, 6000],
                  "num_output_tokens": [10, 10]}).to_csv(wl, index=False)
    assert main(["run", "-w", str(wl), "--kv-blocks", "10", "--cost", "constant:0.01",
                 "--plots", "-o", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "no latency_cdfs.png: no request finished" in out
    assert "no timeline.png: no iteration ran" in out
    assert not (tmp_path / "o" / "latency_cdfs.png").exists()
    assert not (tmp_path / "o" / "timeline.png").exists()
