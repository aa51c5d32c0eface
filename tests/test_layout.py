"""The package map holds: one-way imports between packages and between the engine's
sub-packages, no cycles, heavy or optional libraries only where they belong, a docstring at the
top of every package and module, and no module over 400 lines."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIM = ROOT / "sim"

# layer order: a package may import its own modules and those of lower layers; packages of the
# same layer are independent of each other
# (native and cython_shim: the compiled core's finder and no-op shim, sim/native.py)
LAYER = {"native": 0, "cython_shim": 0,
         "checks": 0, "constants": 0, "numerics": 0, "specs": 1, "cheatsheet": 2, "costs": 2, "results": 2,
         "engine": 3, "tools": 4, "serve": 5,
         "cli": 6}
# third-party imports allowed only in these modules (anywhere in them: lazy imports count)
ONLY_IN = {
    "matplotlib": {"sim.results.plots.figure"},
    "dask": {"sim.tools.sweep_backends"},
    "cupy": {"sim.costs.kernels"},
}
ONLY_IN_PACKAGE = {"argparse": "sim.cli"}  # the command line parses argv; nothing else does
# sim.engine's own layers (its __init__ docstring says why): a unit - a sub-package or a
# top-level module of sim.engine - may import its own modules and units of lower rank; units of
# one rank are independent of each other. The package's __init__ (the lazy public names) is
# above them all.
ENGINE_LAYER = {"kv": 0, "pool_budget": 0, "core": 1, "speculation": 2, "presets": 2,
                "bands": 2, "engine_overheads": 2, "schedulers": 3, "fleet": 4, "config": 5, "simulation": 6}
MAX_LINES = 400  # a module past it holds more than one concept: split it
# exempt from MAX_LINES by nature: data tables and generated files (none today; each one named
# here with the reason)
LONG_BY_NATURE = frozenset()


def _modules(root, package):
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


MODULES = dict(_modules(SIM, "sim"))
KNOWN = set(MODULES)


def _imports(name, path):
    """Absolute names of every module ``name`` imports, at module level or inside functions."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                prefix = base[:len(base) - node.level + 1]
                mod = ".".join(prefix + ([node.module] if node.module else []))
            else:
                mod = node.module
            for a in node.names:  # "from .pkg import module" imports the module
                sub = f"{mod}.{a.name}"
                out.add(sub if sub in KNOWN else mod)
    return out




def _sim_deps(name):
    deps = set()
    for imp in _imports(name, MODULES[name]):
        while imp and imp not in KNOWN:  # "sim.engine.core.replica.Replica" -> the module
            imp = imp.rpartition(".")[0]
        if imp and imp.startswith("sim") and imp != name:
            deps.add(imp)
    return deps


def _package(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n != "sim"))
def test_imports_flow_one_way(name):
    pkg = _package(name)
    for dep in _sim_deps(name):
        dpkg = _package(dep)
        assert dpkg is not None, f"{name} imports the top-level sim package (import its module)"
        if dpkg == pkg:
            continue
        assert LAYER[dpkg] < LAYER[pkg], (
            f"{name} (layer {LAYER[pkg]}) imports {dep} (layer {LAYER[dpkg]}): back-import or "
            f"sideways import between packages of one layer")


def _assert_acyclic(graph, what):
    """Raise naming the first cycle of ``graph`` (node -> the nodes it imports)."""
    state = {}

    def visit(n, path):
        state[n] = "open"
        for d in sorted(graph.get(n, ())):
            if state.get(d) == "open":
                raise AssertionError(f"{what}: " + " -> ".join(path + [d]))
            if d not in state:
                visit(d, path + [d])
        state[n] = "done"

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])


def test_no_import_cycles_between_modules():
    names = set(MODULES) - {"sim"}  # (the top-level package imports nothing at import time)
    _assert_acyclic({n: _sim_deps(n) & names for n in names}, "import cycle")


def _users(lib):
    return {n for n in MODULES
            if any(i == lib or i.startswith(lib + ".") for i in _imports(n, MODULES[n]))}


@pytest.mark.parametrize("lib", sorted(ONLY_IN))
def test_optional_and_presentation_libraries_stay_in_their_module(lib):
    users = _users(lib)
    assert users <= ONLY_IN[lib], f"{lib} imported by {sorted(users - ONLY_IN[lib])}"


@pytest.mark.parametrize("lib", sorted(ONLY_IN_PACKAGE))
def test_argv_parsing_stays_in_the_cli(lib):
    outside = {n for n in _users(lib) if not n.startswith(ONLY_IN_PACKAGE[lib] + ".")}
    assert not outside, f"{lib} imported by {sorted(outside)}"


def test_library_never_prints():
    for name, path in MODULES.items():
        if _package(name) == "cli":
            continue
        calls = [node for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print"]
        assert not calls, f"{name} calls print() (only sim.cli prints)"


def test_workloads_never_import_sim():
    for path in (ROOT / "workloads").rglob("*.py"):
        for imp in _imports("workloads." + path.stem, path):
            assert not (imp == "sim" or imp.startswith("sim.")), f"{path} imports {imp}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_opens_with_a_docstring(name):
    doc = ast.get_docstring(ast.parse(MODULES[name].read_text()))
    assert doc and len(doc) > 40, f"{name} needs a docstring saying its concept"


def test_every_package_says_what_it_may_import():
    for init in SIM.glob("**/__init__.py"):
        if init.parent == SIM:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert "May import" in doc, f"{init.parent.name} must say what it may import"


def _engine_unit(module):
    """The unit of ``sim.engine`` that holds ``module`` (a sub-package or a top-level module),
    None for the package itself and for modules outside it."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["sim", "engine"] and len(parts) > 2 else None


def _engine_edges():
    """``(module, unit, dep, dep's unit)`` for every import between two units of sim.engine."""
    for name in sorted(MODULES):
        unit = _engine_unit(name)
        if unit is None:
            continue
        for dep in _sim_deps(name):
            assert dep != "sim.engine", f"{name} imports sim.engine's __init__ (import the module)"
            dunit = _engine_unit(dep)
            if dunit is not None and dunit != unit:
                yield name, unit, dep, dunit


def test_every_engine_unit_has_its_layer():
    units = {_engine_unit(n) for n in MODULES} - {None}
    assert units == set(ENGINE_LAYER), (
        f"place {sorted(units - set(ENGINE_LAYER))} in ENGINE_LAYER (and the engine's "
        f"docstring); gone: {sorted(set(ENGINE_LAYER) - units)}")


def test_engine_sub_packages_import_one_way():
    for name, unit, dep, dunit in _engine_edges():
        assert ENGINE_LAYER[dunit] < ENGINE_LAYER[unit], (
            f"{name} ({unit}, rank {ENGINE_LAYER[unit]}) imports {dep} ({dunit}, rank "
            f"{ENGINE_LAYER[dunit]}): back-import or sideways import inside sim.engine")


def test_no_import_cycles_between_engine_sub_packages():
    graph = {}
    for _name, unit, _dep, dunit in _engine_edges():
        graph.setdefault(unit, set()).add(dunit)
    _assert_acyclic(graph, "cycle between engine units")


def test_engine_sub_packages_name_what_they_import():
    """A sub-package's "May import" sentence names every engine unit it imports."""
    used = {}
    for _name, unit, _dep, dunit in _engine_edges():
        used.setdefault(unit, set()).add(dunit)
    for unit, deps in used.items():
        init = SIM / "engine" / unit / "__init__.py"
        if not init.exists():  # a top-level module: the engine's docstring places it
            continue
        may = ast.get_docstring(ast.parse(init.read_text())).split("May import")[1]
        missing = sorted(d for d in deps if f"sim.engine.{d}" not in may)
        assert not missing, f"sim.engine.{unit} imports {missing}: say so under May import"


def _lines(name):
    return len(MODULES[name].read_text().splitlines())


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n not in LONG_BY_NATURE))
def test_no_module_over_400_lines(name):
    assert _lines(name) <= MAX_LINES, (
        f"{name} has {_lines(name)} lines (> {MAX_LINES}): split it by concept")


def test_public_names_stay_importable_from_sim():
    import sim
    for name in sim.__all__:
        assert getattr(sim, name) is not None
    # the cheat sheet's vocabulary, as the README and the project's origin name it
    for name in ("kv_cache_bytes", "tiled_softmax_dot", "PrefixCache", "speculative_decode",
                 "DraftModel", "memory_budget", "KVCache", "CHUNK_SIZE", "KV_BLOCK_SIZE",
                 "KV_BLOCKS_AVAILABLE"):
        assert name in sim.__all__
    assert (sim.CHUNK_SIZE, sim.KV_BLOCK_SIZE, sim.KV_BLOCKS_AVAILABLE) == (512, 16, 1800)


def test_sim_run_loads_only_what_it_uses(tmp_path):
    """Start-up is part of every ``sim run``: ``import sim`` loads no library (its names are
    imported on first use), the parser (``sim --help``) neither pandas nor SimPy, and a run
    without plots neither matplotlib nor the sweep, capacity, kernel or cheat-sheet modules
    (``sim.native``, the compiled core's finder, is installed by ``import sim``)."""
    import subprocess
    import sys
    code = ("import sys\nimport sim\n"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('pandas', 'numpy', "
            "'simpy') or m.startswith('sim.') and m != 'sim.native'], sorted(sys.modules)\n"
            "from sim.cli.main import build_parser, main\n"
            "build_parser().format_help()\n"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('pandas', 'simpy', "
            "'pyarrow')], sorted(sys.modules)\n"
            f"main(['run', '-w', 'azure-code', '-n', '20', '--cost', 'constant:0.01', '-q', "
            f"'-o', {str(tmp_path / 'o')!r}])\n"
            "bad = [m for m in sys.modules if m.startswith(('matplotlib', 'sim.tools', "
            "'sim.cheatsheet', 'sim.costs.kernels', 'sim.costs.calibrated', 'sim.results.plots', "
            "'dask', 'cupy'))]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
