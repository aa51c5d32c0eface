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
