"""The documentation site's generated pages say what the code does: every sub-command and flag
in the CLI reference, every TOML key the settings reader accepts in the TOML reference, every
module once in the module map and the API pages, the validation tables from the data files;
and the site builds with ``mkdocs build --strict``."""

import argparse
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    """A module of docs/ by path, under its own name (hooks.py imports its siblings so)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


ref = _load("gen_reference")
val = _load("gen_validation")


def _subparsers(parser):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return a.choices
    return {}


def test_cli_reference_has_every_subcommand_and_flag():
    from sim.cli.main import build_parser
    text = ref.cli_reference()
    subs = _subparsers(build_parser())
    assert len(subs) >= 7
    for name, sub in subs.items():
        section = text.split(f"## `sim {name}`", 1)[1].split("\n## ", 1)[0]
        for action in sub._actions:
            for flag in action.option_strings:
                if action.help != argparse.SUPPRESS and flag not in ("-h", "--help"):
                    assert f"`{flag}`" in section, (name, flag)


def test_cli_reference_shows_help_defaults_and_choices():
    text = ref.cli_reference()
    run = text.split("## `sim run`", 1)[1].split("\n## ", 1)[0]
    assert "usage: sim run" in run
    row = next(line for line in run.splitlines() if line.startswith("| `--kv-dtype`"))
    assert "`fp8`" in row and "fp8 doubles the KV blocks" in row
    capacity = text.split("## `sim capacity`", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"\| `--attainment` \|.*\| `0\.9` \|", capacity)  # an argparse default


def _known_keys(tmp_path, command):
    """The top-level keys the settings reader accepts for ``command``, as its error for an
    unknown key lists them."""
    from sim.cli.settings import read_toml
    f = tmp_path / "probe.toml"
    f.write_text("no_such_key_at_all = 1\n")
    with pytest.raises(ValueError, match="unknown") as e:
        read_toml(str(f), command)
    return set(re.findall(r"'(\w+)'", str(e.value).split("known:", 1)[1]))


def test_toml_reference_lists_every_key_the_reader_accepts(tmp_path):
    rows = ref.toml_rows()
    listed = {key.split(".")[0] for key, *_ in rows}
    run_keys = _known_keys(tmp_path, "run")
    other_keys = (_known_keys(tmp_path, "sweep") | _known_keys(tmp_path, "capacity")
                  | _known_keys(tmp_path, "plan"))
    assert run_keys | other_keys <= listed
    assert listed <= run_keys | other_keys  # nothing listed that the reader refuses
    text = ref.toml_reference()
    for key, flag, _, help_text in rows:
        assert f"| `{key}` |" in text
        assert help_text, key  # every key says what it sets
    assert "| `slo.ttft` | `--slo-ttft` |" in text
    assert "| `speculative.num_speculative_tokens` | `--spec-tokens` |" in text
    assert "| `tensor_parallel` | `--tp` | integer | 1 | SimConfig.tensor_parallel |" in text


def test_module_map_and_api_pages_cover_every_module_once():
    files = [p for pkg in ("sim", "workloads") for p in (ROOT / pkg).rglob("*.py")
             if "data" not in p.parts]
    mods = ref.modules()
    assert len(mods) == len(files)
    assert all(first for _, _, first in mods), [n for n, _, f in mods if not f]
    directives = [line for page in ref.api_pages().values() for line in page.splitlines()
                  if line.startswith(":::")]
    assert sorted(directives) == sorted(f"::: {name}" for name, _, _ in mods)
    lines = ref.module_map().splitlines()
    for name, _, first in mods:
        assert sum(line.startswith(f"- [`{name}`]") for line in lines) == 1, name
    assert "(reference/api/sim.engine.md#sim.engine)" in ref.module_map()


def test_module_map_follows_a_module_that_moves(tmp_path):
    pkg = tmp_path / "sim" / "engine" / "kv"
    pkg.mkdir(parents=True)
    (tmp_path / "sim" / "__init__.py").write_text('"""Top."""\n')
    (tmp_path / "sim" / "engine" / "__init__.py").write_text('"""The engine. More."""\n')
    (pkg / "__init__.py").write_text('"""KV pools."""\n')
    (pkg / "blocks.py").write_text('"""The KV pool: blocks with a ref count. Details."""\n')
    mods = ref.modules(("sim",), tmp_path)
    assert [(n, f) for n, _, f in mods] == [
        ("sim", "Top."), ("sim.engine", "The engine."), ("sim.engine.kv", "KV pools."),
        ("sim.engine.kv.blocks", "The KV pool: blocks with a ref count.")]


def test_layer_table_is_the_layout_tests():
    text = ref.layer_table()
    assert "| 3 | `sim.engine` |" in text and "| 5 | `sim.serve` |" in text and "| 6 | `sim.cli` |" in text


def test_validation_tables_come_from_the_data_files():
    summary = json.loads((ROOT / "sim/data/serving_check.json").read_text())["summary"]
    text = val.serving()
    assert len(text.strip().splitlines()) == 2 + len(summary)
    for s in summary:
        assert f"| {s['rows']} | {100 * s['median_abs_error']:.1f} % |" in text
    fit = json.loads((ROOT / "sim/data/roofline_fit.json").read_text())
    assert len(val.per_layer().strip().splitlines()) == 2 + len(fit["report"])
    assert f"| {fit['params']['h100']['gemm_compute_eff']:.4g} |" in val.parameters()
    for make in val.TABLES.values():
        assert make().count("\n|") >= 2


def test_grouped_takes_median_of_magnitudes_and_signed_worst():
    rows = [{"g": "a", "error_pct": 10.0}, {"g": "a", "error_pct": -30.0},
            {"g": "a", "error_pct": 20.0}, {"g": "b", "error_pct": 1.0}]
    assert val.grouped(rows, ("g",)) == [(("a",), 3, pytest.approx(0.2), pytest.approx(-0.3)),
                                         (("b",), 1, pytest.approx(0.01), pytest.approx(0.01))]


def test_a_page_marker_is_replaced_and_an_unknown_one_fails():
    hooks = _load("hooks")
    from mkdocs.exceptions import PluginError
    out = hooks.expand("# T\n\n<!-- gen: validation.per-head-decode -->\n\nafter\n", "p.md")
    assert "attn_decode_reread_fraction" in out and "<!--" not in out and out.endswith("after\n")
    with pytest.raises(PluginError, match="p.md: unknown generated block 'validation.typo'"):
        hooks.expand("<!-- gen: validation.typo -->\n", "p.md")


def test_committed_generated_blocks_are_fresh(tmp_path):
    """Each page holds a copy of its generated blocks (readable on GitHub); a copy that no
    longer matches the code fails here, and ``python docs/hooks.py`` rewrites it. The copy is
    replaced, never added to: expanding a fresh page again changes nothing."""
    hooks = _load("hooks")
    stale = hooks.stale_pages()
    assert not stale, f"stale generated blocks in {stale}: run python docs/hooks.py"
    page = tmp_path / "p.md"
    page.write_text("# T\n\n<!-- gen: validation.per-head-decode -->\nold table\n"
                    "<!-- end gen -->\n\nafter\n")
    assert hooks.stale_pages(tmp_path) == [page]
    assert hooks.write_pages(tmp_path) == [page] and hooks.stale_pages(tmp_path) == []
    text = page.read_text()
    assert "old table" not in text and text.endswith("<!-- end gen -->\n\nafter\n")
    built = hooks.expand(text, "p.md")
    assert "<!--" not in built and built.count("attn_decode_reread_fraction") == \
        hooks.GENERATORS["validation.per-head-decode"]().count("attn_decode_reread_fraction")


def test_api_pages_go_under_the_api_entry_of_the_nav():
    hooks = _load("hooks")
    nav = [{"Home": "index.md"},
           {"Reference": [{"CLI": "reference/cli.md"}, {"API": "reference/api.md"}]}]
    out = hooks._with_api_pages(nav, ["reference/api/sim.md", "reference/api/sim.engine.md"])
    assert out[1]["Reference"][1] == {"API": ["reference/api.md",
                                              {"sim": "reference/api/sim.md"},
                                              {"sim.engine": "reference/api/sim.engine.md"}]}


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    listed = set(re.findall(r":\s*([\w/.-]+\.md)", nav))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages == listed


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "api" / "sim.engine" / "index.html").is_file()


def _pages():
    return [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _resolves(dotted) -> bool:
    """``sim.engine.core.replica`` or ``sim.engine.core.replica.Replica.admit``: the longest
    prefix that is a module or package on disk, then attributes of it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            break
    else:
        return False
    if cut == len(parts):
        return True
    obj = importlib.import_module(".".join(parts[:cut]))
    for name in parts[cut:]:
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True


# paths in other projects' repositories that the pages cite as sources
EXTERNAL = {"benchmarks/multi_turn/benchmark_serving_multi_turn.py"}  # vLLM's


def test_every_file_and_module_the_pages_name_exists():
    """A page that names ``engine/core/replica.py``, ``benchmarks/run.py`` or
    ``sim.engine.kv.radix`` names something that is there: a module that moves breaks this
    test, not a reader."""
    missing = []
    for page in _pages():
        text = page.read_text()
        for path in re.findall(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|toml|json|csv|ipynb|md))`", text):
            if path not in EXTERNAL and not any(
                    (base / path).exists() for base in (ROOT, ROOT / "sim", ROOT / "docs")):
                missing.append(f"{page.relative_to(ROOT)}: {path}")
        for dotted in re.findall(r"`((?:sim|workloads)(?:\.\w+)+)", text):
            if not _resolves(dotted):
                missing.append(f"{page.relative_to(ROOT)}: {dotted}")
    assert not missing, "\n".join(sorted(set(missing)))
