"""Determinism (issue 32): the same inputs give the same bytes. ``summary.json`` (the wall time
apart, in ``timing.json``) and the parquet files of two runs are identical, and the 31 result
hashes match the stored ones. Marked ``determinism``: ``.ci/run`` runs these under two
OpenBLAS kernels (``OPENBLAS_CORETYPE``), checking that each kernel was the one used."""

import json
from pathlib import Path

import pytest

from sim.cli import main

pytestmark = pytest.mark.determinism
ROOT = Path(__file__).resolve().parents[1]


def _outputs(folder):
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())}


@pytest.mark.parametrize("extra", [
    [],  # the roofline on the default model and GPU
    ["-s", "vllm", "--replicas", "2", "--slo-ttft", "1", "--slo-itl", "0.1"],
    ["--prefix-caching", "block", "-w", "mooncake-conversation", "--rate", "2"],
])
def test_the_same_inputs_give_the_same_summary_json_bytes(tmp_path, extra):
    out = tmp_path / "out"
    argv = ["run", "-w", "sharegpt", "-n", "300", "--rate", "8", "-o", str(out), "-q", *extra]
    if "-w" in extra:  # (the trace given: its own workload, at the rate given)
        argv = argv[:1] + argv[3:]
    assert main(argv) == 0
    first = _outputs(out)
    assert main(argv) == 0
    second = _outputs(out)
    assert sorted(first) == ["iterations.parquet", "requests.parquet", "summary.json",
                             "timing.json"]
    for name in ("summary.json", "requests.parquet", "iterations.parquet"):
        assert first[name] == second[name], name
    doc = json.loads(first["summary.json"])
    assert not [k for k in doc["summary"] if "wall" in k]  # kept apart
    assert json.loads(second["timing.json"])["wall_seconds"] > 0


def test_the_result_hashes_match_the_stored_ones(load_script, capsys):
    """The 31 configurations of ``benchmarks/hashes.py``: every request's times, every
    iteration and the summary, the same bits as stored (under whichever BLAS kernel runs)."""
    hashes = load_script("benchmarks/hashes.py")
    assert hashes.main(["--check", str(ROOT / "benchmarks" / "hashes.json")]) == 0
    assert "all 31 identical" in capsys.readouterr().out
