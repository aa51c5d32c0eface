"""experiments/gemm_check.py and experiments/gpu_check.py as a user runs them: every bad flag value
is one line, ``<script>: error: ...`` naming the flag and the value, exit status 2, found
before any timing; an output in a missing folder is created."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODELS = "choose one of ['deepseek-v3'"
GEMM = [  # (arguments, the message's expected fragment); {d}: the test's folder
    (["--model", "nope"], f"--model 'nope' is not a preset; {MODELS}"),
    (["--gpu", "h300"], "--gpu 'h300' is not a preset (did you mean 'h200'?)"),
    (["--tokens", "0"], "argument --tokens: must be > 0, got 0"),
    (["--tokens", "8", "-3"], "argument --tokens: must be > 0, got -3"),
    (["--tokens", "many"], "argument --tokens: an integer expected, got 'many'"),
    (["--repeats", "0"], "argument --repeats: must be > 0, got 0"),
    (["-o", "{d}"], "--output '{d}' is a folder; give a file name"),
    (["-o", "{d}/a_file/g.csv"], "--output '{d}/a_file/g.csv': cannot write there ({d}/a_file is "
                                 "a file, not a folder)"),
]
GPU = [
    (["--model", "nope"], f"--model 'nope' is not a preset; {MODELS}"),
    (["--budget", "0"], "argument --budget: must be > 0, got 0"),
    (["--budget", "inf"], "argument --budget: must be > 0, got inf"),
    (["-n", "0"], "argument -n/--requests: must be > 0, got 0"),
    (["--repeats", "0"], "argument --repeats: must be > 0, got 0"),
    (["--engine-requests", "-1"], "argument --engine-requests: must be > 0, got -1"),
    (["-o", "{d}/a_file"], "--output '{d}/a_file': cannot write there ({d}/a_file is a file, "
                           "not a folder)"),
]
CASES = ([("gemm_check", a, m) for a, m in GEMM] + [("gpu_check", a, m) for a, m in GPU]
         + [(s, ["--device", "gpu"], "--device gpu: no CUDA GPU is usable through CuPy on this "
             "machine") for s in ("gemm_check", "gpu_check")])


@pytest.fixture
def script(load_script, monkeypatch):
    """The script loaded, with its work replaced by a failure (a bad flag must stop it first)
    and no GPU on this machine, as on the build VM."""
    from sim.costs import kernels

    def refuse(*args, **kwargs):
        raise AssertionError("the bad input was found only after the work started")

    def no_gpu(device="auto"):
        if device == "gpu":
            raise RuntimeError("device='gpu' but no CUDA GPU is usable through CuPy")
        return kernels.np, "cpu"
    monkeypatch.setattr(kernels, "array_module", no_gpu)

    def load(name):
        module = load_script(f"experiments/{name}.py")
        monkeypatch.setattr(module, "time_gemm" if name == "gemm_check" else "check_kernels",
                            refuse)
        return module
    return load


@pytest.mark.parametrize("name, argv, message", CASES,
                         ids=[f"{n} {' '.join(a)}" for n, a, _ in CASES])
def test_bad_flags_are_one_line_and_exit_status_2(name, argv, message, script, tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    device = [] if "--device" in argv else ["--device", "cpu"]
    with pytest.raises(SystemExit) as stop:
        script(name).main(device + argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.count("\n") == 1 and err.startswith(f"{name}: error: "), err
    assert message.replace("{d}", str(tmp_path)) in err, err
    assert err.endswith(f" (see '{name} --help')\n")


def test_gemm_check_creates_a_missing_output_folder(load_script, tmp_path):
    out = tmp_path / "new" / "deeper" / "g.csv"
    df = load_script("experiments/gemm_check.py").main(
        ["--device", "cpu", "--model", "tinyllama-1.1b", "--tokens", "2", "--repeats", "1",
         "-o", str(out)])
    assert out.exists() and len(df) == 4


def test_help_names_every_default_and_the_process_prints_no_traceback():
    for name, flags in (("gemm_check", ("--tokens N [N ...]", "(default 20)", "(default h200)",
                                        "(default llama-3.1-8b)", "(default gemm_check.csv)")),
                        ("gpu_check", ("(default 90)", "(default 300)", "(default 2)",
                                       "(default gpu-results)", "tinyllama-1.1b on a GPU"))):
        p = subprocess.run([sys.executable, f"experiments/{name}.py", "--help"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        text = " ".join(p.stdout.split())
        assert p.returncode == 0 and all(f in text for f in flags), text
    p = subprocess.run([sys.executable, "experiments/gemm_check.py", "--device", "cpu",
                        "--repeats", "0"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1
