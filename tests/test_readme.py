"""The README stays true: its Python tour runs, and its commands exist."""

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_python_tour_runs():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})


def test_two_commands_are_there():
    assert "pip install -e . && sim run" in README
    assert "pip install -e '.[test]' && pytest" in README
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    assert "pip install -e '.[test]' && pytest" in ci


def test_cli_subcommands_in_readme_exist():
    from sim.cli import main
    for sub in set(re.findall(r"^sim (\w+)", README, flags=re.M)):
        try:
            main([sub, "--help"])
        except SystemExit as e:
            assert e.code == 0, sub
