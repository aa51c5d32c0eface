"""Every code block of README.md and docs/**/*.md runs, so no page can rot (docs/contributing.md).

Per page, in a fresh temporary working directory holding a copy of ``examples/``:

1. its ```` ```python ```` blocks run in order in one shared namespace;
2. each ```` ```toml ```` block whose first line is ``# file: NAME.toml`` is written there and
   checked to parse as a ``sim run`` (or, with a ``[grid]``, ``sim sweep``; with a
   ``[space]``, ``sim plan``) settings file;
3. each line of its ```` ```bash ```` blocks (``\\`` continuations joined, ``#`` comments cut,
   ``&&`` chains split) that starts with ``sim `` is run through ``sim.cli.main.main(argv)``
   and must exit 0; one ending in ``# parse-only`` (a GPU-only ``sim calibrate``) is only
   parsed, its flags checked. Other commands are not run but checked: ``pip install`` installs
   this project with extras it has, ``python``/``pytest`` name files that exist, and a command
   outside :data:`NOT_RUN` is an error (there is no other skip mechanism).

``text``, ``console`` and other blocks are shown output and not run.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
import textwrap
import time
import traceback
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[ \t]*(?P<info>[^\n`]*?)[ \t]*\n"
                   r"(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$", re.M | re.S)
# commands a bash block may show without running them (each checked by _check_not_run)
NOT_RUN = {"pip", "pytest", "python", "python3", "git", "cd", "mkdocs", "duplicates", "export",
           "source", ".", "ls", "cat", "head", "jupyter", "nvidia-smi"}
PAGE_BUDGET_S = 30  # a page slower than this is an error: keep examples to a few thousand requests


class DocBlockError(AssertionError):
    """A code block of a page failed: names the page and the block's line."""


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # the line of the page the code starts on (1-based)


def blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, indented ones (in lists, admonitions)
    dedented; the language is the info string's first word, lower case."""
    out = []
    for m in FENCE.finditer(text):
        info = m.group("info").strip()
        lang = info.split()[0].lstrip("{.").rstrip("}").lower() if info else ""
        line = text.count("\n", 0, m.start()) + 2
        out.append(Block(lang, textwrap.dedent(m.group("body")), line))
    return out


@dataclass(frozen=True)
class Command:
    argv: list[str]
    line: int
    parse_only: bool = False


def commands(block: Block) -> list[Command]:
    """A bash block's commands: continuation lines joined, ``#`` comments cut (shell quoting
    respected), ``cmd1 && cmd2`` split; ``# parse-only`` at a line's end marks it."""
    out = []
    lines = block.code.split("\n")
    i = 0
    while i < len(lines):
        start, line = i, lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i]
        i += 1
        parse_only = bool(re.search(r"#\s*parse-only\s*$", line))
        for part in re.split(r"\s&&\s", line):
            argv = shlex.split(part, comments=True)
            if argv and argv[0] == "$":  # a prompt
                argv = argv[1:]
            if argv:
                out.append(Command(argv, block.line + start, parse_only))
    return out


def _fail(page, line, what, detail=""):
    raise DocBlockError(f"{page}:{line}: {what}" + (f"\n{detail}" if detail else ""))


def check_toml_file(path: Path) -> None:
    """``path`` parses as ``sim run``'s settings (a sweep file's with its ``[grid]`` keys, a
    plan file's with its ``[space]``):
    unknown keys, bad tables and bad values are errors naming the file and key."""
    from sim.cli.main import build_parser
    from sim.cli.settings import Names, settings_from
    loaded = tomllib.loads(path.read_text())
    command = "sweep" if "grid" in loaded else "plan" if "space" in loaded else "run"
    args = build_parser().parse_args([command, str(path.name)])
    settings_from(args, Names(path.name), command=command)


def _check_not_run(page, cmd: Command) -> None:
    argv = cmd.argv
    while argv and re.fullmatch(r"\w+=\S*", argv[0]):  # VAR=value before a command
        argv = argv[1:]
    if not argv:
        return
    if argv[0] not in NOT_RUN:
        _fail(page, cmd.line, f"{argv[0]!r} is neither a sim command nor one the docs show "
                              f"without running ({sorted(NOT_RUN)})")
    if argv[0] == "pip":
        _check_pip(page, cmd.line, argv)
    elif argv[0] in ("python", "python3", "pytest"):
        for arg in argv[1:]:
            if re.fullmatch(r"[\w./-]+\.(py|ipynb|toml)(::\w+)?", arg) and not arg.startswith("-"):
                if not (ROOT / arg.split("::")[0]).is_file():
                    _fail(page, cmd.line, f"{arg} does not exist in the repository")


def _check_pip(page, line, argv) -> None:
    """``pip install`` shows this project (``-e .``, ``-e '.[test]'``, ``.[gpu]``) with extras
    that pyproject.toml defines."""
    if argv[1:2] != ["install"]:
        return
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    targets = [a for a in argv[2:] if not a.startswith("-")]
    for target in targets:
        m = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", target)
        if not m:
            _fail(page, line, f"pip install {target}: the docs install this project only")
        for extra in filter(None, (m.group(1) or "").split(",")):
            if extra not in project.get("optional-dependencies", {}):
                _fail(page, line, f"pip install {target}: pyproject.toml has no extra {extra!r}")


def _run_sim(page, cmd: Command) -> None:
    from sim.cli.main import build_parser, main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if cmd.parse_only:
                build_parser().parse_args(cmd.argv[1:])
                rc = 0
            else:
                rc = main(cmd.argv[1:])
        except SystemExit as e:  # argparse: --help exits 0, a bad flag 2
            rc = e.code
    if rc not in (0, None):
        _fail(page, cmd.line, f"{shlex.join(cmd.argv)} exited {rc}", err.getvalue()[-2000:])


def run_page(page: Path, workdir: Path) -> None:
    """Run ``page``'s blocks in ``workdir`` (the current directory meanwhile), as the module
    docstring says; :class:`DocBlockError` names the page and line of the first that fails."""
    import os
    all_blocks = blocks(page.read_text())
    examples = ROOT / "examples"
    if examples.is_dir() and not (workdir / "examples").exists():
        shutil.copytree(examples, workdir / "examples")
    old = Path.cwd()
    os.chdir(workdir)
    try:
        namespace = {"__name__": "__docs__"}
        for b in all_blocks:
            if b.lang in ("python", "py"):
                code = compile("\n" * (b.line - 1) + b.code, str(page), "exec")
                try:
                    exec(code, namespace)
                except Exception as e:
                    _fail(page, b.line, f"python block raised {type(e).__name__}: {e}",
                          traceback.format_exc(limit=-4))
        for b in all_blocks:
            first = b.code.split("\n", 1)[0]
            m = re.fullmatch(r"#\s*file:\s*(\S+\.toml)\s*", first)
            if b.lang == "toml" and m:
                path = workdir / m.group(1)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(b.code)
                try:
                    check_toml_file(path)
                except (ValueError, TypeError, tomllib.TOMLDecodeError) as e:
                    _fail(page, b.line, f"{m.group(1)} is not a valid settings file: {e}")
        for b in all_blocks:
            if b.lang in ("bash", "sh", "shell"):
                for cmd in commands(b):
                    if cmd.argv[0] == "sim":
                        _run_sim(page, cmd)
                    else:
                        _check_not_run(page, cmd)
    finally:
        os.chdir(old)
        import matplotlib.pyplot as plt
        plt.close("all")


# ---- the pages ----------------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_blocks_run(page, tmp_path):
    start = time.perf_counter()
    run_page(page, tmp_path)
    took = time.perf_counter() - start
    assert took < PAGE_BUDGET_S, f"{page.name}: its blocks took {took:.1f} s"


def test_the_two_commands_are_the_readmes_and_ci_runs_them():
    readme = (ROOT / "README.md").read_text()
    assert "pip install -e . && sim run" in readme
    assert "pip install -e '.[test]' && pytest" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -e '.[test]' && pytest" in ci
    assert "mkdocs build --strict" in ci


# ---- the runner itself: a broken block fails ---------------------------------------------

def _page(tmp_path, text, name="page.md"):
    page = tmp_path / name
    page.write_text(textwrap.dedent(text))
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return page, work


def test_python_blocks_share_a_namespace_in_a_temporary_directory(tmp_path):
    page, work = _page(tmp_path, """\
        # A page
        ```python
        from pathlib import Path
        x = 41
        Path("made.txt").write_text("here")
        ```
        Text between.
        ```python
        assert x + 1 == 42
        ```
        """)
    run_page(page, work)
    assert (work / "made.txt").read_text() == "here"


def test_a_broken_python_block_fails_naming_its_line(tmp_path):
    page, work = _page(tmp_path, """\
        # A page

        ```python
        import sim
        sim.no_such_name
        ```
        """)
    with pytest.raises(DocBlockError, match=r"page\.md:4: python block raised AttributeError"):
        run_page(page, work)


def test_an_indented_block_runs_too(tmp_path):
    page, work = _page(tmp_path, """\
        - a list item:

            ```python
            raise RuntimeError("inside a list")
            ```
        """)
    with pytest.raises(DocBlockError, match="inside a list"):
        run_page(page, work)


def test_sim_lines_run_after_the_python_blocks(tmp_path):
    page, work = _page(tmp_path, """\
        ```bash
        sim workload describe w.csv   # a comment
        ```
        ```python
        import workloads
        workloads.load("sharegpt", n=20, rate=5.0).to_csv("w.csv", index=False)
        ```
        """)
    run_page(page, work)


def test_a_sim_line_with_a_flag_that_does_not_exist_fails(tmp_path):
    page, work = _page(tmp_path, """\
        ```bash
        sim memory llama-3.1-8b --gpu h100
        sim memory llama-3.1-8b \\
            --no-such-flag 3
        ```
        """)
    with pytest.raises(DocBlockError, match=r"page\.md:3: sim memory .*--no-such-flag 3 exited 2"):
        run_page(page, work)


def test_a_sim_line_that_errors_fails(tmp_path):
    page, work = _page(tmp_path, """\
        ```bash
        pip install -e . && sim run -w missing.csv
        ```
        """)
    with pytest.raises(DocBlockError, match="missing.csv"):
        run_page(page, work)


def test_parse_only_lines_are_parsed_not_run(tmp_path):
    page, work = _page(tmp_path, """\
        ```bash
        sim calibrate --budget 120 -o my_gpu.json   # parse-only
        ```
        """)
    run_page(page, work)
    assert not (work / "my_gpu.json").exists()
    page, work = _page(tmp_path, """\
        ```bash
        sim calibrate --no-such-flag   # parse-only
        ```
        """)
    with pytest.raises(DocBlockError, match="exited 2"):
        run_page(page, work)


def test_a_toml_file_block_is_written_checked_and_used(tmp_path):
    page, work = _page(tmp_path, """\
        ```toml
        # file: small.toml
        workload = "sharegpt"
        num_requests = 50
        rate = 5.0
        output = "small-out"
        ```
        ```bash
        sim run small.toml --quiet
        ```
        """)
    run_page(page, work)
    assert (work / "small-out" / "summary.json").is_file()
    page, work = _page(tmp_path, """\
        ```toml
        # file: bad.toml
        num_requestz = 50
        ```
        """, name="bad.md")
    with pytest.raises(DocBlockError, match=r"bad\.md:2: bad\.toml is not a valid settings file"):
        run_page(page, work)


def test_commands_shown_but_not_run_are_checked(tmp_path):
    for line, error in [("rm -rf sim-out", "neither a sim command"),
                        ("pip install llm-serving-sim", "this project only"),
                        ("pip install -e '.[nosuchextra]'", "no extra 'nosuchextra'"),
                        ("python experiments/no_such_script.py", "does not exist"),
                        ("pytest tests/test_no_such_file.py", "does not exist")]:
        page, work = _page(tmp_path, f"```bash\n{line}\n```\n")
        with pytest.raises(DocBlockError, match=re.escape(error)):
            run_page(page, work)
    page, work = _page(tmp_path, "```bash\npip install -e '.[test]' && pytest -q\n"
                                 "SIM_THOROUGH=1 pytest -m slow tests/test_invariants.py\n```\n")
    run_page(page, work)


def test_commands_splits_continuations_chains_and_comments():
    block = Block("bash", 'sim run -w "a b.csv" \\\n  --rate 2  # why\n'
                          'pip install -e . && sim run\nsim validate # parse-only\n', 10)
    assert commands(block) == [Command(["sim", "run", "-w", "a b.csv", "--rate", "2"], 10),
                               Command(["pip", "install", "-e", "."], 12),
                               Command(["sim", "run"], 12),
                               Command(["sim", "validate"], 13, parse_only=True)]
