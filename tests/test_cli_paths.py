"""Relative paths in a TOML file (``workload``, ``profile``, ``output``) are read from the working
directory, as a flag's are, not from the TOML file's folder (``sim.cli.arguments``); when such a
path exists only beside the TOML file, the error says so: the file and key, the path tried and
the path that exists. One line, exit status 2, nothing simulated."""

import json

import pytest

import sim.engine
from sim.cli.arguments import as_flag, not_beside_file
from test_cli_errors import sim_cli

CSV = "arrival_time,num_prompt_tokens,num_output_tokens\n0,5,3\n0.5,6,2\n"


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """``tmp_path`` as the working folder, with ``sub/`` holding a workload, a profile and TOML
    files that name them relative to ``sub/``."""
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "w.csv").write_text(CSV)
    (sub / "p.json").write_text(json.dumps({"model": {}}))
    (sub / "w.toml").write_text('workload = "w.csv"\ncost = "constant:0.01"\nplots = false\n'
                                'output = "out"\n')
    (sub / "p.toml").write_text('workload = "azure-code"\nnum_requests = 5\nprofile = "p.json"\n')
    (sub / "grid.toml").write_text('workload = "w.csv"\n[grid]\nmax_batch_size = [4]\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def no_simulation(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the bad path was found only after the work started")
    monkeypatch.setattr(sim.engine, "run", refuse)


@pytest.mark.parametrize("command, toml, key, name", [
    ("run", "w.toml", "workload", "w.csv"),
    ("run", "p.toml", "profile", "p.json"),
    ("capacity", "w.toml", "workload", "w.csv"),
    ("sweep", "grid.toml", "workload", "w.csv")])
def test_a_path_beside_the_toml_file_is_named_in_the_error(command, toml, key, name, tree,
                                                           capsys, no_simulation):
    rc, _, err = sim_cli([command, f"sub/{toml}"], capsys)
    assert rc == 2 and err.count("\n") == 1, err
    assert err.startswith(f"sim {command}: error: sub/{toml}: {key} '{name}' does not exist: a "
                          f"relative path in a TOML file is read from the working directory, "
                          f"not from the file's folder (tried {tree / name}); 'sub/{name}' "
                          f"exists: write {key} = \"sub/{name}\" (or an absolute path), or run "
                          f"from 'sub'"), err
    assert not (tree / "out").exists() and not (tree / "sub" / "out").exists()


def test_the_rule_is_unchanged_from_the_files_folder(tree, capsys, monkeypatch):
    """Run from ``sub/`` the same file works, and its relative ``output`` lands under the
    working folder; from an absolute TOML path the advice is the absolute path."""
    monkeypatch.chdir(tree / "sub")
    rc, out, err = sim_cli(["run", "w.toml", "-q"], capsys)
    assert rc == 0, err
    assert (tree / "sub" / "out" / "summary.json").exists()
    monkeypatch.chdir(tree)
    rc, _, err = sim_cli(["run", str(tree / "sub" / "w.toml")], capsys)
    assert rc == 2 and f"exists: write workload = \"{tree / 'sub' / 'w.csv'}\", or run " in err


def test_no_hint_where_none_applies(tree, capsys, no_simulation):
    """A flag's path (not from a TOML file), a path missing beside the file too, and a bundled
    trace's name keep their usual messages."""
    rc, _, err = sim_cli(["run", "-w", "w.csv"], capsys)
    assert rc == 2 and "error: --workload file 'w.csv' does not exist\n" in err
    (tree / "sub" / "gone.toml").write_text('workload = "gone.csv"\n')
    rc, _, err = sim_cli(["run", "sub/gone.toml"], capsys)
    assert rc == 2 and err.endswith("sub/gone.toml: workload file 'gone.csv' does not exist\n")


def test_a_bundled_trace_is_not_a_path(tree, capsys):
    """A file beside the TOML file named as a bundled trace does not shadow the trace."""
    (tree / "sub" / "azure-code").write_text("a file named as a bundled trace")
    (tree / "sub" / "trace.toml").write_text('workload = "azure-code"\nnum_requests = 3\n'
                                             'cost = "constant:0.01"\noutput = "o"\n')
    rc, _, err = sim_cli(["run", "sub/trace.toml", "-q"], capsys)
    assert rc == 0, err
    assert (tree / "o" / "summary.json").exists()
    with pytest.raises(ValueError, match="'sub/azure-code' exists"):  # the check alone would
        not_beside_file("azure-code", "workload", "sub/trace.toml")


def test_not_beside_file_and_as_flag():
    assert not_beside_file("/abs/w.csv", "workload", "sub/x.toml") is None
    assert not_beside_file("w.csv", "workload", None) is None
    assert str(as_flag(ValueError("model 'x' is not a preset"), "--model", "model")) == \
        "--model 'x' is not a preset"
    assert str(as_flag(ValueError("no such thing"), "--gpu", "gpu")) == "--gpu: no such thing"


def test_empty_names_are_errors_not_the_default_or_the_working_directory(tmp_path, capsys):
    """(issue 32, item 9) --model '' ran the default model and -o '' wrote into the working
    directory: each is a one-line error naming the flag."""
    from sim.cli import main
    for argv, message in ((["--model", ""], "--model must be a preset name, got ''"),
                          (["--gpu", " "], "--gpu must be a preset name, got ' '"),
                          (["-o", ""], "--output must be a folder name, got ''")):
        argv = ["run", "-n", "5"] + (["-o", str(tmp_path / "o")] if "-o" not in argv else []) \
            + argv
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    with pytest.raises(ValueError, match="model must be a preset name"):
        sim.SimConfig(model="")


def test_a_killed_runs_temporary_folder_goes_with_the_next_run(tmp_path):
    """(issue 32, item 9) A run killed while writing (kill -9: no finally) left its hidden
    .sim-run-* folder (41 MB at 1M requests) forever. The next run into the folder removes
    those of a process no longer running and old ones naming none; a live writer's stays."""
    import os
    import subprocess
    import sys
    import time

    from sim.cli import main
    out = tmp_path / "out"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    dead, old, live = (out / f".sim-run-{gone}-x1", out / ".sim-run-ab12cd", out /
                       f".sim-run-{os.getpid()}-x2")
    for folder in (dead, old, live):
        folder.mkdir(parents=True)
        (folder / "requests.parquet").write_bytes(b"0" * 1000)
    os.utime(old, (time.time() - 7200,) * 2)
    assert main(["run", "-n", "5", "-q", "-o", str(out)]) == 0
    assert not dead.exists() and not old.exists() and live.exists()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".sim-run-")) == [live.name]


def test_ctrl_c_prints_one_line():
    """(issue 32, item 9) Ctrl-C during sim run printed a traceback: one line now, status
    130. SIGINT goes to a subprocess running a long run (a million requests)."""
    import signal
    import subprocess
    import sys
    import tempfile
    import time
    code = ("import sys; from sim.cli.main import main; print('ready', flush=True); "
            "sys.exit(main(sys.argv[1:]))")
    with tempfile.TemporaryDirectory() as folder:
        p = subprocess.Popen([sys.executable, "-c", code, "run", "-w", "sharegpt", "--rate",
                              "50", "-n", "1000000", "-q", "-o", folder],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(3.0)  # parsed and loading or simulating, inside main
        assert p.poll() is None
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    assert (p.returncode, err) == (130, "sim run: interrupted\n")
