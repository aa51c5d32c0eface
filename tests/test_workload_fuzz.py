"""Workload files under random damage: whatever the bytes, ``workloads.load`` either returns a
valid workload or raises ValueError/TypeError naming the file (never another exception), and
``sim run -w FILE`` exits 2 with one line."""

import io

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import workloads
from sim.cli import main

GOOD = pd.DataFrame({"arrival_time": [0.0, 0.5, 1.25], "num_prompt_tokens": [12, 40, 7],
                     "num_output_tokens": [3, 9, 1]})


def _bytes(fmt) -> bytes:
    if fmt == "csv":
        return GOOD.to_csv(index=False).encode()
    if fmt == "jsonl":
        return GOOD.to_json(orient="records", lines=True).encode()
    buf = io.BytesIO()
    GOOD.to_parquet(buf)
    return buf.getvalue()


def _damage(data, cut, flips):
    data = bytearray(data[:cut] if cut < len(data) else data)
    for pos, value in flips:
        if data:
            data[pos % len(data)] = value
    return bytes(data)


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(fmt=st.sampled_from(["csv", "jsonl", "parquet"]), cut=st.integers(0, 4000),
       flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6))
def test_damaged_files_load_or_fail_naming_the_file(tmp_path, fmt, cut, flips):
    path = tmp_path / f"w.{fmt}"
    path.write_bytes(_damage(_bytes(fmt), cut, flips))
    try:
        df = workloads.load(str(path))
    except (ValueError, TypeError) as e:
        assert str(path) in str(e), str(e)
        return
    ok = workloads.validate(df)  # what loaded is a valid workload
    assert len(ok) >= 1


@pytest.mark.parametrize("data", [b"", b"\x00\xff" * 50, b"arrival_time\n1\n", b"PAR1junk"])
def test_cli_gives_one_line_for_a_broken_file(tmp_path, capsys, data):
    path = tmp_path / "w.csv"
    path.write_bytes(data)
    assert main(["run", "-w", str(path), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "Traceback" not in err
