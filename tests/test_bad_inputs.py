"""Mistakes a new user makes, found by a newcomer's review: each is one clear error naming the
setting (and for files the file and line), before anything runs, not a silently substituted
value or a message blaming the wrong setting."""

import json

import pandas as pd
import pytest

import sim
import workloads as wl
from sim.cli import main

ROW = {"arrival_time": 0, "num_prompt_tokens": 5, "num_output_tokens": 5}


def _jsonl(path, *rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("column", ["num_prompt_tokens", "num_output_tokens"])
def test_a_json_boolean_is_no_token_count(tmp_path, column):
    # read as 1 (pandas' dtype inference, then pd.to_numeric): a 1-token prompt, silently
    path = _jsonl(tmp_path / "w.jsonl", ROW, dict(ROW, arrival_time=1, **{column: True}))
    with pytest.raises(ValueError, match=rf"w\.jsonl: {column}: line 2 has True \(must be an "
                                         rf"integer from 1 to 2\*\*53\)"):
        wl.load_file(path)


def test_a_boolean_column_of_a_dataframe_is_no_token_count():
    df = pd.DataFrame({"arrival_time": [0.0, 1.0], "num_prompt_tokens": [True, True],
                       "num_output_tokens": [5, 5]})
    with pytest.raises(ValueError, match=r"num_prompt_tokens: row 0 has True"):
        sim.run(df)
    with pytest.raises(ValueError, match=r"arrival_time: row 0 has True"):
        sim.run(df.assign(arrival_time=[True, True], num_prompt_tokens=[5, 5]))


def test_json_counts_written_as_numbers_still_load(tmp_path):
    path = _jsonl(tmp_path / "w.jsonl", ROW, dict(ROW, arrival_time=1.5, num_prompt_tokens=7.0))
    df = wl.load_file(path)
    assert df["num_prompt_tokens"].tolist() == [5, 7] and df["num_prompt_tokens"].dtype == "int64"
    assert df["arrival_time"].tolist() == [0.0, 1.5]


@pytest.mark.parametrize("name, text", [("e.jsonl", ""), ("blank.jsonl", "\n\n"),
                                        ("e.json", "[]")])
def test_an_empty_json_file_says_it_is_empty(tmp_path, name, text):
    # it said "workload is missing column(s) [...]; it has []", as if the columns were wrong
    (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=rf"{name}: the file is empty \(no header, no rows\)"):
        wl.load_file(tmp_path / name)


def _sweep(tmp_path, grid_line):
    path = tmp_path / "s.toml"
    path.write_text(f'workload = "azure-code"\nnum_requests = 5\ncost = "constant:0.01"\n'
                    f'output = "{tmp_path / "out"}"\n[grid]\n{grid_line}\n')
    return ["sweep", str(path)]


@pytest.mark.parametrize("grid_line, message", [
    ('model = ["llama-3.1-8b", "llama-9"]', "s.toml: grid point model='llama-9': model "
                                            "'llama-9' is not a preset (did you mean"),
    ('gpu = ["h100", "h1000"]', "s.toml: grid point gpu='h1000': gpu 'h1000' is not a preset "
                                "(did you mean 'h100'?)"),
])
def test_a_sweeps_unknown_model_or_gpu_is_an_error_before_any_point_runs(
        tmp_path, capsys, grid_line, message):
    # the misspelt name ran as an error row among the others ("2 points, 1 failed")
    assert main(_sweep(tmp_path, grid_line)) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_sweeps_model_config_json_is_still_a_model(tmp_path, capsys):
    cfg = tmp_path / "config.json"  # (GPT-J-6B's, trimmed: tests/test_hf_config.py)
    cfg.write_text(json.dumps({"model_type": "gptj", "n_embd": 4096, "n_layer": 28,
                               "n_head": 16, "n_inner": None, "n_positions": 2048,
                               "rotary_dim": 64, "vocab_size": 50400}))
    assert main(_sweep(tmp_path, f'model = ["{cfg}"]')) == 0
    assert "(1 run now, 0 failed)" in capsys.readouterr().out


def test_a_draft_model_is_not_blamed_for_a_model_that_does_not_fit_alone(tmp_path, capsys):
    base = ["run", "-w", "azure-code", "-n", "5", "--no-plots", "-o", str(tmp_path / "o"),
            "--spec-tokens", "3", "--draft-model"]
    assert main(base + ["llama-3.2-1b", "--model", "llama-3.1-70b"]) == 2
    err = capsys.readouterr().err
    assert "error: --model 'llama-3.1-70b' on gpu 'h100' with fp16 weights: does not fit" in err
    assert "--draft-model" not in err
    # a draft that is what leaves no room is still named
    assert main(base + ["llama-3.1-70b"]) == 2
    assert "error: --draft-model 'llama-3.1-70b' (141.1 GB of weights per GPU at fp16) beside " \
           "model 'llama-3.1-8b'" in capsys.readouterr().err


@pytest.fixture
def no_server(monkeypatch):
    """Fail, not serve until killed, if sim serve gets as far as starting its server."""
    import sim.serve

    def refuse(*args, **kwargs):
        raise AssertionError("the server started")
    monkeypatch.setattr(sim.serve, "serve", refuse)


def test_sim_serve_takes_no_bands(capsys, no_server):
    # a band reruns a finished workload at the cost model's error ends; the live server ran
    # once and ignored --bands
    with pytest.raises(SystemExit) as e:
        main(["serve", "--bands", "0.9"])
    assert e.value.code == 2
    assert "unrecognized arguments: --bands 0.9" in capsys.readouterr().err


@pytest.mark.parametrize("kwargs, message", [
    ({"rate": 3.0}, r"\['rate'\]: rate is the workload's: workloads\.load\(NAME, n=N, rate=R\) "
                    r"or workloads\.scale_to_rate\(df, R\)"),
    ({"n": 3}, r"\['n'\]: n is the workload's"),
    ({"slo": {"ttft": 1.0}}, r"\['slo'\]: slo is the summary's: result\.summary\(slo="),
    ({"schedular": "vllm"}, r"\['schedular'\] \(did you mean 'scheduler'\?\)"),
    ({"tp": 2}, r"\['tp'\] \(did you mean 'tensor_parallel'\?\)"),  # its words' initials
    ({"gmu": 0.8}, r"\['gmu'\] \(did you mean 'gpu_memory_utilization'\?\)"),  # not 'gpu'
])
def test_sim_run_says_where_a_cli_setting_goes_in_the_api(kwargs, message):
    # sim run's --rate / --slo-ttft are no SimConfig fields; 'rate' got "did you mean 'router'?"
    with pytest.raises(TypeError, match=r"^unknown SimConfig field\(s\) " + message):
        sim.run(wl.load("azure-code", n=5), **kwargs)


@pytest.mark.parametrize("make, message", [
    (lambda: wl.synthetic(10, rate=1.0, prompt=-5, output=3),
     r"^prompt must be an integer >= 1 or a length distribution, got -5$"),
    (lambda: wl.synthetic(10, rate=1.0, prompt=5, output=0), r"^output must be an integer >= 1"),
    (lambda: wl.shared_prefix(10, n_groups=1, system_prompt_tokens=5, user_tokens=-1, output=3,
                              rate=1.0), r"^user_tokens must be an integer >= 1"),
])
def test_a_generators_bad_length_names_its_argument(make, message):
    # it said "value must be an integer >= 1, got -5" (Fixed's field), naming no argument
    with pytest.raises(ValueError, match=message):
        make()
    with pytest.raises(TypeError, match=r"^prompt must be an int or a length distribution "
                                        r"\(with sample\(n, rng\)\), got 'x'$"):
        wl.synthetic(10, rate=1.0, prompt="x", output=3)


def test_a_sweep_resuming_another_sweeps_file_names_the_output_as_written(tmp_path, capsys):
    # it named the library's argument: "out='.../sweep.parquet' holds rows of another sweep"
    toml = tmp_path / "s.toml"
    grid = '[grid]\nrate = [1.0]\n'
    toml.write_text(f'workload = "azure-code"\nnum_requests = 5\n{grid}')
    out = str(tmp_path / "o")
    assert main(["sweep", str(toml), "-o", out]) == 0
    toml.write_text(f'workload = "azure-code"\nnum_requests = 5\nscheduler = "vllm"\n{grid}')
    capsys.readouterr()
    assert main(["sweep", str(toml), "-o", out]) == 2
    assert f"error: --output {out!r}: its sweep.parquet holds rows of another sweep" in \
        capsys.readouterr().err
    toml.write_text(f'workload = "azure-code"\nnum_requests = 5\nscheduler = "vllm"\n'
                    f'output = "{out}"\n{grid}')
    assert main(["sweep", str(toml)]) == 2
    assert f"s.toml: output {out!r}: its sweep.parquet holds rows" in capsys.readouterr().err


@pytest.mark.parametrize("spec, message", [
    ("1,-2,3,sync", "ITER_US must be a finite number >= 0, got -2"),
    ("-1,2,3,sync", "REQUEST_MS must be a finite number >= 0, got -1"),
    ("1,2,nan,overlap", "SEQ_US must be a finite number >= 0, got nan"),
])
def test_engine_overheads_name_the_term_as_written(tmp_path, capsys, spec, message):
    # it said "per_iter_s must be a finite number >= 0, got -2e-06": the field and unit inside
    args = ["run", "-w", "azure-code", "-n", "5", "-q", "-o", str(tmp_path / "o")]
    assert main(args + [f"--engine-overheads={spec}"]) == 2
    assert f"error: --engine-overheads {spec!r}: {message}\n" in capsys.readouterr().err


def test_a_tiny_token_throughput_is_not_printed_as_zero():
    from sim.cli.output import format_summary
    slow = wl.synthetic(3, rate=1e-6, prompt=10, output=4, arrival="constant")
    s = sim.run(slow, cost_model=sim.ConstantCost(0.01)).summary()
    line = next(r for r in format_summary(s).splitlines() if r.startswith("throughput"))
    assert f"{s['output_token_throughput']:.3g} output tok/s" in line, line
    assert " 0 output tok/s" not in line
    busy = sim.run(wl.synthetic(3, rate=1.0, prompt=10, output=4, arrival="constant"),
                   cost_model=sim.ConstantCost(0.01)).summary()
    assert f"{busy['output_token_throughput']:,.0f} output tok/s" in format_summary(busy)


def test_arrivals_drawn_at_a_tiny_rate_are_no_epoch_timestamps():
    # at 1e-9 req/s the first drawn arrival comes at ~1e9 s: it warned "they look like epoch
    # timestamps ... give them from the first request", where float64's resolution is the issue
    cost = sim.ConstantCost(0.01)
    with pytest.warns(UserWarning) as caught:
        sim.run(wl.load("sharegpt", n=50, rate=1e-9), cost_model=cost)
    said = [str(w.message) for w in caught]
    assert any("where float64 resolves only" in m for m in said), said
    assert not any("epoch" in m for m in said), said
    drawn = wl.load("sharegpt", n=50, rate=7.0)  # shifted by an epoch: still a timestamp
    with pytest.warns(UserWarning, match=r"look like epoch timestamps \(in seconds"):
        sim.run(drawn.assign(arrival_time=drawn["arrival_time"] + 1.7e9), cost_model=cost)


def test_sim_serve_refuses_a_host_it_cannot_listen_on_before_starting(capsys, no_server):
    # the banner ("http://999.1.1.1:8000/v1 ...") came first, then uvicorn's own log line
    assert main(["serve", "--host", "999.1.1.1", "--port", "8125"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sim serve: error: --host '999.1.1.1' is no address to listen on (")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name, text, message", [
    ("short.csv", "arrival_time,num_prompt_tokens,num_output_tokens\n0,5,5\n1,5\n",
     r"short\.csv: num_output_tokens: line 3 has no value \(must be an integer"),
    ("gap.jsonl", json.dumps(ROW) + "\n" + json.dumps({"arrival_time": 1,
                                                       "num_prompt_tokens": 5}) + "\n",
     r"gap\.jsonl: num_output_tokens: line 2 has no value \(must be an integer"),
])
def test_a_missing_cell_says_it_has_no_value_not_nan(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)  # it said "line 3 has nan": no nan in the file
    with pytest.raises(ValueError, match=message):
        wl.load_file(tmp_path / name)


@pytest.mark.parametrize("column, value, message", [
    ("arrival_time", True, r"arrival_time: line 2 has True \(must be a finite number of seconds"),
    ("acceptance_rate", True, r"acceptance_rate: line 2 has True \(must be a probability"),
    ("turn", False, r"turn: line 2 has False \(must be an integer, its place"),
])
@pytest.mark.parametrize("name", ["w.jsonl", "w.jsonl.gz"])
def test_a_json_boolean_in_a_number_column_names_file_line_and_column(tmp_path, column, value,
                                                                      message, name):
    # 0, true, 2.5 read as 0.0, 1.0, 2.5 (pandas; its date parsing of *_time came first)
    import gzip
    rows = [dict(ROW, acceptance_rate=0.5, turn=0, arrival_time=t) for t in (0, 1, 2.5)]
    rows[1][column] = value
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path = tmp_path / name
    path.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    with pytest.raises(ValueError, match=rf"w\.jsonl(\.gz)?: {message}"):
        wl.load_file(path)


def test_a_jsonl_files_own_boolean_column_still_loads(tmp_path):
    # the booleans are checked in the number columns only (a file with none is read once)
    path = _jsonl(tmp_path / "w.jsonl", dict(ROW, stream=True), dict(ROW, arrival_time=1.5,
                                                                     stream=False))
    df = wl.load_file(path)
    assert df["arrival_time"].tolist() == [0.0, 1.5] and df["stream"].tolist() == [True, False]


def test_a_boolean_acceptance_rate_or_turn_of_a_dataframe_is_an_error():
    df = wl.load("azure-code", n=2)
    with pytest.raises(ValueError, match=r"acceptance_rate: row 0 has True"):
        wl.validate(df.assign(acceptance_rate=[True, True]))
    with pytest.raises(ValueError, match=r"turn: row 0 has True"):
        wl.validate(df.assign(turn=[True, False]))


@pytest.mark.parametrize("kwargs, what", [
    ({"name": "azure-conv", "n": 5}, r"the 'azure-conv' trace is replayed as recorded"),
    ({"name": "sharegpt", "n": 3, "arrival_times": [0.0, 1.0, 2.0]},
     r"'sharegpt' takes its first rows and arrival_times= gives their arrivals"),
])
def test_a_seed_that_draws_nothing_from_a_fixed_trace_warns(kwargs, what):
    # workloads.load("azure-conv", seed=3) returned the trace as for seed 0, saying nothing
    # (sim run --seed 3 warns that it changes nothing)
    with pytest.warns(UserWarning, match=rf"^seed=3 changes nothing: {what}"):
        wl.load(**kwargs, seed=3)


def test_a_seed_that_draws_or_the_default_seed_says_nothing(tmp_path):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wl.load("azure-conv", n=5)  # (the default seed 0: no choice of the user's)
        wl.load("sharegpt", n=5, rate=1.0, seed=3)  # arrivals drawn
        wl.load("sharegpt", n=40_000, arrival_times=range(40_000), seed=3)  # resampled
        wl.load("vllm-random", n=5, seed=3)


def test_a_seed_in_a_workload_file_warns(tmp_path):
    path = _jsonl(tmp_path / "w.jsonl", ROW)
    with pytest.warns(UserWarning, match=r"^seed=7 changes nothing: the file '.*w\.jsonl' is "
                                         r"replayed as recorded"):
        wl.load(str(path), seed=7)


@pytest.mark.parametrize("command", ["run", "capacity"])
def test_sim_says_once_in_its_words_that_seed_changes_nothing(tmp_path, capsys, command):
    # sim capacity printed the engine's "seed=3 changes nothing: ... a workload's own draws
    # take workloads.load(..., seed=)": in the API's words, though --seed is the loader's too
    argv = [command, "-w", "azure-code", "-n", "50", "--cost", "constant:0.05", "--seed", "3"]
    argv += ["-o", str(tmp_path / "o")] if command == "run" else ["--slo-ttft", "0.5"]
    main(argv)
    warned = [x for x in capsys.readouterr().err.splitlines() if "changes nothing" in x]
    assert warned == [f"sim {command}: warning: --seed 3 changes nothing: workload azure-code is "
                      f"replayed as recorded (only a length-only set such as sharegpt draws its "
                      f"arrivals from the seed) and nothing in the engine draws at random "
                      f"(speculative decoding, --router random)"]


def test_sim_workload_describe_names_the_unused_seed_as_its_flag(capsys):
    assert main(["workload", "describe", "azure-conv", "--seed", "3"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("sim workload: warning: --seed 3 changes nothing: the 'azure-conv' "
                          "trace is replayed as recorded") and err.count("\n") == 1


@pytest.mark.parametrize("gpu, tp, limit, platform", [
    ("h100", 16, 8, "an HGX H100 8-GPU board"), ("h200", 64, 8, "an HGX H200 8-GPU board"),
    ("mi300x", 16, 8, "an AMD Instinct 8-GPU board"), ("l40s", 16, 8, "one PCIe host"),
])
def test_tensor_parallel_past_the_scale_up_domain_is_an_error(gpu, tp, limit, platform):
    # --tp 16 on H100s ran, its all-reduces priced at NVLink's 450 GB/s across two hosts
    from sim.costs.roofline import RooflineCost
    with pytest.raises(ValueError, match=rf"^tensor_parallel {tp} is more GPUs than one "
                                         rf"scale-up domain of .* holds: at most {limit} "
                                         rf"\({platform}; sim/data/scaleup_domain\.csv\)"):
        RooflineCost("llama-3.1-405b", gpu, tensor_parallel=tp)
    with pytest.raises(ValueError, match=rf"^tensor_parallel {tp} is more GPUs"):
        sim.run(wl.load("azure-code", n=3), model="llama-3.1-405b", gpu=gpu, tensor_parallel=tp)


def test_tensor_parallel_within_the_domain_runs_and_nvl72_spans_a_rack():
    from sim.costs.roofline import RooflineCost
    from sim.specs.gpus import gpu_presets, scaleup_domain
    assert RooflineCost("llama-3.1-405b", "h100", tensor_parallel=8).tp == 8
    assert RooflineCost("llama-3.1-405b", "gb200", tensor_parallel=16).tp == 16  # NVL72: 72
    assert scaleup_domain("gb200") == (72, "a GB200 NVL72 rack")
    assert all(scaleup_domain(g) is not None for g in gpu_presets())  # every preset has one


def test_sim_run_names_the_tp_flag_and_the_domain(tmp_path, capsys):
    assert main(["run", "--model", "llama-3.1-70b", "--tp", "16", "-w", "azure-code", "-n",
                 "3", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sim run: error: --tp 16 is more GPUs than one scale-up domain of "
                          "H100-80GB-SXM holds: at most 8 (an HGX H100 8-GPU board; ")
    assert err.count("\n") == 1


def test_sim_memory_refuses_tp_past_the_domain_as_sim_run_does(capsys):
    assert main(["memory", "llama-3.1-8b", "--tp", "16"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sim memory: error: --tp 16 is more GPUs than one scale-up domain of "
                          "H100-80GB-SXM holds: at most 8") and err.count("\n") == 1
    assert main(["memory", "llama-3.1-8b", "--gpu-memory-gb", "80", "--tp", "16"]) == 0  # own GPU


@pytest.mark.parametrize("gpu, tp, says, never", [
    # 405B in fp16 needs 16 H100s, past the 8-GPU board: the advice is 8-bit weights on 8
    ("h100", 1, "Or 8-bit weights on 8 GPUs with tensor parallelism (tensor_parallel=8): "
                "more than 8 leave one scale-up domain.", "tensor_parallel=16"),
    ("h100", 8, "Quantize the weights to 8 bits", "tensor_parallel=16"),
    ("l4", 8, "No tensor_parallel up to 8 (one scale-up domain of this GPU) fits, even with "
              "4-bit weights: use a GPU with more memory.", "Or add GPUs"),
    ("gb200", 1, "Or add GPUs: 8 GPUs with tensor parallelism (tensor_parallel=8).", "bit weights on"),
])
def test_the_memory_advice_stays_within_the_scale_up_domain(gpu, tp, says, never):
    """The advice never names a tensor_parallel sim would refuse on that GPU."""
    with pytest.raises(ValueError) as e:
        sim.SimConfig(model="llama-3.1-405b", gpu=gpu, tensor_parallel=tp).resolved_kv_blocks()
    assert says in str(e.value) and never not in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"gpuu": "h100"}, r"^unknown SimConfig field\(s\) \['gpuu'\] \(did you mean 'gpu'\?\)$"),
    ({"tp": 2}, r"^unknown SimConfig field\(s\) \['tp'\] \(did you mean 'tensor_parallel'"),
    ({"rate": 2.0}, r"^unknown SimConfig field\(s\) \['rate'\]: rate is the workload's"),
])
def test_simconfig_names_the_field_an_unknown_keyword_meant(kwargs, message):
    # the dataclass said only "__init__() got an unexpected keyword argument 'gpuu'"
    with pytest.raises(TypeError, match=message):
        sim.SimConfig(**kwargs)


def test_simconfig_keeps_the_dataclass_errors_that_name_no_keyword():
    with pytest.raises(TypeError, match="positional arguments"):
        sim.SimConfig(*range(60))


def test_a_misspelt_gpu_fails_when_the_config_is_made_not_in_the_run():
    # SimConfig(gpu="h900") was accepted and failed only inside sim.run
    with pytest.raises(ValueError, match=r"^gpu 'h900' is not a preset \(did you mean 'h200'"):
        sim.SimConfig(gpu="h900")
    assert sim.SimConfig(gpu="H200-141GB-SXM").gpu == "H200-141GB-SXM"  # a row's name is kept
