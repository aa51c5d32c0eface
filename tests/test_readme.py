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


def _cli_block():
    """The command-line section's ``sim ...`` lines, continuation lines joined, comments cut."""
    block = README.split("## The command line", 1)[1].split("```bash\n", 1)[1].split("```")[0]
    lines = block.replace("\\\n", " ").splitlines()
    return [line.split("#")[0].split() for line in lines if line.startswith("sim ")]


def test_cli_section_commands_parse_and_name_files_that_exist():
    """Every command of the section parses with today's flags, and every TOML file it names is
    in the repository (a fresh clone's newcomer runs them from its root)."""
    from sim.cli.main import build_parser
    root = Path(__file__).resolve().parents[1]
    commands = _cli_block()
    assert len(commands) > 20
    for argv in commands:
        build_parser().parse_args(argv[1:])  # SystemExit(2) on a flag that no longer exists
        for arg in argv[1:]:
            if arg.endswith(".toml"):
                assert (root / arg).is_file(), " ".join(argv)


def test_every_toml_key_is_listed():
    from sim.cli.settings import DEFAULTS
    listed = README.split("A TOML file takes the flags' names:", 1)[1].split(
        "`examples/experiment.toml` is one", 1)[0]
    missing = [k for k in [*DEFAULTS, "report", "request_path"] 
               if f"`{k}`" not in listed and f"`[{k}]`" not in listed]
    assert not missing
