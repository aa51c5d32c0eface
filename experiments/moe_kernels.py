"""The roofline's MoE layer against published fused-MoE kernel timings.

    python experiments/moe_kernels.py            # fit on the fit rows, report every row
    python experiments/moe_kernels.py --write    # also stores the fit in sim/data/moe_fit.json

Data: ``sim/data/moe_kernels.csv``, one row per published kernel time with its source: vLLM's
Triton ``fused_moe`` as ``benchmarks/kernels/benchmark_moe.py`` times it (random router logits,
so uniform routing; top-k softmax, the block alignment of the expert ids, both expert GEMMs,
the activation and ``moe_sum``, captured in a CUDA graph; the router GEMM is not timed). Each
row gives the expert shape on one GPU (``num_experts``, ``top_k``, ``hidden_size``,
``intermediate_size`` = one expert's width on that GPU), the GPU, the dtype and the tokens.

The model of a row is the roofline's MoE layer (:func:`sim.costs.moe.moe_work` through
:class:`~sim.costs.roofline.RooflineCost`): the ops the benchmark times (:data:`TIMED_OPS`),
each ``max(compute, memory, floor)`` with the GPU's fitted efficiencies. The permutation is
priced as TensorRT-LLM's activation copy; vLLM's kernel gathers rows inside its first GEMM and
its alignment kernel reads only ids, so the rows' permute term is at most ~1 % too high.

One term is fitted: ``moe_gemm_compute_scale``, the fraction of the dense GEMM rate the
grouped expert GEMMs reach (a grid over 0.30-1.00, least squares in log time), on the rows
marked ``fit`` (Mixtral-8x7B, BF16, 2 H100s, tuned configs: the shape and kernel the serving
check's Mixtral rows exercise). The split was fixed before any prediction was looked at; the
other shapes, GPUs and dtypes are held out. Per GPU: a GPU with fit rows of its own gets its own
scale (``moe_fit.json``'s ``params``: H100 today); every other GPU gets the shared one, and
its provenance says ``assumed`` (:mod:`sim.costs.roofline_terms`; ``sim run`` prints it for a
MoE model). B200's rows (vLLM PR #31448, batch 1-4) are memory-bound: the scale does not move
them, so they check B200's weight streaming and cannot fit its grouped-GEMM rate; no MI300X
fused-MoE kernel timing was found (searched: vLLM/SGLang tuned-config PRs, ROCm blogs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from sim.costs.roofline import RooflineCost
from sim.costs.roofline_params import fitted_params
from sim.specs.models import ModelConfig

TIMED_OPS = ("moe_topk", "moe_permute", "mlp_up_proj", "mlp_act", "mlp_down_proj",
             "moe_unpermute")
GRID = np.round(np.arange(0.30, 1.0001, 0.01), 2)
SHIPPED = Path(__file__).resolve().parents[1] / "sim" / "data" / "moe_fit.json"


def load() -> pd.DataFrame:
    text = resources.files("sim").joinpath("data/moe_kernels.csv").read_text()
    from io import StringIO
    return pd.read_csv(StringIO(text))


def _model(r) -> ModelConfig:
    """A one-layer MoE model with the row's expert shape (attention is not priced here)."""
    return ModelConfig(name=f"{r.model}-moe-layer", num_hidden_layers=1,
                       hidden_size=int(r.hidden_size), num_attention_heads=8,
                       num_key_value_heads=8, head_dim=128,
                       intermediate_size=int(r.intermediate_size * r.tensor_parallel),
                       vocab_size=32000, num_local_experts=int(r.num_experts),
                       num_experts_per_tok=int(r.top_k))


def predict(rows: pd.DataFrame, scale: float | None = None) -> np.ndarray:
    """Seconds per row: the timed ops of one MoE layer, with ``moe_gemm_compute_scale`` set to
    ``scale`` (None: the shipped value)."""
    out = []
    for r in rows.itertuples():
        params = fitted_params(r.gpu)
        if scale is not None:
            params = dataclasses.replace(params, moe_gemm_compute_scale=float(scale))
        cost = RooflineCost(_model(r), r.gpu, tensor_parallel=int(r.tensor_parallel),
                            weight_dtype="fp8" if r.dtype == "fp8" else "fp16", params=params)
        ops = cost.op_times(int(r.batch_tokens))
        out.append(sum(ops[op] for op in TIMED_OPS))
    return np.array(out)


def measured(rows: pd.DataFrame) -> np.ndarray:
    return rows["value"].to_numpy() * 1e-6  # every row is in microseconds


def fit_scale(rows: pd.DataFrame | None = None) -> float:
    """The grid value of ``moe_gemm_compute_scale`` with the least squared log error on the
    fit rows (every GPU's)."""
    rows = load() if rows is None else rows
    fit = rows[rows["split"] == "fit"]
    meas = np.log(measured(fit))
    sse = [float(np.sum((np.log(predict(fit, s)) - meas) ** 2)) for s in GRID]
    return float(GRID[int(np.argmin(sse))])


def fit_per_gpu(rows: pd.DataFrame | None = None) -> dict:
    """``{gpu: scale}``: each GPU with fit rows of its own, fitted on those rows alone (a GPU
    whose rows are all held out, or absent, gets the shared :func:`fit_scale`: assumed)."""
    rows = load() if rows is None else rows
    fit = rows[rows["split"] == "fit"]
    return {g: fit_scale(fit[fit["gpu"] == g]) for g in sorted(set(fit["gpu"]))}


def report(scale: float | None = None) -> pd.DataFrame:
    """One row per measurement: predicted / measured - 1, with ``scale`` (None: shipped)."""
    rows = load()
    rows = rows.assign(predicted_us=predict(rows, scale) * 1e6)
    rows["error"] = rows["predicted_us"] / rows["value"] - 1
    return rows[["split", "gpu", "dtype", "model", "tensor_parallel", "batch_tokens", "value",
                 "predicted_us", "error"]]


def summary(rep: pd.DataFrame) -> pd.DataFrame:
    """Per split and shape: rows, median signed and median |error|, worst row."""
    g = rep.groupby(["split", "model", "gpu", "dtype"], sort=False)["error"]
    return pd.DataFrame({"rows": g.size(), "median_signed": g.median(),
                         "median_abs": g.apply(lambda e: e.abs().median()),
                         "worst": g.apply(lambda e: e.loc[e.abs().idxmax()])})


def document(scale: float) -> dict:
    """The JSON document :func:`sim.costs.roofline_params.fitted_params` reads: ``params`` the
    per-GPU fits (:func:`fit_per_gpu`), ``shared`` the scale every other GPU gets (assumed
    there, :func:`sim.costs.roofline_terms.moe_assumed_note`)."""
    rep = report(scale)
    return {"source": "experiments/moe_kernels.py on sim/data/moe_kernels.csv (fit rows: "
                      "vLLM PR #24700, Mixtral-8x7B BF16, 2 H100s)",
            "shared": {"moe_gemm_compute_scale": scale},
            "params": {g: {"moe_gemm_compute_scale": s} for g, s in fit_per_gpu().items()},
            "report": summary(rep).round(3).reset_index().to_dict(orient="records")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true",
                    help="store the fit in sim/data/moe_fit.json (default: print only)")
    a = ap.parse_args(argv)
    scale = fit_scale()
    if a.write:
        SHIPPED.write_text(json.dumps(document(scale), indent=1) + "\n")
    pd.set_option("display.width", 160)
    print(f"moe_gemm_compute_scale fitted on the fit rows: {scale}")
    for label, s in (("dense GEMM rate (scale 1.0)", 1.0), (f"fitted scale {scale}", scale)):
        rep = report(s)
        print(f"\n{label}:\n{summary(rep).round(3).to_string()}")
        print("held out, all shapes: median |error| "
              f"{rep[rep.split == 'held-out']['error'].abs().median():.3f}")
    print("\nper row (fitted):\n" + report(scale).round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
