"""Bad counts and bad files: ``workloads.load`` / ``load_file`` / ``validate`` give a clear
``ValueError`` or ``TypeError`` (naming the file and the row), never a crash from deep inside
pandas, never a silently shortened or empty workload. Readers fuzzed with hypothesis."""

import gzip
import json
import re
from functools import partial

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import workloads as wl

HEADER = "arrival_time,num_prompt_tokens,num_output_tokens\n"


@pytest.mark.parametrize("n, error, message", [
    (-5, ValueError, "n (the number of requests) must be >= 1, got -5"),
    (0, ValueError, "must be >= 1, got 0: an empty workload has nothing to simulate"),
    ("100", TypeError, "n (the number of requests) must be an integer, got '100'"),
    (2.5, TypeError, "must be an integer, got 2.5"),
    (True, TypeError, "must be an integer, got True"),
    (10_000_000, ValueError, "n=10,000,000 is more than the 8,819 requests of the 'azure-code'"),
])
def test_bad_counts_are_errors(n, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        wl.load("azure-code", n=n)


def test_length_set_is_resampled_only_past_its_size_and_says_so():
    df = wl.load("azure-code", n=8819)  # a replayed trace: exactly its size is fine
    assert len(df) == 8819 and "resampled_from" not in df.attrs
    assert wl.load("azure-code", n=np.int64(7))["request_id"].tolist() == list(range(7))
    size = len(wl.load("arxiv", rate=1.0))
    assert "resampled_from" not in wl.load("arxiv", n=size, rate=1.0).attrs
    df = wl.load("arxiv", n=size + 5, rate=1.0)
    assert len(df) == size + 5 and df.attrs["resampled_from"] == size


def test_file_counts_and_max_context(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text(HEADER + "0,5,5\n1,50,5\n2,500,5\n")
    assert len(wl.load(str(path), n=2)) == 2
    with pytest.raises(ValueError, match=r"n=4 is more than the 3 requests of .*w\.csv"):
        wl.load(str(path), n=4)
    with pytest.raises(ValueError, match="max_context=5 drops every request"):
        wl.load_file(path, max_context=5)
    with pytest.raises(ValueError, match="max_context must be an integer >= 2"):
        wl.load_file(path, max_context=-3)
    assert len(wl.load_file(path, max_context=100)) == 2


def test_empty_workloads_are_errors(tmp_path):
    with pytest.raises(ValueError, match="workload has no requests: nothing to simulate"):
        wl.validate(pd.DataFrame({c: [] for c in wl.REQUIRED}))
    (tmp_path / "h.csv").write_text(HEADER)
    with pytest.raises(ValueError, match=r"h\.csv: workload has no requests"):
        wl.load_file(tmp_path / "h.csv")
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"e\.jsonl: "):
        wl.load_file(tmp_path / "e.jsonl")


@pytest.mark.parametrize("name, content, message", [
    ("zero.csv", b"", r"zero\.csv: the file is empty"),
    ("bad.csv.gz", b"\x1f\x8b not gzip at all", r"bad\.csv\.gz: cannot be read as CSV"),
    ("bin.parquet", b"PAR1 garbage", r"bin\.parquet: cannot be read as PARQUET"),
    ("scalar.json", b"3", r"scalar\.json: "),
    ("latin1.csv", HEADER.encode() + b"0,5,\xff\xfe\n", r"latin1\.csv: "),
    ("ragged.csv", HEADER.encode() + b'0,5,5\n1,"2\n', r"ragged\.csv: "),
    ("hash.csv", (HEADER.strip() + ",hash_ids\n0,5,5,[1\n").encode(),
     r"hash\.csv: hash_ids: line 2 has '\[1', not a JSON list of integers"),
    ("hashnest.jsonl", json.dumps({"arrival_time": 0, "num_prompt_tokens": 5,
                                   "num_output_tokens": 5, "hash_ids": [[1]]}).encode(),
     r"hashnest\.jsonl: hash_ids: line 1 has \[\[1\]\], not a list of integers"),
    ("huge.csv", HEADER.encode() + b"0,1e30,5\n", r"huge\.csv: num_prompt_tokens: line 2 has "
                                                   r"1e\+30 \(must be an integer from 1 to 2\*\*53\)"),
    ("np.csv", HEADER.encode() + b"0,5,5\n1,-200,5\n",
     r"np\.csv: num_prompt_tokens: line 3 has -200 \(must be"),
])
def test_unreadable_files_name_the_file(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        wl.load_file(path)


def test_folder_and_unknown_names(tmp_path):
    (tmp_path / "d.csv").mkdir()
    with pytest.raises(ValueError, match="is a folder"):
        wl.load_file(tmp_path / "d.csv")
    with pytest.raises(ValueError, match="did you mean 'mooncake-conversation'"):
        wl.load("mooncake-conversaton")
    with pytest.raises(TypeError, match="trace name or a file path, got 3"):
        wl.load(3)


def test_an_empty_workload_name_is_named_as_such(capsys):
    """'' was read as the path '.': "workload file '.' is a folder"."""
    from sim.cli import main
    for name in ("", "  "):
        with pytest.raises(ValueError, match=f"workload {name!r} is neither a bundled trace "
                                             f"nor a file; bundled: azure-code"):
            wl.load(name)
    assert main(["run", "-w", "", "-q"]) == 2
    assert "--workload '' is neither" in capsys.readouterr().err


def test_messages_show_plain_numbers_not_numpy_reprs():
    cases = [{"arrival_time": np.array([0.0, -1.0])},
             {"arrival_time": np.array([2.0, 1.0])},
             {"num_output_tokens": np.array([5, -200], dtype=np.int64)},
             {"request_id": np.array([7, 7], dtype=np.int64)}]
    for change in cases:
        df = pd.DataFrame({"arrival_time": [0.0, 1.0], "num_prompt_tokens": [5, 5],
                           "num_output_tokens": [5, 5]}) .assign(**change)
        with pytest.raises(ValueError) as e:
            wl.validate(df)
        assert "np." not in str(e.value) and "row 1" in str(e.value)
    for bad, shown in ((lambda: wl.ClosedLoop(np.int64(-200)), "got -200"),
                       (lambda: wl.Uniform(np.int64(5), np.int64(2)), "got low=5, high=2"),
                       (lambda: wl.Fixed(np.int64(0)), "got 0"),
                       (lambda: wl.poisson(np.int64(-3), 1.0), "got -3"),
                       (lambda: wl.shared_prefix(10, rate=1.0, n_groups=np.int64(0),
                                                 system_prompt_tokens=5, user_tokens=5,
                                                 output=5), "got 0")):
        with pytest.raises(ValueError) as e:
            bad()
        assert str(e.value).endswith(shown) and "np." not in str(e.value)


# -- fuzzing: any bytes, any table: a valid workload or a clear error naming the file ---------

def _check(path):
    try:
        df = wl.load_file(path)
    except (ValueError, TypeError) as e:
        assert path.name in str(e), str(e)
        return
    assert len(df) >= 1
    assert (df["num_prompt_tokens"] >= 1).all() and (df["num_output_tokens"] >= 1).all()
    assert df["arrival_time"].is_monotonic_increasing


SUFFIXES = [".csv", ".jsonl", ".json", ".parquet", ".csv.gz", ".jsonl.gz"]
FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=st.binary(max_size=300), suffix=st.sampled_from(SUFFIXES))
def test_fuzz_random_bytes(tmp_path, data, suffix):
    path = tmp_path / f"fuzz{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") and data[:1] == b"z" else data)
    _check(path)


cell = st.one_of(st.integers(-10, 10**20), st.floats(allow_nan=True, allow_infinity=True),
                 st.text(max_size=6), st.none(), st.booleans())


@FUZZ
@given(rows=st.lists(st.tuples(cell, cell, cell), max_size=6),
       suffix=st.sampled_from([".csv", ".jsonl", ".parquet"]),
       cut=st.integers(0, 400))
def test_fuzz_wrong_typed_truncated_tables(tmp_path, rows, suffix, cut):
    df = pd.DataFrame(rows, columns=list(wl.REQUIRED), dtype=object)
    path = tmp_path / f"fuzz{suffix}"
    try:
        if suffix == ".parquet":
            df.astype(str).to_parquet(path)
        elif suffix == ".csv":
            df.to_csv(path, index=False)
        else:
            df.to_json(path, orient="records", lines=True)
    except (ValueError, TypeError, OverflowError):
        return  # pandas cannot write it: nothing to read
    raw = path.read_bytes()
    if cut < len(raw):
        path.write_bytes(raw[:cut])  # truncated mid-file
    _check(path)


@FUZZ
@given(text=st.text(max_size=200))
def test_fuzz_unicode_csv_text(tmp_path, text):
    path = tmp_path / "fuzz.csv"
    path.write_text(HEADER + text, encoding="utf-8")
    _check(path)


def test_timestamps_become_seconds_since_the_first(tmp_path):
    """A JSONL file of epoch times (pandas reads an ``arrival_time`` of epoch numbers as dates)
    and a parquet file of datetimes or durations: each arrival in seconds from the start. They
    were taken as micro/nanoseconds read as seconds: gaps 1e6-1e9 too long, and E2E rounded to
    0 at ~1e18 s."""
    from sim import run
    lines = [{"arrival_time": t, "num_prompt_tokens": 100, "num_output_tokens": 20}
             for t in (1700000000.25, 1700000001.5, 1700000004.0)]
    epoch = tmp_path / "epoch.jsonl"
    epoch.write_text("".join(json.dumps(x) + "\n" for x in lines))
    relative = pd.DataFrame(lines).assign(arrival_time=[0.0, 1.25, 3.75])
    assert wl.load(epoch)["arrival_time"].tolist() == [0.0, 1.25, 3.75]
    start = pd.Timestamp("2024-05-01 12:00:00", tz="UTC")
    stamps = relative.assign(arrival_time=start + pd.to_timedelta(relative["arrival_time"], "s"))
    stamps.to_parquet(tmp_path / "dt.parquet")
    (stamps.assign(arrival_time=stamps["arrival_time"] - start)
     .to_parquet(tmp_path / "td.parquet"))
    for name in ("dt.parquet", "td.parquet"):
        assert wl.load(tmp_path / name)["arrival_time"].tolist() == [0.0, 1.25, 3.75]
    want = run(relative).requests[["ttft", "e2e"]]
    assert want["e2e"].min() > 0
    pd.testing.assert_frame_equal(run(wl.load(epoch)).requests[["ttft", "e2e"]], want)
    stamps.loc[1, "arrival_time"] = pd.NaT
    with pytest.raises(ValueError, match=r"arrival_time: row 1 has NaT \(must be a finite"):
        wl.validate(stamps)


def test_a_csv_files_timestamps_and_durations_become_seconds_too(tmp_path):
    """A CSV file's arrival_time as ISO text (the Azure trace's own format; what workloads.save
    writes for a datetime or timedelta column) was refused where JSONL and parquet files of
    the same times load: a workload saved as CSV did not load back."""
    start = pd.Timestamp("2024-05-01 12:00:00")
    df = pd.DataFrame({"arrival_time": start + pd.to_timedelta([0.0, 1.25, 3.75], "s"),
                       "num_prompt_tokens": [100, 50, 20], "num_output_tokens": [20, 5, 9]})
    for name, times in (("dt.csv", df["arrival_time"]),
                        ("tz.csv", df["arrival_time"].dt.tz_localize("UTC")),
                        ("td.csv", df["arrival_time"] - start)):
        wl.save(df.assign(arrival_time=times), tmp_path / name)
        assert wl.load(tmp_path / name)["arrival_time"].tolist() == [0.0, 1.25, 3.75], name
    azure = tmp_path / "azure.csv"  # seven fractional digits, as the Azure trace writes them
    azure.write_text(HEADER + "2023-11-16 18:15:46.6805900,10,5\n2023-11-16 18:15:50.0,3,6\n")
    assert wl.load(azure)["arrival_time"].tolist() == [0.0, pytest.approx(3.31941)]
    mixed = tmp_path / "mixed.csv"  # a row that is not a timestamp is named
    mixed.write_text(HEADER + "2024-01-01 00:00:00,1,1\nsoon,2,2\n")
    with pytest.raises(ValueError, match=r"mixed.csv: arrival_time: line 3 has 'soon', not a "
                                         r"timestamp as line 2 \('2024-01-01 00:00:00'\)"):
        wl.load(mixed)
    typo = tmp_path / "typo.csv"  # numbers stay seconds: '0' is no duration of 0 ns
    typo.write_text(HEADER + "0,1,1\nx,2,2\n")
    with pytest.raises(ValueError, match=r"typo.csv: arrival_time: line 3 has 'x' \(must be a "
                                         r"finite number of seconds"):
        wl.load(typo)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_hash_block_tokens_says_what_a_csv_or_jsonl_file_cannot(tmp_path, suffix):
    """A CSV/JSONL file's hash_ids carry no block size (newcomer review: such a file could not
    be simulated with prefix caching from the CLI). ``hash_block_tokens`` gives it; the prefix
    cache then hits as the ids say. Closed form (block mode, 16-token pages, 512 tokens an id):
    b repeats a's two ids and hits all but its last page (a prompt keeps one token to compute),
    c shares the first id: (1024 - 16 + 512) / 3072 of the prompt tokens."""
    import sim
    df = pd.DataFrame({"arrival_time": [0.0, 0.5, 1.0], "num_prompt_tokens": [1024] * 3,
                       "num_output_tokens": [10] * 3, "hash_ids": [[1, 2], [1, 2], [1, 3]]})
    path = wl.save(df, tmp_path / f"w{suffix}")
    with pytest.raises(ValueError, match=r"no attrs\['block_size'\].*hash_block_tokens=N"):
        sim.run(wl.load(path), scheduler="vllm", cost_model=sim.ConstantCost(0.01))
    loaded = wl.load(path, hash_block_tokens=512)
    assert loaded.attrs["block_size"] == 512 and wl.load_file(path).attrs.get("block_size") is None
    res = sim.run(loaded, scheduler="vllm", cost_model=sim.ConstantCost(0.01))
    assert res.summary()["prefix_hit_rate"] == (1024 - 16 + 512) / 3072
    for bad, error in ((0, ValueError), (-512, ValueError), (True, ValueError), ("512", ValueError),
                       (1.5, ValueError)):
        with pytest.raises(error, match="hash_block_tokens must be a positive integer"):
            wl.load(path, hash_block_tokens=bad)


def test_hash_block_tokens_must_agree_with_the_workloads_own(tmp_path):
    df = wl.shared_prefix(4, n_groups=1, system_prompt_tokens=64, user_tokens=16, output=2,
                          rate=1.0, block_size=16)
    path = tmp_path / "w.parquet"
    df.to_parquet(path, index=False)  # keeps attrs["block_size"] = 16
    assert wl.load(path, hash_block_tokens=16).attrs["block_size"] == 16
    with pytest.raises(ValueError, match=r"^hash_block_tokens 32 contradicts .*w.parquet's own 16 "
                                         r"tokens per hash id"):
        wl.load(path, hash_block_tokens=32)
    with pytest.raises(ValueError, match="^hash_block_tokens 512 applies to a workload with "
                                         "hash_ids: the 'azure-code' trace has no hash_ids"):
        wl.load("azure-code", n=5, hash_block_tokens=512)
    assert wl.load("mooncake-synthetic", n=5, hash_block_tokens=512).attrs["block_size"] == 512


@pytest.mark.parametrize("ids, message", [
    ([1, "x", 3], r"request_id: row 1 has 'x' \(str\) where row 0 has 1 \(number\); ids must be "
                  r"all numbers or all text"),
    (["a", 2, "c"], r"request_id: row 1 has 2 \(number\) where row 0 has 'a' \(str\)"),
    ([1, None, 3], r"request_id: row 1 is empty"),
    ([np.nan, 2.0, 3.0], r"request_id: row 0 is empty"),
])
def test_request_ids_are_all_there_and_of_one_kind(tmp_path, capsys, ids, message):
    """A JSONL file whose ids mix numbers and text used to load and simulate, then `sim run`
    failed writing requests.parquet (pyarrow: "Could not convert 'x' with type str"); an
    empty id loaded as NaN, an identity that names no request."""
    from sim.cli import main
    rows = [{"request_id": i, "arrival_time": float(k), "num_prompt_tokens": 5,
             "num_output_tokens": 3} for k, i in enumerate(ids)]
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows).replace("NaN", "null"))
    in_file = re.sub(r"row (\d+)", lambda m: f"line {int(m.group(1)) + 1}", message)
    with pytest.raises(ValueError, match=f"w.jsonl: {in_file}"):  # (the file's line numbers)
        wl.load(str(path))
    with pytest.raises(ValueError, match=message):
        wl.validate(pd.DataFrame(rows))
    assert main(["run", "-w", str(path), "-o", str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "w.jsonl: request_id: line" in err


def test_request_ids_of_one_kind_are_kept():
    base = {"arrival_time": [0.0, 1.0], "num_prompt_tokens": [5, 5], "num_output_tokens": [3, 3]}
    for ids in (["a", "b"], [7, 9], [1.5, 2.0], np.array([4, 2], dtype=np.int64)):
        out = wl.validate(pd.DataFrame(base).assign(request_id=ids))
        assert out["request_id"].tolist() == list(ids)


@pytest.mark.parametrize("name, kwargs, message", [
    # a replayed trace or a file kept its own times: arrival_times= came back unused
    ("azure-conv", {"arrival_times": [0.0, 100.0, 200.0]},
     r"arrival_times=: for the arrivals of a length-only set; the 'azure-conv' trace has its "
     r"own arrival times \(rate= time-scales them\)"),
    ("mooncake-conversation", {"arrival": "gamma", "cv": 3.0},
     r"arrival='gamma', cv=3.0: for the arrivals of a length-only set"),
    ("FILE", {"arrival_times": [0.0, 100.0, 200.0]}, r"w.csv has its own arrival times"),
    # a length-only set: the rate was dropped for arrival_times, cv for Poisson arrivals
    ("sharegpt", {"arrival_times": [0.0, 100.0, 200.0], "rate": 5.0},
     r"'sharegpt': give rate= or arrival_times=, not both"),
    ("sharegpt", {"rate": 5.0, "cv": 3.0},
     r"cv=3.0 applies to arrival='gamma' \('poisson' arrivals do not take it\)"),
    ("arxiv", {"arrival_times": [0.0, 1.0, 2.0], "arrival": "gamma"},
     r"'arxiv': arrival= and cv= draw arrivals at rate=; arrival_times= gives them"),
])
def test_arrival_arguments_that_would_change_nothing_are_errors(tmp_path, name, kwargs,
                                                                 message):
    if name == "FILE":
        name = str(tmp_path / "w.csv")
        (tmp_path / "w.csv").write_text(HEADER + "0,5,5\n1,5,5\n2,5,5\n")
    with pytest.raises(ValueError, match=message):
        wl.load(name, n=3, **kwargs)


def test_arrival_arguments_that_apply_are_used():
    times = [0.0, 100.0, 200.0]
    assert wl.load("sharegpt", n=3, arrival_times=times)["arrival_time"].tolist() == times
    gamma = wl.load("sharegpt", n=3, rate=2.0, arrival="gamma", cv=2.0, seed=1)
    assert not np.allclose(gamma["arrival_time"],
                           wl.load("sharegpt", n=3, rate=2.0, seed=1)["arrival_time"])
    for make in (partial(wl.synthetic, prompt=5), partial(wl.shared_prefix, n_groups=2,
                                                           system_prompt_tokens=32,
                                                           user_tokens=5)):
        with pytest.raises(ValueError, match="cv=2.0 applies to arrival='gamma' \\('constant'"):
            make(3, rate=1.0, output=5, arrival="constant", cv=2.0)
    plain = wl.load("azure-conv", n=3)  # the defaults, spelt out, are no error
    assert wl.load("azure-conv", n=3, arrival="poisson", cv=1.0).equals(plain)


@pytest.mark.parametrize("suffix, row", [(".csv", "line 3"), (".jsonl", "line 2"),
                                         (".parquet", "row 1")])
def test_more_hash_ids_than_the_prompt_has_blocks_is_an_error(tmp_path, suffix, row):
    """Newcomer review: a row with more hash ids than ceil(prompt / tokens per id) loaded
    silently (the ids past the prompt name tokens it does not have; the radix cache made
    nodes of them). Exactly ceil(prompt / H) ids is fine (a last partial block has its id);
    one more is an error naming the file and the row, also when rows before it are dropped
    (max_context: the row as in the file)."""
    df = pd.DataFrame({"arrival_time": [0.0, 1.0], "num_prompt_tokens": [1025, 1024],
                       "num_output_tokens": [4, 4], "hash_ids": [[1, 2, 3], [1, 2, 3]]})
    df.attrs["block_size"] = 512
    path = wl.save(df, tmp_path / f"w{suffix}")
    message = (rf"^{re.escape(str(path))}: hash_ids: {row} has 3 ids for its 1024 prompt "
               rf"tokens: at 512 tokens per hash id at most 2 \(ceil\(1024 / 512\)\)")
    with pytest.raises(ValueError, match=message):
        wl.load(path, hash_block_tokens=512, max_context=1028)
    ok = df.assign(num_prompt_tokens=[1025, 1025])
    assert len(wl.load(wl.save(ok, tmp_path / f"ok{suffix}"), hash_block_tokens=512)) == 2
    if suffix != ".parquet":  # no block size, nothing to check it by (the run asks for one)
        assert len(wl.load(path)) == 2


def test_a_dataframe_with_too_many_hash_ids_is_an_error_at_the_run():
    import sim
    df = pd.DataFrame({"arrival_time": [0.0, 1.0], "num_prompt_tokens": [32, 33],
                       "num_output_tokens": [4, 4], "hash_ids": [[1, 2], [1, 2, 3, 4]]})
    df.attrs.update(block_size=16, name="mine")
    for mode in ("vllm", "sglang"):  # (block and radix caches)
        with pytest.raises(ValueError, match=r"^workload 'mine': hash_ids: row 1 has 4 ids for "
                                             r"its 33 prompt tokens: at 16 tokens per hash id "
                                             r"at most 3"):
            sim.run(df, scheduler=mode, cost_model=sim.ConstantCost(0.01))
    assert sim.run(df.iloc[:1], scheduler="vllm", cost_model=sim.ConstantCost(0.01)) \
        .summary()["num_finished"] == 1


@pytest.mark.parametrize("name", ["mooncake-conversation", "mooncake-synthetic"])
def test_the_shipped_mooncake_traces_have_one_id_per_512_tokens(name):
    """The bundled traces keep the rule they are checked by: every row has exactly
    ceil(input_length / 512) hash ids (measured: all 12,031 and 3,993 rows)."""
    df = wl.load(name)
    counts = np.array([len(x) for x in df["hash_ids"]])
    assert (counts == -(-df["num_prompt_tokens"].to_numpy() // 512)).all()


def test_a_jsonl_line_that_is_not_json_is_named_by_its_line(tmp_path, capsys):
    """pandas named a byte position ("at position 400"): the file's line, as an editor counts."""
    from sim.cli import main
    rows = ['{"arrival_time": %d, "num_prompt_tokens": 10, "num_output_tokens": 5}' % i
            for i in range(4)] + ['{"arrival_time": 4, "num_prompt_tokens": 10 '
                                  '"num_output_tokens": 5}']
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(rows) + "\n")
    assert main(["run", "-w", str(path), "-o", str(tmp_path / "o"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err == (f"sim run: error: {path}: cannot be read as JSONL: line 5 is not JSON: "
                   f"Expecting ',' delimiter (column 45)\n")
