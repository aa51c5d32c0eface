"""Faults survived (issue 32): a sweep whose worker process is killed mid-run (local processes,
and a Dask cluster of processes started here) completes on resume with no point lost or run
twice; a full disk while writing outputs is a one-line error that leaves the previous outputs
as they were (:mod:`sim.results.atomic`)."""

import errno
import functools
import os
import signal
from pathlib import Path

import pandas as pd
import pytest

import sim
import workloads as wl
from sim.cli import main
from sim.tools.sweep_backends import WorkerLost

GRID = {"max_batch_size": [1, 2, 4, 8, 16, 32]}
BASE = sim.SimConfig(scheduler="continuous", cost_model=sim.ConstantCost(0.01))
SUMMARY = ["max_batch_size", "repeat", "num_finished", "ttft_mean", "e2e_p99", "error"]


def _load_dying_once(seed, *, folder, at, parent):
    """The workload, drawn per call; the ``at``-th call (counted with files in ``folder``, one
    per call, created exclusively) kills its own process with SIGKILL, as the OOM killer
    would - never the test's own process."""
    i = 0
    while True:
        try:
            os.close(os.open(os.path.join(folder, f"call-{i}"), os.O_CREAT | os.O_EXCL))
            break
        except FileExistsError:
            i += 1
    if i == at and os.getpid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return wl.synthetic(60, rate=20.0, prompt=200, output=30, seed=seed)


def _dying(tmp_path, at):
    folder = tmp_path / "calls"
    folder.mkdir(parents=True)
    return functools.partial(_load_dying_once, folder=str(folder), at=at, parent=os.getpid())


def _reference(tmp_path):
    df = _dying(tmp_path / "reference", at=-1)  # (never dies)
    return sim.sweep(df, GRID, base=BASE, workers=1)[SUMMARY]


def _complete(table, out):
    """Every point once, in the table and in the file, without an error."""
    on_disk = pd.read_parquet(out)
    for t in (table, on_disk):
        assert sorted(t["max_batch_size"]) == GRID["max_batch_size"]
        assert (t["error"] == "").all()
    return table[SUMMARY].sort_values("max_batch_size", ignore_index=True)


def test_a_local_worker_killed_mid_sweep_loses_only_its_points_and_a_resume_runs_them(tmp_path):
    out = tmp_path / "sweep.parquet"
    work = _dying(tmp_path, at=2)
    with pytest.raises(WorkerLost, match=r"points lost: their worker process died .*call again "
                                         r"with the same out="):
        sim.sweep(work, GRID, base=BASE, workers=2, out=out)
    kept = pd.read_parquet(out)  # what came back before the pool broke: kept, each once
    assert kept["max_batch_size"].is_unique and len(kept) < len(GRID["max_batch_size"])
    again = sim.sweep(work, GRID, base=BASE, workers=2, out=out)
    assert again.attrs["computed"] == len(GRID["max_batch_size"]) - len(kept)
    pd.testing.assert_frame_equal(_complete(again, out), _reference(tmp_path))


@pytest.mark.slow
def test_a_dask_worker_killed_mid_sweep_is_retried_or_resumed(tmp_path):
    import dask
    from dask.distributed import Client, LocalCluster
    reference = _reference(tmp_path)
    # no retries on other workers: the killed worker's point is lost, and a resume runs it
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                         dashboard_address=None) as cluster, Client(cluster) as client:
        out = tmp_path / "a.parquet"
        work = _dying(tmp_path / "a", at=1)
        with pytest.raises(WorkerLost, match="KilledWorker"):
            sim.sweep(work, GRID, base=BASE, client=client, out=out)
        lost = len(GRID["max_batch_size"]) - len(pd.read_parquet(out))
        assert lost >= 1 and pd.read_parquet(out)["max_batch_size"].is_unique
        client.wait_for_workers(2, timeout=60)  # (the nanny restarts the killed worker)
        again = sim.sweep(work, GRID, base=BASE, client=client, out=out)
        assert again.attrs["computed"] == lost
        pd.testing.assert_frame_equal(_complete(again, out), reference)
    # Dask's default: the scheduler reruns the killed worker's point on another, in one call
    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        out = tmp_path / "b.parquet"
        table = sim.sweep(_dying(tmp_path / "b", at=1), GRID, base=BASE, client=client, out=out)
        assert table.attrs["computed"] == len(GRID["max_batch_size"])
        pd.testing.assert_frame_equal(_complete(table, out), reference)


def _full_disk(after_bytes=10):
    """A writer that writes a few bytes, then fails as a full disk does."""
    def write(path, *args, **kwargs):
        with open(path, "wb") as fh:
            fh.write(b"x" * after_bytes)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return write


def _files(folder):
    return {p.name: p.read_bytes() for p in Path(folder).iterdir()}


def test_a_full_disk_during_sim_run_is_one_line_and_keeps_the_previous_outputs(
        tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    argv = ["run", "-w", "sharegpt", "-n", "50", "--rate", "4", "-o", str(out), "-q"]
    assert main(argv) == 0
    before = _files(out)
    import sim.cli.output as output
    real = output.write_parquet
    calls = []

    def write_parquet(df, path):  # the first file written, then the disk is full
        calls.append(path)
        if len(calls) == 2:
            _full_disk()(path)
        real(df, path)

    monkeypatch.setattr(output, "write_parquet", write_parquet)
    capsys.readouterr()
    assert main(argv[:-1] + ["--rate", "5", "-q"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith("sim run: error: No space left on device: ") and "disk is full" in err
    assert _files(out) == before  # every file as it was; no temporary folder left


def test_a_full_disk_during_sim_sweep_keeps_the_rows_and_files_written(
        tmp_path, capsys, monkeypatch):
    cfg = tmp_path / "s.toml"
    cfg.write_text('workload = "sharegpt"\nnum_requests = 40\nscheduler = "chunked"\n'
                   'cost = "constant:0.01"\n[grid]\nrate = [2.0, 4.0]\n')
    out = tmp_path / "sw"
    argv = ["sweep", str(cfg), "-o", str(out), "--no-progress", "--workers", "1"]
    assert main(argv) == 0
    before = _files(out)
    full = _full_disk()
    monkeypatch.setattr(pd.DataFrame, "to_csv", lambda self, path, *a, **k: full(path))
    capsys.readouterr()
    cfg.write_text(cfg.read_text().replace("[2.0, 4.0]", "[2.0, 4.0, 6.0]"))
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("sim sweep: error: No space left on device: ") and "\n" not in err
    now = _files(out)
    assert now["sweep.csv"] == before["sweep.csv"]  # the old table, whole
    assert sorted(pd.read_parquet(out / "sweep.parquet")["rate"]) == [2.0, 4.0, 6.0]
    assert sorted(now) == sorted(before)  # nothing half-written beside them


def test_atomic_path_leaves_the_previous_file_or_the_whole_new_one(tmp_path):
    from sim.results.atomic import atomic_path
    target = tmp_path / "f.png"
    target.write_bytes(b"old")
    with pytest.raises(OSError, match="No space"):
        with atomic_path(target) as tmp:
            assert tmp.suffix == ".png" and tmp.parent == tmp_path
            _full_disk()(tmp)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f.png"]
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["f.png"]
