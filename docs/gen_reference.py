"""The reference pages, generated from the code at build time (never copied by hand).

- :func:`cli_reference`: every ``sim`` sub-command from ``sim.cli.main.build_parser()``: its
  help line, usage and a table of its flags (value, default, help text as ``--help`` shows it).
- :func:`toml_rows` / :func:`toml_reference`: every key a ``sim run`` / ``sim capacity`` /
  ``sim sweep`` TOML file takes, with its flag, value, default, target and help, from the
  CLI's one settings table (``sim.cli.settings.reference_rows()``).
- :func:`modules`, :func:`module_map`, :func:`api_pages`: the packages walked on disk (``sim``
  and its sub-packages, ``workloads``), so the module map and the API reference follow a module
  that moves; each module's first docstring line is read with ``ast``, nothing is imported.

Every function returns Markdown; ``docs/hooks.py`` puts it into the pages.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sim", "workloads")


# ---- the command line -------------------------------------------------------------------

def _cell(text) -> str:
    """A Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _help(parser, action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    return parser._get_formatter()._expand_help(action)


def _subcommands(parser):
    """(name, help, sub-parser) of each sub-command, in the order ``sim --help`` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _flag_row(parser, action) -> str:
    names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        value = " \\| ".join(f"`{c}`" for c in action.choices)
    elif action.nargs == 0:
        value = ""
    else:
        value = f"`{action.metavar or action.dest.upper()}`"
    default = action.default
    shown = "" if default in (None, False, argparse.SUPPRESS) else f"`{default}`"
    return f"| {names} | {value} | {shown} | {_cell(_help(parser, action))} |"


def cli_reference(parser=None) -> str:
    """Markdown for every sub-command of ``sim``: a section each, usage, then its flags; usage
    lines wrapped at 100 columns whatever the terminal (argparse reads ``COLUMNS``)."""
    import os
    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        return _cli_reference(parser)
    finally:
        if columns is None:
            os.environ.pop("COLUMNS")
        else:
            os.environ["COLUMNS"] = columns


def _cli_reference(parser=None) -> str:
    if parser is None:
        from sim.cli.main import build_parser
        parser = build_parser()
    out = []
    for name, help_text, sub in _subcommands(parser):
        out += [f"## `sim {name}`", "", _cell(help_text).replace("\\|", "|") + ".", "",
                "```text", sub.format_usage().strip(), "```", "",
                "| flag | value | default | what it does |", "|---|---|---|---|"]
        out += [_flag_row(sub, a) for a in sub._actions
                if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
        out.append("")
    return "\n".join(out)


# ---- the TOML keys ----------------------------------------------------------------------

def toml_rows():
    """Every TOML key, as ``(key, flag or "", default, help)`` rows, in the settings table's
    order: ``sim.cli.settings.reference_rows()`` (the one table the flags, the TOML reader and
    the ``SimConfig`` builder are made from), flag-only settings left out."""
    from sim.cli.settings import reference_rows
    return [(r["key"], r["flags"].split(", ")[0] if r["flags"] else "", r["default_help"],
             r["help"]) for r in reference_rows() if r["key"]]


def toml_reference() -> str:
    """The TOML keys' table: key, flag, value, default, where the value goes, commands."""
    from sim.cli.settings import reference_rows
    out = ["| key | flag | value | default | sets | read by | what it does |",
           "|---|---|---|---|---|---|---|"]
    for r in reference_rows():
        if not r["key"]:
            continue
        flag = r["flags"].split(", ")[0] if r["flags"] else ""
        default = r["default_help"].removeprefix("default: ").removeprefix("default ")
        out.append(f"| `{r['key']}` | {f'`{flag}`' if flag else ''} | {_cell(r['type'])} | "
                   f"{_cell(default)} | {_cell(r['target'])} | "
                   f"{', '.join(r['commands'])} | {_cell(r['help'])} |")
    return "\n".join(out) + "\n"


# ---- the packages -----------------------------------------------------------------------

def _first_line(doc) -> str:
    """A docstring's first sentence (of its first paragraph), as Markdown: ``:func:`x``` and
    ````x```` become ```x```."""
    para = " ".join((doc or "").strip().split("\n\n")[0].split())
    para = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", para).replace("``", "`")
    for stop in (". ", ".\n"):
        if stop in para + "\n":
            para = (para + "\n").split(stop, 1)[0] + "."
            break
    if len(para) > 150 and ": " in para:  # a long list after a colon: the line before it
        para = para.split(": ", 1)[0] + "."
    return para.strip()


def modules(packages=PACKAGES, root=ROOT):
    """``(dotted name, path, first docstring sentence)`` of every module and package under
    ``packages``, a package before its modules, sub-packages where they sit on disk."""
    out = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if any(p.startswith("_") for p in parts[1:]) or "data" in parts:
                continue
            doc = ast.get_docstring(ast.parse(path.read_text()))
            out.append((".".join(parts), path, _first_line(doc)))
    return sorted(out, key=lambda m: (_top_package(m[0], root), m[0].split(".")))


def _top_package(name, root=ROOT) -> str:
    """The API page a module goes on: ``sim`` for ``sim``'s own modules, else its first
    sub-package (``sim.engine.kv.blocks`` -> ``sim.engine``)."""
    parts = name.split(".")
    top = ".".join(parts[:2])
    return top if (root / Path(*parts[:2])).is_dir() else parts[0]


def api_pages():
    """``{page path: Markdown}``: one API page per package (``reference/api/sim.engine.md``),
    a ``::: module`` directive (mkdocstrings) per module, in the order of :func:`modules`."""
    pages = {}
    for name, _, _ in modules():
        page = f"reference/api/{_top_package(name)}.md"
        if page not in pages:
            pages[page] = [f"# `{_top_package(name)}`", ""]
        pages[page] += [f"::: {name}", ""]
    return {page: "\n".join(lines) for page, lines in pages.items()}


def module_map(link=True) -> str:
    """One line per module: its name (linked to its API page) and its docstring's first
    sentence, grouped under its package."""
    out, current = [], None
    for name, _, first in modules():
        top = _top_package(name)
        if top != current:
            out += ["", f"**`{top}`**", ""]
            current = top
        shown = f"[`{name}`](reference/api/{top}.md#{name})" if link else f"`{name}`"
        out.append(f"- {shown} - {first}")
    return "\n".join(out).strip() + "\n"


def layer_table(root=ROOT) -> str:
    """The packages in layer order, from ``tests/test_layout.py``'s ``LAYER`` (the table the
    layout test enforces), each with its docstring's first sentence."""
    tree = ast.parse((root / "tests" / "test_layout.py").read_text())
    layer = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "LAYER" for t in node.targets))
    first = {name: line for name, _, line in modules(("sim",), root)}
    out = ["| layer | package | what lives there |", "|---|---|---|"]
    for name, level in sorted(layer.items(), key=lambda kv: (kv[1], kv[0])):
        out.append(f"| {level} | `sim.{name}` | {_cell(first.get(f'sim.{name}', ''))} |")
    return "\n".join(out) + "\n"


def models_table() -> str:
    """The model presets' table (``sim models``' rows and sources)."""
    from sim.cli.catalog import models_markdown
    return models_markdown()


def gpus_table() -> str:
    """The GPU presets' table (``sim gpus``' rows and sources)."""
    from sim.cli.catalog import gpus_markdown
    return gpus_markdown()
