"""The built wheel is self-contained: a non-editable install runs the default engine, a
tensor-parallel roofline (which reads measured data files) and the CLI. The wheel here is built
without the compiled core (SIM_PURE_PYTHON=1: setup.py compiles nothing, ~2 minutes saved on 2
cores), the install a compiler-less machine gets; the compiled build is the editable install's
(setup.py, tests/test_native.py)."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHECK = """
import sys
sys.path.insert(0, {target!r})
import sim, workloads
assert sim.__file__.startswith({target!r}), sim.__file__  # the installed copy, not the repo
assert workloads.__file__.startswith({target!r}), workloads.__file__
assert sim.native.summary() == "interpreted"  # (no extension in this wheel: the .py runs)
cost = sim.RooflineCost("llama-3.1-70b", "h100", tensor_parallel=4)  # reads data/profiles
res = sim.run(workloads.load("azure-code", n=50), cost_model=cost, kv_blocks=4000)
assert (res.requests["status"] == "finished").all()
from sim.cli import main
sys.exit(main(["run", "-n", "200", "--no-plots", "-q", "-o", {out!r}]))
"""


@pytest.mark.slow
def test_wheel_installs_and_runs_outside_the_repository(tmp_path):
    src = tmp_path / "src"  # a clean copy: setuptools reuses a stale build/ folder in place
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", "sim-out", ".hypothesis", "*.so",
        "_native_build.json"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist),
                    str(src)], check=True, capture_output=True, text=True,
                   env={**os.environ, "SIM_PURE_PYTHON": "1"})
    wheel, = dist.glob("llm_serving_sim-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert not [n for n in names if n.endswith(".so")], "an interpreted build compiled"
    for needed in ("sim/data/gpus.csv", "sim/data/models.csv", "sim/data/roofline_fit.json",
                   "sim/data/profiles/vidur_all_reduce_ms.csv",
                   "sim/data/profiles/cpu_calibration.json", "sim/engine/core/replica.py",
                   "sim/cli/main.py", "workloads/data/NOTICE.md"):
        assert needed in names, f"{needed} missing from {wheel.name}"
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(target), str(wheel)], check=True, capture_output=True, text=True)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-I", "-c", CHECK.format(target=str(target),
                                                                    out=str(out))],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "summary.json").exists() and (out / "requests.parquet").exists()
