"""The compiled core (sim/native.py): a stale extension never shadows an edited source, the
interpreter can be asked for, and compiled and interpreted engines give the same bytes."""

import hashlib
import importlib
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from sim import cython_shim, native

ROOT = Path(__file__).resolve().parents[1]

SOURCE = textwrap.dedent('''\
    """A module compiled by the test."""
    try:
        import cython
    except ImportError:
        from sim import cython_shim as cython


    @cython.locals(i=cython.longlong, s=cython.longlong)
    def total(n):
        s = 0
        for i in range(n):
            s += i
        return s


    def compiled():
        return cython.compiled
    ''')


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A package ``pkg`` with one module ``mod`` compiled from SOURCE, as setup.py builds."""
    root = tmp_path_factory.mktemp("native")
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "mod.py").write_text(SOURCE)
    (root / "setup.py").write_text(textwrap.dedent('''\
        from setuptools import Extension, setup
        from Cython.Build import cythonize
        setup(ext_modules=cythonize([Extension("pkg.mod", ["pkg/mod.py"])], quiet=True,
                                    compiler_directives={"language_level": 3}))
        '''))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=root,
                   check=True, capture_output=True, timeout=300, env=env)
    return root


def _load(root, record, pure=False):
    """Import ``pkg.mod`` afresh through a NativeFinder; returns (module, finder)."""
    finder = native.NativeFinder("pkg", root / "pkg", ["pkg.mod"], record, pure)
    for name in ("pkg.mod", "pkg"):
        sys.modules.pop(name, None)
    sys.path.insert(0, str(root))
    sys.meta_path.insert(0, finder)
    try:
        importlib.invalidate_caches()
        return importlib.import_module("pkg.mod"), finder
    finally:
        sys.meta_path.remove(finder)
        sys.path.remove(str(root))
        sys.modules.pop("pkg.mod", None)
        sys.modules.pop("pkg", None)


def test_the_extension_loads_when_built_from_this_source(built):
    mod, finder = _load(built, {"pkg.mod": native.source_hash(built / "pkg" / "mod.py")})
    assert mod.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert mod.compiled() is True and mod.total(10) == 45
    assert finder.why == {"pkg.mod": "compiled"}


def test_a_changed_source_runs_interpreted_with_a_warning(built):
    with pytest.warns(RuntimeWarning, match="rebuild"):
        mod, finder = _load(built, {"pkg.mod": "0" * 64})  # (built from another source)
    assert mod.__file__.endswith("mod.py") and mod.compiled() is False
    assert mod.total(10) == 45
    assert finder.why["pkg.mod"] == "interpreted: source changed since the build"


def test_one_stale_module_runs_the_whole_set_from_source(built):
    """The compiled modules share C types (one cimports another's class layout): a current
    extension beside a stale one would fail to import, so none is loaded compiled."""
    other = built / "pkg" / "other.py"
    other.write_text("X = 1\n")  # (in the set, never built)
    try:
        record = {"pkg.mod": native.source_hash(built / "pkg" / "mod.py")}
        finder = native.NativeFinder("pkg", built / "pkg", ["pkg.mod", "pkg.other"], record,
                                     False)
        for name in ("pkg.mod", "pkg.other", "pkg"):
            sys.modules.pop(name, None)
        sys.path.insert(0, str(built))
        sys.meta_path.insert(0, finder)
        try:
            importlib.invalidate_caches()
            mod = importlib.import_module("pkg.mod")
        finally:
            sys.meta_path.remove(finder)
            sys.path.remove(str(built))
            for name in ("pkg.mod", "pkg.other", "pkg"):
                sys.modules.pop(name, None)
        assert mod.compiled() is False
        assert finder.why["pkg.mod"] == "interpreted: pkg.other not current"
    finally:
        other.unlink()


def test_an_edited_pxd_makes_the_extension_stale(built):
    py = built / "pkg" / "mod.py"
    before = native.source_hash(py)
    pxd = py.with_suffix(".pxd")
    pxd.write_text("# types\n")
    try:
        assert native.source_hash(py) != before
        with pytest.warns(RuntimeWarning):
            mod, _ = _load(built, {"pkg.mod": before})
        assert mod.compiled() is False
    finally:
        pxd.unlink()
    assert native.source_hash(py) == before == hashlib.sha256(py.read_bytes()).hexdigest()


def test_pure_python_on_demand(built):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (asked for: no warning)
        mod, finder = _load(built, {"pkg.mod": native.source_hash(built / "pkg" / "mod.py")},
                            pure=True)
    assert mod.compiled() is False
    assert finder.why["pkg.mod"] == f"interpreted: {native.PURE_ENV}=1"


def test_pure_python_is_asked_by_any_value_but_empty_or_0():
    env = native.PURE_ENV
    assert not any(native.pure_requested(e) for e in ({}, {env: ""}, {env: "0"}))
    assert native.pure_requested({env: "1"}) and native.pure_requested({env: "yes"})


def test_the_shim_changes_nothing():
    def f(x):
        return x + 1
    assert cython_shim.locals(x=cython_shim.longlong)(f) is f and cython_shim.compiled is False


def test_the_record_names_only_compiled_modules():
    record = ROOT / "sim" / native.RECORD
    if record.exists():  # (an install that built: each entry is a module of COMPILED)
        assert set(json.loads(record.read_text())) <= set(native.COMPILED)
    assert all(importlib.util.find_spec(name) for name in native.COMPILED)


def test_ci_runs_the_compiled_core():
    """CI sets SIM_REQUIRE_COMPILED=1 for its compiled pass: then every module of COMPILED is
    the current extension (the install compiled them, none is stale); SIM_PURE_PYTHON=1 runs
    them all interpreted."""
    status = native.status()
    if native.pure_requested():
        assert set(status.values()) == {f"interpreted: {native.PURE_ENV}=1"}, status
    elif os.environ.get("SIM_REQUIRE_COMPILED") == "1":
        assert set(status.values()) == {"compiled"}, status
    else:
        assert set(status) == set(native.COMPILED)


CASE = textwrap.dedent('''\
    import hashlib, sys
    sys.path.insert(0, {bench!r})
    import bench_engine
    from sim.engine import run
    from sim.costs.roofline import RooflineCost
    from sim.constants import KV_BLOCKS_AVAILABLE
    df = bench_engine.workload(3000, seed=1)
    out = []
    for kw in ({{}}, {{"kv_blocks": KV_BLOCKS_AVAILABLE}}, {{"speculative": bench_engine.SPEC}},
               {{"scheduler": "sglang"}}, {{"scheduler": "vllm", "prefix_caching": "block"}}):
        kw = {{"scheduler": "chunked", **kw}}
        res = run(df, cost_model=RooflineCost("llama-3.1-8b", "h100"), max_batch_size=256,
                  model="llama-3.1-8b", gpu="h100", **kw)
        out.append(hashlib.sha256(res.requests.to_csv().encode()
                                  + res.iterations.to_csv().encode()).hexdigest())
    print(" ".join(out))
    ''')


@pytest.mark.determinism
def test_compiled_and_interpreted_give_the_same_bytes():
    code = CASE.format(bench=str(ROOT / "benchmarks"))

    def digest(pure):
        env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
        if pure:
            env[native.PURE_ENV] = "1"
        return subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=300,
                              capture_output=True, text=True).stdout.split()
    compiled, interpreted = digest(False), digest(True)
    assert len(compiled) == 5 and compiled == interpreted


def test_sim_run_says_which_core_ran(tmp_path):
    """timing.json (the wall time's file) names the engine core that produced it."""
    from sim.cli.main import main
    out = tmp_path / "o"
    assert main(["run", "-w", "azure-code", "-n", "20", "--cost", "constant:0.01", "-q",
                 "-o", str(out)]) == 0
    core = json.loads((out / "timing.json").read_text())["engine_core"]
    assert core == native.summary() and core in ("compiled", "interpreted")
    if os.environ.get("SIM_REQUIRE_COMPILED") == "1" and not native.pure_requested():
        assert core == "compiled"


def test_the_engine_runs_where_cython_is_not_installed():
    """Cython is needed to build, not to run: with it unimportable, every compiled module
    imports through the shim (its typed views, ``double[:]``, included) and the engine runs."""
    code = textwrap.dedent('''\
        import sys
        class NoCython:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("cython", "Cython"):
                    raise ImportError(name)
        sys.meta_path.insert(0, NoCython())
        import importlib, pandas as pd
        from sim import native
        for name in native.COMPILED:
            importlib.import_module(name)
        from sim.engine import run
        df = pd.DataFrame({"arrival_time": [0.0, 0.5], "num_prompt_tokens": [100, 200],
                           "num_output_tokens": [5, 7]})
        res = run(df, model="llama-3.1-8b", gpu="h100")
        print(int((res.requests["status"] == "finished").sum()), native.summary())
        ''')
    env = {**os.environ, native.PURE_ENV: "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["2", "interpreted"]
