"""Which roofline terms each GPU has measured (sim.costs.roofline_terms): one kind per term,
fitted GPUs have fitted terms and only they, an unmeasured GPU says its terms are assumed, and
the CLI's note names the counts."""

import dataclasses

import pytest

from sim.cli.main import main
from sim.costs.roofline import RooflineCost
from sim.costs.roofline_params import RooflineParams, fitted_gpus, fitted_params
from sim.costs.roofline_terms import KINDS, counts, provenance, summary_line


@pytest.mark.parametrize("gpu", ["A100-80GB-SXM", "H100-80GB-SXM", "MI300X", "B200-HGX", "L40S"])
def test_every_term_has_one_kind(gpu):
    key = RooflineCost("llama-3.1-8b", gpu).gpu_key
    p = provenance(key)
    assert set(p) == {f.name for f in dataclasses.fields(RooflineParams)}
    assert all(kind in KINDS for kind, _ in p.values())
    assert sum(counts(key).values()) == len(p)
    assert (counts(key)["fitted"] > 0) == (key in fitted_gpus())


def test_assumed_terms_are_the_fitted_gpus_mean():
    p = provenance("h200")
    mean, a100, h100 = fitted_params("h200"), fitted_params("a100"), fitted_params("h100")
    for term, (kind, note) in p.items():
        if kind == "assumed" and "a100, h100" in note and isinstance(getattr(a100, term), float):
            assert getattr(mean, term) == pytest.approx(
                (getattr(a100, term) + getattr(h100, term)) / 2)
    assert counts("h200")["fitted"] == 0 and "h200" in summary_line("h200")


def test_cli_note_names_the_counts(capsys):
    assert main(["run", "--gpu", "h200", "--num-requests", "20", "--quiet"]) in (0, None)
    capsys.readouterr()
    assert main(["run", "--gpu", "h200", "--num-requests", "20"]) in (0, None)
    out = capsys.readouterr().out
    assert "roofline terms: fitted 0, assumed" in out


def test_cli_note_names_a_partly_fitted_gpus_terms(capsys):
    """MI300X: its GEMM and all-reduce terms fitted to its published kernel timings, the
    rest assumed; the note names the fitted terms and the counts."""
    assert main(["run", "--gpu", "mi300x", "--num-requests", "20"]) in (0, None)
    out = capsys.readouterr().out
    n = counts("mi300x")["fitted"]
    assert n > 0 and f"roofline terms: fitted {n}, assumed" in out
    assert "partly fitted to MI300X's published kernel timings (gemm_compute_eff" in out


def test_the_cli_says_nothing_on_profiled_gpus(capsys):
    assert main(["run", "--gpu", "h100", "--num-requests", "20"]) in (0, None)
    assert "roofline terms:" not in capsys.readouterr().out
