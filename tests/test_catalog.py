"""``sim models`` / ``sim gpus`` (sim/cli/catalog.py): every preset listed with its sources, and
the docs' tables made from the same rows."""

from sim.cli import main
from sim.cli.catalog import gpu_rows, gpus_markdown, model_rows, models_markdown
from sim.specs.gpus import gpu_presets
from sim.specs.models import model_presets


def test_sim_models_lists_every_preset_with_its_published_total(capsys):
    assert main(["models", "--sources"]) == 0
    out = capsys.readouterr().out
    for name in model_presets():
        assert f"\n{name} " in out
    assert "arXiv:2508.10925" in out  # gpt-oss's published total, its source
    assert "12 full + 12 sliding(128)" in out and "36 linear" in out
    assert {r["model"] for r in model_rows()} == set(model_presets())


def test_sim_models_lists_the_experts_own_precision(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "expert_dtype" in out.splitlines()[0]
    dtypes = {r["model"]: r["expert_dtype"] for r in model_rows()}
    assert dtypes["gpt-oss-120b"] == dtypes["gpt-oss-20b"] == "mxfp4"  # (the MXFP4 checkpoints)
    assert dtypes["mixtral-8x7b"] == dtypes["llama-3.1-8b"] == ""  # (at --weight-dtype)
    line = next(x for x in out.splitlines() if x.startswith("gpt-oss-20b "))
    assert " mxfp4 " in line
    assert "| expert_dtype |" in models_markdown()
    assert "| mxfp4 |" in models_markdown()


def test_sim_gpus_lists_every_preset_and_which_terms_are_fitted(capsys):
    assert main(["gpus"]) == 0
    out = capsys.readouterr().out
    for key in gpu_presets():
        assert f"\n{key} " in out
    terms = {r["gpu"]: r["terms"] for r in gpu_rows()}
    assert terms["h100"] == terms["a100"] == "fitted" and terms["l4"] == "assumed"
    assert terms["mi300x"] == "partly fitted"  # its published GEMM / all-reduce timings
    assert all(r["source"] for r in gpu_rows())


def test_the_docs_tables_are_the_same_rows():
    md = gpus_markdown()
    assert md.count("\n| ") == len(gpu_presets()) + 1 - 1  # header + rows (separator apart)
    assert all(f"| {k} |" in md for k in gpu_presets())
    assert all(f"| {n} |" in models_markdown() for n in model_presets())


def test_sim_gpus_shows_the_largest_tp_of_each_gpu():
    # --tp 16 on H100s is refused (sim/data/scaleup_domain.csv): the table says where the limit is
    tp_max = {r["gpu"]: r["tp_max"] for r in gpu_rows()}
    assert tp_max["h100"] == "8" and tp_max["gb200"] == "72" and tp_max["l40s"] == "8"
