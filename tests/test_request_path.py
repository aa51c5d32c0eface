"""``sim.engine.fleet.request_path``: the client's time outside the engine (front end,
tokeniser)."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
import workloads as wl
from sim.cli import main
from sim.engine.fleet.request_path import (RequestPath, engine_arrivals, held_out_errors, overheads,
                                     triton_path)
from test_serving_fidelity import vs  # noqa: F401 (the serving check's module, a fixture)

GPU = dict(model="llama-3.1-8b", gpu="h100")
PATH = RequestPath(in_s=0.002, per_prompt_token_s=5e-6, out_s=0.003)


def _workload(n=120, rate=20.0, seed=0):
    return wl.synthetic(n, rate=rate, prompt=wl.LogNormal(400, 1.0, max_tokens=3000),
                        output=wl.LogNormal(40, 1.0, max_tokens=300), seed=seed)


def _same(a, b):
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.iterations, b.iterations, check_exact=True)
    sa, sb = a.summary(), b.summary()
    sa.pop("wall_seconds"), sb.pop("wall_seconds")  # the simulation's own runtime
    assert str(sa) == str(sb)  # (NaN-safe)


def test_one_request_alone_closed_form():
    """Client TTFT = engine TTFT + in + tokenising the prompt + out; E2E likewise; TPOT and
    the engine's queue unchanged."""
    df = pd.DataFrame({"arrival_time": [0.5], "num_prompt_tokens": [467],
                       "num_output_tokens": [16]})
    alone = sim.run(df, **GPU).requests.iloc[0]
    seen = sim.run(df, request_path=PATH, **GPU).requests.iloc[0]
    extra = PATH.in_s + PATH.per_prompt_token_s * 467 + PATH.out_s
    assert seen.arrival_time == 0.5
    assert seen.engine_arrival_time == pytest.approx(0.5 + PATH.in_s + 467 * 5e-6, abs=1e-15)
    assert seen.ttft == pytest.approx(alone.ttft + extra, abs=1e-12)
    assert seen.e2e == pytest.approx(alone.e2e + extra, abs=1e-12)
    assert seen.tpot == pytest.approx(alone.tpot, abs=1e-12)
    assert seen.queueing_delay == pytest.approx(alone.queueing_delay, abs=1e-12)


def test_all_at_once_the_tokeniser_serves_them_in_turn():
    """One FIFO tokeniser (D/D/1): n requests of p tokens sent together reach the engine
    ``in + k * c * p`` apart, k = 1..n."""
    n, p = 50, 300
    e = engine_arrivals(np.zeros(n), np.full(n, p), PATH)
    np.testing.assert_allclose(e, PATH.in_s + np.arange(1, n + 1) * p * 5e-6, rtol=0,
                               atol=1e-15)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 0.01), st.integers(1, 5000)), min_size=1, max_size=60),
       st.floats(0, 1e-3), st.floats(0, 1e-5))
def test_engine_arrivals_are_the_fifo_queue(rows, in_s, per_token):
    """The closed form equals the recurrence e_i = max(a_i + in, e_{i-1}) + c p_i; the order
    is kept and no request reaches the engine before it could be tokenised."""
    a = np.cumsum([g for g, _ in rows])
    p = np.array([k for _, k in rows], dtype=float)
    path = RequestPath(in_s, per_token, 0.0)
    e = engine_arrivals(a, p, path)
    brute, last = [], -math.inf
    for ai, pi in zip(a, p):
        last = max(ai + in_s, last) + per_token * pi
        brute.append(last)
    np.testing.assert_allclose(e, brute, rtol=1e-12, atol=1e-12)
    assert (np.diff(e) >= 0).all()
    assert (e >= a + in_s + per_token * p - 1e-12).all()


@pytest.mark.parametrize("kw", [
    dict(scheduler="chunked"),
    dict(scheduler="sglang"),
    dict(scheduler="chunked", replicas=2, router="least_outstanding"),
    dict(scheduler="chunked", disaggregation=sim.Disaggregation(prefill_replicas=1,
                                                                decode_replicas=1)),
], ids=["chunked", "sglang", "cluster", "disaggregated"])
def test_the_engine_runs_the_shifted_workload_and_nothing_is_lost(kw):
    """With a path the engine's iterations are exactly those of the workload arriving at the
    engine's times; every request comes out once; the client's times are the engine's plus
    out (tokens) and minus the path in (arrival)."""
    df = _workload()
    seen = sim.run(df, request_path=PATH, **GPU, **kw)
    shifted = df.assign(arrival_time=seen.requests["engine_arrival_time"].to_numpy())
    engine = sim.run(shifted, **GPU, **kw)
    pd.testing.assert_frame_equal(seen.iterations, engine.iterations, check_exact=True)
    req, eng = seen.requests, engine.requests
    assert len(req) == len(df) and req["request_id"].is_unique
    assert set(req["status"]) <= {"finished", "rejected"}
    np.testing.assert_array_equal(req["arrival_time"], df["arrival_time"])
    np.testing.assert_array_equal(req["first_token_time"], eng["first_token_time"] + PATH.out_s)
    np.testing.assert_array_equal(req["finish_time"], eng["finish_time"] + PATH.out_s)
    np.testing.assert_array_equal(req["tpot"], eng["tpot"])
    np.testing.assert_array_equal(req["queueing_delay"], eng["queueing_delay"])
    gap = req["engine_arrival_time"] - req["arrival_time"] + PATH.out_s
    np.testing.assert_allclose(req["ttft"], eng["ttft"] + gap, rtol=0, atol=1e-9)


@pytest.mark.parametrize("kw", [
    dict(scheduler="chunked"),
    dict(scheduler="continuous", closed_loop=wl.ClosedLoop(4, 0.05)),
    dict(scheduler="chunked", replicas=3),
    dict(scheduler="chunked", disaggregation=sim.Disaggregation(prefill_replicas=1,
                                                                decode_replicas=1)),
], ids=["chunked", "closed", "cluster", "disaggregated"])
def test_a_zero_path_is_no_path_bit_for_bit(kw):
    df = _workload(80)
    off = sim.run(df, **GPU, **kw)
    _same(off, sim.run(df, request_path=RequestPath(), **GPU, **kw))
    _same(off, sim.run(df, request_path=None, **GPU, **kw))


def test_same_config_same_output():
    df = _workload(80)
    _same(sim.run(df, request_path=PATH, **GPU), sim.run(df, request_path=PATH, **GPU))


@pytest.mark.parametrize("kw, error, words", [
    (dict(in_s=-0.001), ValueError, "request_path.in_s must be a finite number of seconds >= 0, "
                                    "got -0.001"),
    (dict(per_prompt_token_s=math.nan), ValueError, "request_path.per_prompt_token_s"),
    (dict(out_s=math.inf), ValueError, "request_path.out_s"),
    (dict(out_s="1"), TypeError, "request_path.out_s must be a number of seconds, got '1'"),
    (dict(in_s=True), TypeError, "request_path.in_s"),
])
def test_bad_values_name_the_field(kw, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(".", r"\.")):
        RequestPath(**kw)


def test_bad_config_is_refused():
    with pytest.raises(TypeError, match="request_path must be a sim.RequestPath or None, got 3"):
        sim.SimConfig(request_path=3)
    # a closed loop takes it (tests/test_request_path_closed.py): no longer refused
    assert sim.SimConfig(request_path=PATH, closed_loop=wl.ClosedLoop(2, 0.0)).request_path == PATH


def test_the_data_file_is_sourced_and_the_triton_path_is_its_fit_rows():
    rows = overheads()
    assert {"fit", "held-out", "context"} <= set(rows["split"])
    assert rows["source"].str.len().min() > 40
    assert rows.loc[rows["component"] != "context", "seconds"].gt(0).all()
    path = triton_path(rows)
    # the fit rows as published: 539 and 543 us round trips (gRPC, one at a time), halved;
    # 1.1 s for about 1M tokens
    assert path.in_s + path.out_s == pytest.approx((539 + 543) / 2 * 1e-6, rel=1e-12)
    assert path.in_s == path.out_s
    assert path.per_prompt_token_s == pytest.approx(1.1e-6, rel=1e-12)


def test_held_out_rows_against_the_triton_path():
    """Measured against the held-out rows: the round trip within 31 % of each (four rows:
    +12.7, -8.5, -0.6, -31.0 %); the tokeniser within a factor 3 of Hugging Face's own
    benchmarks (median |error| 44 %) and 9 times faster than a C++ server's chat-completions
    encode, chat template included (-89 %)."""
    err = held_out_errors()
    trip = err[err["component"] == "round_trip"]["error"]
    assert len(trip) == 4 and trip.abs().max() < 0.32
    hf = err[(err["component"] == "tokenize") & (err["front_end"] == "hf-tokenizers")]["error"]
    assert len(hf) == 5 and hf.abs().median() < 0.45 and (1 + hf).min() > 1 / 3
    cpp = err[err["front_end"] == "tt-inference-server C++"]["error"]
    assert cpp.iloc[0] == pytest.approx(1.1 / 10.0718 - 1, abs=1e-3)


def test_cli_flag(tmp_path, capsys):
    out = tmp_path / "o"
    base = ["run", "--workload", "azure-code", "--num-requests", "30", "--quiet"]
    assert main(base + ["--output", str(out / "off")]) == 0
    assert main(base + ["--request-path", "2,5,3", "--output", str(out / "on")]) == 0
    off = pd.read_parquet(out / "off" / "requests.parquet")
    on = pd.read_parquet(out / "on" / "requests.parquet")
    assert "engine_arrival_time" not in off.columns
    extra = on["engine_arrival_time"] - on["arrival_time"] + 0.003
    assert (extra >= 0.002 + 5e-6 * on["num_prompt_tokens"] + 0.003 - 1e-12).all()
    np.testing.assert_array_equal(on["arrival_time"], off["arrival_time"])
    import json
    settings_on = json.loads((out / "on" / "summary.json").read_text())["settings"]
    assert settings_on["request_path"] == pytest.approx(
        {"in_s": 0.002, "per_prompt_token_s": 5e-6, "out_s": 0.003}, rel=1e-12)
    assert "request_path" not in json.loads((out / "off" / "summary.json").read_text())["settings"]
    for spec, words in (("1,x,2", "--request-path must be triton, off or IN_MS,US_PER_TOKEN,"
                                  "OUT_MS"), ("-1,1,2", "--request-path IN_MS must be a finite")):
        assert main(base + [f"--request-path={spec}", "--output", str(out / "bad")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and words in err and "Traceback" not in err


def test_toml_key(tmp_path, capsys):
    """``request_path`` in a TOML file (review6: it was an unknown setting there), the same
    spec as the flag's, which overrides it; bad values name the file's key; a closed loop
    takes it too (its users issue on the finish the client sees)."""
    out = tmp_path / "o"
    toml = tmp_path / "exp.toml"
    toml.write_text('workload = "azure-code"\nnum_requests = 30\nrequest_path = "2,5,3"\n')
    assert main(["run", str(toml), "-q", "-o", str(out / "file")]) == 0
    assert main(["run", "--workload", "azure-code", "--num-requests", "30", "-q",
                 "--request-path", "2,5,3", "-o", str(out / "flag")]) == 0
    file_ = pd.read_parquet(out / "file" / "requests.parquet")
    pd.testing.assert_frame_equal(file_, pd.read_parquet(out / "flag" / "requests.parquet"))
    import json
    assert json.loads((out / "file" / "summary.json").read_text())["settings"][
        "request_path"] == pytest.approx({"in_s": 0.002, "per_prompt_token_s": 5e-6,
                                          "out_s": 0.003}, rel=1e-12)
    assert main(["run", str(toml), "-q", "--request-path", "off", "-o", str(out / "off")]) == 0
    assert "engine_arrival_time" not in pd.read_parquet(out / "off" / "requests.parquet")
    for text, words in (('request_path = 2', "exp.toml: request_path must be a string"),
                        ('request_path = "1,x"', "exp.toml: request_path must be triton, off")):
        toml.write_text('workload = "azure-code"\nnum_requests = 30\n' + text + "\n")
        assert main(["run", str(toml), "-q", "-o", str(out / "bad")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and words in err and "Traceback" not in err, err
    toml.write_text('workload = "azure-code"\nnum_requests = 30\nrequest_path = "2,5,3"\n'
                    'closed_loop_users = 2\n')
    assert main(["run", str(toml), "-q", "-o", str(out / "closed")]) == 0
    closed = pd.read_parquet(out / "closed" / "requests.parquet")
    assert (closed["engine_arrival_time"] > closed["arrival_time"]).all()


def test_sim_capacity_takes_the_path(capsys):
    """``sim capacity --request-path`` (review6: only sim run had it): a TTFT limit the path's
    fixed 60 ms alone exceeds is met at no rate; 'off' is no path; the TOML key works there
    too (test_toml_key's checks are shared: cli.run.with_request_path)."""
    argv = ["capacity", "--workload", "azure-code", "--num-requests", "40", "--cost",
            "constant:0.001", "--slo-ttft", "0.05"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert main(argv + ["--request-path", "off"]) == 0
    assert capsys.readouterr().out == plain
    assert main(argv + ["--request-path", "30,0,30"]) == 1
    assert "no rate tried meets the SLOs" in capsys.readouterr().out
    assert main(argv + ["--request-path", "1,x"]) == 2
    assert "--request-path must be triton, off" in capsys.readouterr().err


def test_serving_check_option_adds_tritons_path_to_tritons_rows_only(vs):
    """``validate_serving.py --request-path``: Triton's rows get ``triton_path``, LMDeploy's
    (a client in the engine's process, no HTTP or gRPC front end) none; off by default. At 2 req/s
    (50 requests) a Triton row's mean TTFT grows by at least the path's fixed part."""
    rows = vs.load_rows()
    tri = rows[(rows.engine == "tensorrt-llm-0.14-triton") & (rows.metric == "ttft_mean")
               & (rows.request_rate == 2)].iloc[:1]
    lmd = rows[rows.engine == "lmdeploy-0.1-turbomind"].iloc[0]
    assert vs.config(tri.iloc[0]).request_path is None
    assert vs.config(tri.iloc[0], request_path=True).request_path == triton_path()
    assert vs.config(lmd, request_path=True).request_path is None
    before = vs.validate(tri, max_requests=50)["predicted"].iloc[0]
    after = vs.validate(tri, max_requests=50, request_path=True)["predicted"].iloc[0]
    path = triton_path()
    fixed_ms = (path.in_s + path.out_s + path.per_prompt_token_s * tri.iloc[0].input_tokens) * 1e3
    assert after - before == pytest.approx(fixed_ms, rel=0.02)
