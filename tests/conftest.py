import importlib.util
import os
from pathlib import Path

import matplotlib
import pytest
from hypothesis import settings

os.environ.setdefault("MPLBACKEND", "Agg")
matplotlib.use("Agg")

# The README's test command draws the same examples on every run (a CI result does not depend
# on luck); SIM_THOROUGH=1 explores fresh random ones (README, "Errors and limits").
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("explore" if os.environ.get("SIM_THOROUGH") else "repeatable")


@pytest.fixture
def rng():
    import numpy as np
    return np.random.default_rng(12345)


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def load_script():
    """Import a script of the repository (``experiments/x.py``) by path, without sys.path."""
    def load(relpath):
        path = ROOT / relpath
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return load


@pytest.fixture
def unshared():
    """A copy of a prefix-sharing workload in which every prompt's blocks are its own (its
    hash_ids differ from the first token on)."""
    def unshare(df):
        out = df.copy()
        out["hash_ids"] = [[hash(("own", i, k)) for k in range(len(ids))]
                           for i, ids in enumerate(df["hash_ids"])]
        out.attrs = dict(df.attrs)
        return out
    return unshare


# the instruction set each OpenBLAS x86 kernel the tests force needs (a /proc/cpuinfo flag)
KERNEL_NEEDS = {"Nehalem": "sse4_2", "Sandybridge": "avx", "Haswell": "avx2",
                "SkylakeX": "avx512f"}


@pytest.fixture
def under_blas_kernels():
    """``run(code, cores)``: the JSON that the Python ``code`` prints, run in a fresh process
    under each OpenBLAS kernel of ``cores`` (``OPENBLAS_CORETYPE``), one dict per kernel. A
    kernel forced on a CPU without its instructions would die of an illegal instruction: where
    the CPU (``/proc/cpuinfo``) lacks one a kernel needs, the test is skipped and says which."""
    import json
    import subprocess
    import sys

    def run(code, cores):
        try:
            flags = set(Path("/proc/cpuinfo").read_text().split("flags", 1)[1]
                        .split("\n", 1)[0].split())
        except (OSError, IndexError):
            flags = set()
        missing = [f"{core} needs {KERNEL_NEEDS.get(core, '?')}" for core in cores
                   if KERNEL_NEEDS.get(core) not in flags]
        if missing:
            pytest.skip(f"this CPU cannot run the OpenBLAS kernels compared ({', '.join(missing)})")
        out = []
        for core in cores:
            env = dict(os.environ, OPENBLAS_CORETYPE=core)
            done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                  text=True, timeout=300, check=True)
            out.append(json.loads(done.stdout))
        return out
    return run


def replay_plan(folder):
    """``sim plan plan.toml -o out`` in ``folder``, then ``sim run out/winner.toml``: both
    exit 0 (the working directory is restored)."""
    from sim.cli.main import main
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        assert main(["plan", "plan.toml", "-o", "out", "--workers", "1", "--no-progress"]) == 0
        assert main(["run", "out/winner.toml", "-q"]) == 0


@pytest.fixture(scope="session")
def plan_and_replay():
    """:func:`replay_plan`, for a test."""
    return replay_plan
