"""The CLI refuses a run that cannot fit in memory before drawing its workload (issue 32:
``-n 100000000`` was killed by the OOM killer without a word), and warns above half of it."""

import pytest

import sim.cli.footprint as footprint
from sim.cli import main


def test_a_run_beyond_the_memory_available_is_refused_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(footprint, "available_bytes", lambda: 2e9)
    drawn = []
    import workloads
    monkeypatch.setattr(workloads, "load", lambda *a, **k: drawn.append(1))
    assert main(["run", "-w", "sharegpt", "--rate", "5", "-n", "10000000"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("sim run: error: --num-requests 10,000,000: ")
    assert "at least 12.3 GB" in err and "more than the 2 GB of memory available" in err
    fits = int(err.split("at most about ")[1].split()[0].replace(",", ""))
    assert footprint.estimate_bytes(fits) <= 2e9 < footprint.estimate_bytes(fits + 1000)
    assert not drawn  # refused before anything was allocated


@pytest.mark.parametrize("name", ["vllm-random", "vllm-sharegpt"])
def test_a_generated_bench_workload_beyond_the_memory_is_refused_too(name, monkeypatch,
                                                                     capsys):
    """vllm bench serve's workloads draw any n as a length-only set does (-n 1e8 was killed
    by the OOM killer: they skipped the check)."""
    monkeypatch.setattr(footprint, "available_bytes", lambda: 2e9)
    drawn = []
    import workloads
    monkeypatch.setattr(workloads, "load", lambda *a, **k: drawn.append(1))
    assert main(["run", "-w", name, "--rate", "5", "-n", "10000000"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("sim run: error: --num-requests 10,000,000: ")
    assert not drawn


def test_a_run_over_half_the_memory_is_a_warning(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(footprint, "available_bytes", lambda: 2 * footprint.estimate_bytes(300)
                        - 1)
    assert main(["run", "-w", "sharegpt", "--rate", "5", "-n", "300", "-q", "-o",
                 str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "warning: --num-requests 300: a run keeps every request" in err


def test_the_memory_available_is_read_here():
    room = footprint.available_bytes()
    assert room is None or room > 0
    if room is not None and room < footprint.estimate_bytes(100_000_000):
        with pytest.raises(ValueError, match="more than the .* GB of memory available"):
            footprint.check_footprint(100_000_000)
