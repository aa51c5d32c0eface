"""``vllm bench serve``'s workloads (workloads/vllm_bench.py): the random dataset's lengths
against their closed form and the tool's own draws, the arrival process against the gamma
law, the shared prefix in a run's prefix cache, ShareGPT's filters and sampling, the
concurrency cap, and a published command line replayed through ``sim run``."""

import json
import math
import random

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import sim
import workloads
from sim.cli import main
from workloads.vllm_bench import (MAX_PROMPT_LEN, MAX_TOTAL_LEN, MIN_LEN, sharegpt_lengths,
                                  vllm_arrivals, vllm_random, vllm_sharegpt)


def test_random_lengths_span_the_tools_bounds_with_the_closed_form_mean():
    # input 1000, r 0.5, BOS 1: sampled in [floor(999 * 0.5), ceil(999 * 1.5)] = [499, 1499]
    df = vllm_random(20_000, input_len=1000, output_len=128, range_ratio=0.5)
    sampled = df["num_prompt_tokens"] - 1
    assert (sampled.min(), sampled.max()) == (499, 1499)
    assert abs(sampled.mean() - 999) < 4 * math.sqrt((1001 ** 2 - 1) / 12 / 20_000)
    out = df["num_output_tokens"]
    assert (out.min(), out.max()) == (64, 192)
    assert abs(out.mean() - 128) < 4 * math.sqrt((129 ** 2 - 1) / 12 / 20_000)


def test_random_draws_are_the_tools_own():
    """The tool's RandomDataset: default_rng(seed).integers for inputs, then outputs."""
    df = vllm_random(50, input_len=300, output_len=40, range_ratio=0.3, seed=7)
    rng = np.random.default_rng(7)
    inputs = rng.integers(math.floor(299 * 0.7), math.ceil(299 * 1.3) + 1, size=50)
    outputs = rng.integers(math.floor(40 * 0.7), math.ceil(40 * 1.3) + 1, size=50)
    assert (df["num_prompt_tokens"].to_numpy() == inputs + 1).all()
    assert (df["num_output_tokens"].to_numpy() == outputs).all()
    fixed = vllm_random(10)  # the defaults: 1024 in (BOS included), 128 out, all at t = 0
    assert set(fixed["num_prompt_tokens"]) == {1024} and set(fixed["num_output_tokens"]) == {128}
    assert (fixed["arrival_time"] == 0).all()


def test_legacy_formula_draws_one_stream_from_the_lower_bound_up():
    df = vllm_random(4000, input_len=200, output_len=100, range_ratio=0.25, prefix_len=8,
                     formula="legacy", vocab_size=1000, request_rate=5.0, seed=3)
    rs = np.random.RandomState(3)
    rs.randint(0, 1000, size=8)
    sampled = rs.randint(50, 201, size=4000)  # [int(200 * 0.25), 200]
    assert (df["num_prompt_tokens"].to_numpy() == 1 + 8 + sampled).all()  # BOS, prefix, own
    assert (df["num_output_tokens"].to_numpy() == rs.randint(25, 101, size=4000)).all()
    rs.randint(0, 1000, size=4000)
    gaps = rs.gamma(1.0, 0.2, 4000)  # the first request at 0, each next one a gap later
    assert np.allclose(df["arrival_time"], np.concatenate([[0.0], np.cumsum(gaps)[:-1]]))
    assert set(vllm_random(5, formula="legacy")["num_prompt_tokens"]) == {1025}  # r = 1


def test_burstiness_one_gives_exponential_gaps():
    gaps = np.diff(vllm_arrivals(5000, 8.0, 1.0, seed=11, formula="legacy"))  # (unscaled)
    assert stats.kstest(gaps, "expon", args=(0, 1 / 8.0)).pvalue > 0.05
    assert stats.kstest(gaps, "expon", args=(0, 1 / 12.0)).pvalue < 1e-6  # the test can fail


@pytest.mark.parametrize("b", [0.25, 1.0, 4.0])
def test_burstiness_sets_the_cv(b):
    t = vllm_arrivals(40_000, 10.0, b, seed=1)
    assert workloads.interarrival_cv(t) == pytest.approx(1 / math.sqrt(b), rel=0.03)
    assert t[-1] == pytest.approx(40_000 / 10.0)  # rescaled: the last at n / rate


def test_arrivals_draw_as_the_tools_loop():
    rs = np.random.RandomState(5)
    loop = np.cumsum([rs.gamma(shape=0.5, scale=1.0 / (2.0 * 0.5)) for _ in range(100)])
    assert np.array_equal(vllm_arrivals(100, 2.0, 0.5, seed=5, formula="legacy")[1:],
                          loop[:-1])
    current = vllm_arrivals(100, 2.0, 0.5, seed=5)  # the first after a gap, then rescaled
    assert np.allclose(current, loop * (50.0 / loop[-1]))
    assert (vllm_arrivals(7, math.inf) == 0).all()
    assert np.allclose(vllm_arrivals(4, 2.0, math.inf), [0.5, 1.0, 1.5, 2.0])


def test_capacity_searches_a_generated_workload_without_a_rate(capsys):
    assert main(["capacity", "-w", "vllm-random", "-n", "60", "--random-input-len", "256",
                 "--slo-ttft", "0.5", "--burstiness", "0.5"]) == 0
    assert "req/s" in capsys.readouterr().out


def test_random_prefix_is_shared_and_hits_the_prefix_cache():
    df = vllm_random(40, input_len=128, output_len=8, prefix_len=512, request_rate=2.0)
    shared = (1 + 512) // 16  # BOS + prefix: 32 full blocks
    first = df["hash_ids"].iloc[0][:shared]
    assert all(list(ids[:shared]) == first for ids in df["hash_ids"])
    assert len({ids[shared] for ids in df["hash_ids"]}) == len(df)  # then their own
    ideal = workloads.ideal_prefix_hit_ratio(df)
    assert set(df["num_prompt_tokens"]) == {1 + 512 + 127}  # BOS, prefix, 128 - BOS sampled
    assert ideal == pytest.approx(39 * shared / (40 * 640 // 16))
    res = sim.run(df, scheduler="continuous", prefix_caching="block")
    hit = res.summary()["prefix_hit_rate"]
    assert hit == pytest.approx(39 * shared * 16 / df["num_prompt_tokens"].sum(), rel=1e-9)
    assert sim.run(df, scheduler="continuous",
                   prefix_caching=False).summary().get("prefix_hit_rate", 0.0) == 0.0


def _valid(df, fixed=None):
    p, o = df["num_prompt_tokens"], df["num_output_tokens"]
    return ((p >= MIN_LEN) & ((o >= MIN_LEN) | (fixed is not None)) & (p <= MAX_PROMPT_LEN)
            & (p + o <= MAX_TOTAL_LEN)).all()


def test_sharegpt_rows_keep_the_tools_limits():
    df = vllm_sharegpt(3000, seed=2)
    assert len(df) == 3000 and _valid(df)
    lengths = sharegpt_lengths()
    raw = lengths["prompt"] + 1  # (BOS)
    assert (raw > MAX_PROMPT_LEN).any() and (raw < MIN_LEN).any()  # there was something to drop
    fixed = vllm_sharegpt(500, output_len=2000)
    assert set(fixed["num_output_tokens"]) == {2000} and _valid(fixed, 2000)
    assert fixed["num_prompt_tokens"].max() <= 48


def test_sharegpt_fixed_output_matches_a_published_runs_input_total():
    """vllm-project/vllm#8104 (vLLM 0.6.0, Meta-Llama-3-8B-Instruct, sharegpt, 1,000 prompts,
    --sharegpt-output-len 2000, seed 0): 'Total input tokens: 19495'."""
    total = vllm_sharegpt(1000, output_len=2000, seed=0)["num_prompt_tokens"].sum()
    assert total == pytest.approx(19_495, rel=0.05)


def test_sharegpt_order_is_pythons_seeded_shuffle_then_the_filter():
    lengths = sharegpt_lengths("sp32k")
    data = list(range(len(lengths)))
    random.seed(4)  # the tool: random.seed(seed); random.shuffle(self.data)
    random.shuffle(data)
    p, o = lengths["prompt"].to_numpy() + 1, lengths["output"].to_numpy() + 1
    want = [i for i in data if MIN_LEN <= p[i] <= MAX_PROMPT_LEN and o[i] >= MIN_LEN
            and p[i] + o[i] <= MAX_TOTAL_LEN][:200]
    df = vllm_sharegpt(200, seed=4, tokenizer="sp32k")
    assert df["num_prompt_tokens"].tolist() == p[want].tolist()
    assert df["num_output_tokens"].tolist() == o[want].tolist()
    plain = vllm_sharegpt(5, shuffle=False, tokenizer="sp32k")  # --disable-shuffle: file order
    first = [i for i in range(len(p)) if MIN_LEN <= p[i] <= MAX_PROMPT_LEN and o[i] >= MIN_LEN
             and p[i] + o[i] <= MAX_TOTAL_LEN][:5]
    assert plain["num_prompt_tokens"].tolist() == p[first].tolist()


def test_sharegpt_oversamples_as_the_tool_or_not():
    valid = len(vllm_sharegpt(10 ** 6, oversample=False))
    assert 10_000 < valid < len(sharegpt_lengths())
    df = vllm_sharegpt(valid + 50)
    assert len(df) == valid + 50 and _valid(df)
    assert len(vllm_sharegpt(valid + 50, formula="legacy")) == valid  # it never oversampled


def test_sharegpt_output_len_that_filters_every_row_is_named_not_a_traceback(capsys):
    with pytest.raises(ValueError, match="^output_len 5000 leaves no ShareGPT conversation"):
        vllm_sharegpt(10, output_len=5000)
    assert main(["run", "-w", "vllm-sharegpt", "--sharegpt-output-len", "200000", "-n", "5",
                 "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sim run: error: --sharegpt-output-len 200000 leaves no ShareGPT")


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_burstiness_error_says_inf_is_allowed(value, capsys):
    assert main(["run", "-w", "vllm-random", "--burstiness", value, "--rate", "2", "-n", "5",
                 "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sim run: error: --burstiness must be > 0 or inf, got ")


def test_burstiness_without_a_rate_is_named_not_dropped(capsys):
    """At request_rate inf every request is sent at t = 0: a burstiness there shapes nothing."""
    with pytest.raises(ValueError, match="^burstiness 2 shapes the gaps between requests"):
        vllm_random(5, burstiness=2.0)
    assert (vllm_random(5)["arrival_time"] == 0).all()  # burstiness 1, the default: fine
    assert main(["run", "-w", "vllm-random", "--burstiness", "2", "-n", "5", "-q"]) == 2
    assert capsys.readouterr().err.startswith("sim run: error: --burstiness 2 shapes the gaps")


def test_same_seed_same_workload_other_seed_other():
    for make in (lambda s: vllm_random(300, range_ratio=0.5, request_rate=3.0, seed=s),
                 lambda s: vllm_sharegpt(300, request_rate=3.0, burstiness=0.5, seed=s)):
        assert make(1).equals(make(1))
        assert not make(1).equals(make(2))


def test_load_names_them_and_refuses_their_arguments_elsewhere():
    df = workloads.load("vllm-random", n=20, rate=4.0, random_input_len=64,
                        random_prefix_len=32, burstiness=2.0, seed=3)
    assert df.equals(vllm_random(20, input_len=64, prefix_len=32, request_rate=4.0,
                                 burstiness=2.0, seed=3))
    assert {"vllm-random", "vllm-sharegpt"} <= set(workloads.trace_names())
    assert len(workloads.load("vllm-sharegpt")) == 1000  # --num-prompts' default
    with pytest.raises(ValueError, match="^burstiness applies to the vllm-random and"):
        workloads.load("azure-code", burstiness=2.0)
    with pytest.raises(ValueError, match="random_input_len does not apply to the 'vllm-sh"):
        workloads.load("vllm-sharegpt", random_input_len=10)
    with pytest.raises(ValueError, match="arrival=, cv= and arrival_times= do not shape"):
        workloads.load("vllm-random", arrival="gamma", cv=2.0)
    with pytest.raises(ValueError, match=r"random_range_ratio must be in \[0, 1\), got 1"):
        workloads.load("vllm-random", random_range_ratio=1.0)
    with pytest.raises(ValueError, match="input_len 1 with range_ratio 0 and special_tokens 1"):
        vllm_random(3, input_len=1)


def test_max_concurrency_caps_requests_in_flight_and_sends_none_early():
    df = vllm_random(200, input_len=256, output_len=64, request_rate=40.0, seed=2)
    res = sim.run(df, scheduler="continuous", closed_loop=workloads.MaxConcurrency(6))
    r = res.requests.sort_values("request_id")
    assert (r["arrival_time"].to_numpy() >= df["arrival_time"].to_numpy() - 1e-9).all()
    events = sorted([(t, 1) for t in r["arrival_time"]] + [(t, -1) for t in r["finish_time"]],
                    key=lambda e: (e[0], e[1]))
    assert max(np.cumsum([d for _, d in events])) == 6  # the cap, and reached
    at_once = vllm_random(60, input_len=256, output_len=64)  # --request-rate inf: a closed loop
    a = sim.run(at_once, scheduler="continuous", closed_loop=workloads.MaxConcurrency(6))
    b = sim.run(at_once, scheduler="continuous", closed_loop=workloads.ClosedLoop(6))
    assert a.requests.equals(b.requests)
    wide = sim.run(df, scheduler="continuous", closed_loop=workloads.MaxConcurrency(10 ** 4))
    open_loop = sim.run(df, scheduler="continuous")
    assert wide.summary()["ttft_p50"] == pytest.approx(open_loop.summary()["ttft_p50"], rel=0.02)


def test_published_command_line_replays_through_sim_run(tmp_path, capsys):
    """vllm bench serve --dataset-name random --random-input-len 1024 --random-output-len 128
    --request-rate 4 --num-prompts 200 (--seed 0), read across flag for flag."""
    out = tmp_path / "out"
    assert main(["run", "-w", "vllm-random", "--random-input-len", "1024",
                 "--random-output-len", "128", "--request-rate", "4", "--num-prompts", "200",
                 "-o", str(out), "-q"]) == 0
    summary = json.loads((out / "summary.json").read_text())["summary"]
    assert summary["num_finished"] == 200
    req = pd.read_parquet(out / "requests.parquet")
    assert set(req["num_prompt_tokens"]) == {1024} and set(req["num_output_tokens"]) == {128}
    assert req["arrival_time"].max() == pytest.approx(200 / 4)
    assert main(["run", "-w", "vllm-sharegpt", "--sharegpt-output-len", "64", "-n", "50",
                 "--max-concurrency", "8", "--burstiness", "0.5", "--rate", "10",
                 "--format", "vllm-bench", "-o", str(out), "-q"]) == 0
    doc = json.loads((out / "vllm-bench.json").read_text())  # the tool's own record of them
    assert (doc["request_rate"], doc["burstiness"], doc["max_concurrency"]) == (10.0, 0.5, 8)
    assert main(["run", "-w", "vllm-random", "-n", "20", "--rate", "5", "--burstiness", "inf",
                 "-o", str(out), "-q"]) == 0
    req = pd.read_parquet(out / "requests.parquet")
    assert np.allclose(np.diff(np.sort(req["arrival_time"])), 0.2)
    assert main(["run", "-w", "azure-code", "--random-prefix-len", "8", "-o", str(out)]) == 2
    assert "--random-prefix-len applies to the vllm-random" in capsys.readouterr().err
    assert main(["run", "-w", "vllm-random", "--max-concurrency", "4", "--closed-loop", "4",
                 "-o", str(out)]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_lengths_script_reads_a_cut_off_file(load_script, tmp_path):
    script = load_script("experiments/sharegpt_lengths.py")
    recs = [{"id": "a", "conversations": [{"from": "human", "value": "hi"},
                                          {"from": "gpt", "value": "hello"}]},
            {"id": "b", "conversations": [{"from": "human", "value": "one turn"}]},
            {"id": "c", "conversations": [{"from": "human", "value": "x"},
                                          {"from": "gpt", "value": "y"}]}]
    text = json.dumps(recs, indent=1)
    got, complete = script.records(text)
    assert complete and got == recs
    got, complete = script.records(text[:text.index('"c"') + 10])  # cut inside record c
    assert not complete and got == recs[:2]
    assert script.first_turns(recs) == [("hi", "hello"), ("x", "y")]
