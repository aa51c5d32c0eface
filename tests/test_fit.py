"""sim fit: the roofline's efficiency scales and per-iteration overhead fitted to measured runs.

The "measured" runs are simulated with a known perturbation of the roofline (every step 1.3x
slower plus 2 ms: an engine slower than the kernels' roofline), written in the three tools'
schemas; the fit must recover the perturbed step times and cut the held-out error, and the
profile it writes must drive ``sim run --profile``."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

import sim
import workloads
from sim.cli import main
from sim.costs.fitted import FIT_FORMAT, fitted_roofline, profile_terms, scaled_params
from sim.costs.roofline import RooflineCost
from sim.results.bench.files import export
from sim.tools.fit import fit, pattern_search, runs_of, split

MODEL, GPU = "llama-3.1-8b", "h100"
SCALE, EXTRA_S = 1.3, 0.002
MAIN = {"vllm-bench": "vllm-bench.json", "aiperf": "profile_export_aiperf.json",
        "guidellm": "benchmarks.json"}


class Perturbed:
    """The 'real engine': every step SCALE x the roofline's, plus EXTRA_S."""

    def __init__(self):
        self.base = RooflineCost(MODEL, GPU)

    def __call__(self, batch):
        return SCALE * self.base(batch) + EXTRA_S


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """Four runs from light to heavy load, in each tool's files (the third a closed loop)."""
    root = tmp_path_factory.mktemp("measured")
    paths = []
    for i, (fmt, rate, users) in enumerate([("vllm-bench", 0.5, None), ("aiperf", 4.0, None),
                                            ("guidellm", None, 12), ("vllm-bench", 10.0, None)]):
        df = workloads.load("sharegpt", n=60, rate=rate or 1.0, seed=i)
        loop = workloads.ClosedLoop(users) if users else None
        res = sim.run(df, model=MODEL, gpu=GPU, cost_model=Perturbed(), closed_loop=loop)
        folder = root / f"run{i}"
        folder.mkdir()
        for name, text in export(res, fmt, {"model": MODEL, "rate": rate,
                                            "concurrency": users}).items():
            (folder / name).write_text(text)
        paths.append(folder / MAIN[fmt])
    return paths


@pytest.fixture(scope="module")
def fitted(measured):
    runs = [r for p in measured for r in runs_of(p)]
    return fit(runs, sim.SimConfig(model=MODEL, gpu=GPU))


def test_unit_scales_are_the_roofline_bit_for_bit():
    base = RooflineCost(MODEL, GPU)
    assert scaled_params(base.params) is base.params
    same = fitted_roofline({"compute_eff_scale": 1.0, "memory_eff_scale": 1.0,
                            "overhead_s": base.params.overhead_s}, MODEL, GPU)
    df = workloads.load("sharegpt", n=30, rate=5.0, seed=0)
    a = sim.run(df, model=MODEL, gpu=GPU).requests
    b = sim.run(df, model=MODEL, gpu=GPU, cost_model=same).requests
    assert a.equals(b)


def test_scaled_efficiencies_are_capped_at_one():
    base = RooflineCost(MODEL, GPU).params
    p = scaled_params(base, 10.0, 0.5, 0.004)
    assert p.gemm_compute_eff == 1.0 and p.attn_prefill_compute_eff == 1.0
    assert p.gemm_memory_eff == pytest.approx(base.gemm_memory_eff / 2)
    assert p.elementwise_eff["add"] == pytest.approx(base.elementwise_eff["add"] / 2)
    assert p.overhead_s == 0.004
    with pytest.raises(ValueError, match="memory_eff_scale must be a number > 0"):
        scaled_params(base, 1.0, 0.0)


def test_split_holds_out_evenly_spaced_runs():
    assert split(list("abcd")) == (list("abd"), ["c"])  # a quarter, evenly spaced
    assert split(list("ab")) == (["a"], ["b"])  # at least one of two
    assert split(list("a")) == (["a"], [])
    assert split(list("abcdefgh"), 2) == (list("abdefgh"[:3] + "efh"), ["c", "g"])
    with pytest.raises(ValueError, match=r"holdout must be an integer in \[0, 1\]"):
        split(list("ab"), 2)


def test_pattern_search_follows_a_valley():
    """A narrow valley along x = y (the trade of two terms): the minimum at (1, 1)."""
    def f(x):
        return (x[0] - x[1]) ** 2 * 100 + (x[0] + x[1] - 2) ** 2
    x, fx, n = pattern_search(f, (-1.0, 2.5), (0.5, 0.5), (-5, -5), (5, 5), (1e-4, 1e-4), 500)
    assert np.allclose(x, (1, 1), atol=1e-3) and fx < 1e-6 and n < 500
    again = pattern_search(f, (-1.0, 2.5), (0.5, 0.5), (-5, -5), (5, 5), (1e-4, 1e-4), 500)
    assert again[0].tolist() == x.tolist()  # deterministic
    x, _, n = pattern_search(f, (-1.0, 2.5), (0.5, 0.5), (-5, -5), (5, 5), (1e-4, 1e-4), 7)
    assert n == 7  # the budget holds


def _batch(prefill=0, decodes=0, context=0):
    return SimpleNamespace(num_decode_tokens=decodes, decode_context_tokens=decodes * context,
                           prefills=[(prefill, 0)] if prefill else [],
                           num_prefill_tokens=prefill, num_spec_tokens=0)


def test_fit_recovers_the_perturbation_and_cuts_the_held_out_error(fitted):
    """The fitted step times are the perturbed ones (decode batches of 1-32, a 2,000-token
    prefill) within 6 %, and the held-out run's error drops from the roofline's (> 20 %) to
    under 3 %."""
    truth = Perturbed()
    cost = fitted_roofline(fitted.terms, MODEL, GPU)
    for b in (_batch(decodes=1, context=500), _batch(decodes=8, context=600),
              _batch(decodes=32, context=800), _batch(prefill=2000)):
        assert cost(b) == pytest.approx(truth(b), rel=0.06), b
    assert [r[1] for r in fitted.rows] == ["fit", "fit", "fit", "held-out"]
    assert "run2" in fitted.rows[-1][0]  # the closed loop, read from guidellm's file
    for split_name in ("fit", "held-out"):
        before, after = (fitted.mean_error(split_name, w) for w in ("before", "after"))
        assert before > 0.2 and after < 0.03, (split_name, before, after)
    assert fitted.evaluations <= 120


def test_sim_fit_writes_a_profile_sim_run_uses(measured, tmp_path, capsys):
    out = tmp_path / "fit.json"
    two = [str(measured[0]), str(measured[3])]
    assert main(["fit", *two, "-o", str(out), "--max-evaluations", "12"]) == 0
    text = capsys.readouterr().out
    assert "held-out runs: mean error" in text and "(roofline) ->" in text
    doc = json.loads(out.read_text())
    assert doc["format"] == FIT_FORMAT
    lib = fit([r for p in two for r in runs_of(p)], sim.SimConfig(model=MODEL, gpu=GPU),
              max_evaluations=12)
    assert doc["terms"] == lib.terms and doc["evaluations"] == 12  # deterministic, bit for bit
    assert doc["fitted_to"]["gpu"] == GPU and [r["split"] for r in doc["runs"]] == [
        "fit", "held-out"]
    held = doc["error_pct"]["held-out"]
    assert held["after"] < held["before"]
    fitted = lib
    assert main(["run", "-w", "sharegpt", "-n", "30", "--rate", "4", "--profile", str(out),
                 "-o", str(tmp_path / "run"), "-q"]) == 0
    got = json.loads((tmp_path / "run" / "summary.json").read_text())
    df = workloads.load("sharegpt", n=30, rate=4.0)
    want = sim.run(df, model=MODEL, gpu=GPU,
                   cost_model=fitted_roofline(fitted.terms, MODEL, GPU)).summary()
    key = next(k for k in ("ttft_mean", "summary") if k in got)
    summary = got if key == "ttft_mean" else got["summary"]
    assert summary["ttft_mean"] == pytest.approx(want["ttft_mean"], rel=1e-12)


@pytest.mark.parametrize("doc, message", [
    ({"format": FIT_FORMAT}, "terms: must be an object"),
    ({"format": FIT_FORMAT, "terms": {"compute_eff_scale": 1, "memory_eff_scale": -1,
                                      "overhead_s": 0}}, "terms.memory_eff_scale: must be a "
                                                         "number > 0, got -1"),
    ({"format": FIT_FORMAT, "terms": {"compute_eff_scale": 1, "memory_eff_scale": 1}},
     "terms.overhead_s: must be a number >= 0, got None"),
])
def test_a_bad_profile_is_one_line_naming_the_field(doc, message, tmp_path, capsys):
    with pytest.raises(ValueError, match=message):
        profile_terms(doc)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    assert main(["run", "-n", "5", "--rate", "1", "--profile", str(p), "-q",
                 "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(p) in err and message.split(":")[0] in err


def test_a_fit_profile_keeps_expert_parallelism(tmp_path, capsys):
    """--profile FIT.json with --ep 8 --expert-skew 1 priced the MoE layers as tensor-parallel
    slices (no all-to-all, no hot GPU): the fitted roofline dropped the two settings."""
    p = tmp_path / "fit.json"
    p.write_text(json.dumps({"format": FIT_FORMAT, "terms": {
        "compute_eff_scale": 0.5, "memory_eff_scale": 0.7, "overhead_s": 0.001}}))
    assert main(["run", "--model", "mixtral-8x7b", "--tp", "8", "--ep", "8", "--expert-skew",
                 "1", "--profile", str(p), "-n", "5", "--rate", "1",
                 "-o", str(tmp_path / "o")]) == 0
    assert "tp=8, ep=8, skew=1, weights=fp16, params(" in capsys.readouterr().out


@pytest.mark.parametrize("doc", [{}, {"completed": 3, "request_throughput": 1.0}])
def test_a_json_object_that_is_no_profile_names_the_file(doc, tmp_path, capsys):
    """An empty object or a benchmark result given as --profile: the error names the file."""
    p = tmp_path / "notaprofile.json"
    p.write_text(json.dumps(doc))
    assert main(["run", "-n", "5", "--rate", "1", "--profile", str(p), "-q",
                 "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"--profile '{p}': not a calibration profile (format None); write one" in err


def test_a_bad_measured_file_is_one_line_naming_file_and_field(measured, tmp_path, capsys):
    doc = json.loads(measured[0].read_text())
    doc["input_lens"][3] = "many"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert main(["fit", str(measured[1]), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err and "input_lens[3]" in err
    assert main(["fit", str(measured[0]), str(measured[1]), "--holdout", "2"]) == 2
    assert "--holdout 2: must be below the number of measured runs, 2" in \
        capsys.readouterr().err


def test_a_file_given_twice_is_refused_not_fitted_and_held_out(measured, capsys):
    """Twice the same run would be both a fit run and the held-out test of the fit."""
    assert main(["fit", str(measured[0]), str(measured[1]), str(measured[0]), "-o",
                 "never.json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{measured[0]}: given twice" in err


def test_a_guidellm_sweep_is_one_run_per_benchmark(tmp_path):
    df = workloads.load("sharegpt", n=10, rate=2.0, seed=0)
    res = sim.run(df, model=MODEL, gpu=GPU)
    text = export(res, "guidellm", {"model": MODEL, "rate": 2.0})["benchmarks.json"]
    doc = json.loads(text)
    doc["benchmarks"] = doc["benchmarks"] * 3
    p = tmp_path / "benchmarks.json"
    p.write_text(json.dumps(doc))
    runs = runs_of(p)
    assert [r.name for r in runs] == [f"{p}#{i}" for i in range(3)]
    assert all(math.isclose(len(r.measured.workload), 10) for r in runs)
