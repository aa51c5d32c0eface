"""Fit the roofline terms of GPUs without per-op profiles to their own published kernel timings.

    python experiments/fit_gpu_kernels.py            # prints the report; writes nothing
    python experiments/fit_gpu_kernels.py --write    # also overwrites sim/data/gpu_kernel_fit.json

Data: ``sim/data/gpu_kernels.csv`` (its header states the sources, the units and the split):
published GEMM kernel times of the GPU (ROCm/aiter's tuned-GEMM tables, the ml-engineering
Maximum Achievable Matmul FLOPS table, vLLM's kernel benchmarks in PR descriptions, a kernel
write-up) and single-node all-reduce sweeps (rccl-tests / all_reduce_bench busbw). Nothing
from another GPU enters a GPU's fit: the terms it sets replace, for that GPU only, the mean of
the profiled GPUs' terms (:func:`sim.costs.roofline_params.fitted_params`).

Models (the roofline's own, so a fitted term means what it means in the simulator):

- a GEMM of ``m x k`` by ``k x n`` costs ``max(2 m n k / (peak x ce), bytes / (HBM x
  gemm_memory_eff), kernel_floor_s) + gemm_latency_s`` with ``bytes = k n wb + m (k + n) 2``
  (:mod:`sim.costs.roofline_ops`); ``ce`` is ``gemm_compute_eff`` at the fp16 peak for BF16 rows
  and ``fp8_gemm_compute_eff`` at the FP8 peak for FP8 rows; INT8 rows run at the INT8 peak with
  ``gemm_compute_eff`` (held out: the simulator has no INT8 term);
- an all-reduce over ``n`` GPUs of one node costs ``allreduce_latency_s + 2 (n - 1) / n x bytes /
  (link x allreduce_eff)`` (:mod:`sim.costs.roofline_collectives`' ring; ``link`` the group's
  bandwidth, :func:`~sim.costs.roofline_collectives.group_link_bytes_per_s`: on MI300X's fully
  connected xGMI board ``n - 1`` links of 64 GB/s), fitted on the 8-GPU rows (the
  tensor-parallel group of an 8-GPU node); the 2-GPU row checks the group bandwidth.

Fit: per GPU, ``gemm_compute_eff`` (BF16 rows), ``fp8_gemm_compute_eff`` (FP8 rows) and the
``gemm_memory_eff`` and ``gemm_latency_s`` they share, minimising the sum over the dtypes of each
dtype's mean absolute log error on its ``fit`` rows (a grid: efficiencies in steps of 0.005 /
0.01, latency in steps of 0.25 us; the memory efficiency at most 0.95, as in
``fit_roofline.py``); the all-reduce pair likewise, on the 8-GPU rows. The report gives the
median and P90 absolute percentage error per GPU, kind, dtype and split.
"""

from __future__ import annotations

import argparse
import json
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from sim.costs.roofline import _GPU_KEYS
from sim.costs.roofline_collectives import group_link_bytes_per_s
from sim.costs.roofline_ops import ACT_BYTES
from sim.costs.roofline_params import RooflineParams, _fitted, mean_terms
from sim.specs.gpus import get_gpu

SHIPPED = Path(__file__).resolve().parents[1] / "sim" / "data" / "gpu_kernel_fit.json"
WEIGHT_BYTES = {"bf16": 2, "fp8": 1, "int8": 1}
CE_GRID = np.round(np.arange(0.20, 1.0001, 0.005), 3)
# at most fit_roofline's MAX_BANDWIDTH_EFF of the HBM peak: a kernel benchmark repeating one
# GEMM keeps weights that fit in L2 (B200: 126 MB) on chip, faster than any HBM read
ME_GRID = np.round(np.arange(0.30, 0.9501, 0.01), 2)
LAT_GRID = np.round(np.arange(0.0, 30.0001, 0.25), 2) * 1e-6
AR_EFF_GRID = np.round(np.arange(0.05, 1.0001, 0.005), 3)
AR_LAT_GRID = np.round(np.arange(0.0, 100.0001, 0.25), 2) * 1e-6


def load_kernels() -> pd.DataFrame:
    """``gpu_kernels.csv`` as a table (``#`` lines are its header notes)."""
    with resources.files("sim").joinpath("data/gpu_kernels.csv").open() as f:
        df = pd.read_csv(f, comment="#")
    bad = df[~df["split"].isin(["fit", "held_out"]) | ~df["kind"].isin(["gemm", "allreduce"])]
    if len(bad):
        r = bad.iloc[0]
        raise ValueError(f"gpu_kernels.csv row {bad.index[0] + 2}: kind {r['kind']!r} / split "
                         f"{r['split']!r} (kind gemm or allreduce, split fit or held_out)")
    return df


def _floor() -> float:
    """The kernel floor every GPU without a profile gets (the profiled GPUs' mean)."""
    fits = list(_fitted().get("params", {}).values())
    return mean_terms(fits).get("kernel_floor_s", RooflineParams().kernel_floor_s)


def gemm_work(rows: pd.DataFrame, gpu) -> tuple:
    """``(FLOPs, bytes, peak FLOP/s)`` per GEMM row, as the roofline counts them."""
    m, n, k = (rows[c].astype(float).to_numpy() for c in ("m", "n", "k"))
    wb = rows["dtype"].map(WEIGHT_BYTES).to_numpy(dtype=float)
    peak = rows["dtype"].map({"bf16": gpu.fp16_tflops, "fp8": gpu.fp8_tflops,
                              "int8": gpu.int8_tops}).to_numpy(dtype=float) * 1e12
    return 2.0 * m * n * k, k * n * wb + m * (k + n) * ACT_BYTES, peak


def gemm_seconds(rows, gpu, ce_bf16, ce_fp8, me, lat, floor) -> np.ndarray:
    """The roofline's time of each GEMM row at these terms (INT8 rows at ``ce_bf16``)."""
    flops, nbytes, peak = gemm_work(rows, gpu)
    ce = np.where(rows["dtype"].to_numpy() == "fp8", ce_fp8, ce_bf16)
    bw = gpu.memory_bandwidth_gbps * 1e9
    return np.maximum(np.maximum(flops / (peak * ce), nbytes / (bw * me)), floor) + lat


def _group_links(rows, gpu) -> np.ndarray:
    """Each all-reduce row's group bandwidth (bytes/s per direction) over its ``gpus``."""
    return np.array([group_link_bytes_per_s(gpu, int(n)) for n in rows["gpus"]], dtype=float)


def allreduce_seconds(rows, gpu, eff, lat) -> np.ndarray:
    n = rows["gpus"].astype(float).to_numpy()
    size = rows["size_bytes"].astype(float).to_numpy()
    return lat + 2 * (n - 1) / n * size / (_group_links(rows, gpu) * eff)


def _gemm_error(rows, gpu, me, lat, floor):
    """``sum |log(predicted / measured)|`` per compute efficiency of :data:`CE_GRID`, and per
    latency of ``lat`` (an array), for GEMM rows of one dtype."""
    meas = rows["measured_us"].to_numpy(dtype=float) * 1e-6
    flops, nbytes, peak = gemm_work(rows, gpu)
    mem = np.maximum(nbytes / (gpu.memory_bandwidth_gbps * 1e9 * me), floor)
    comp = flops[None, None, :] / (peak[None, None, :] * CE_GRID[None, :, None])
    t = np.maximum(comp, mem[None, None, :]) + np.asarray(lat)[:, None, None]
    return np.abs(np.log(t / meas)).sum(axis=2)  # (latency, ce)


def fit_gemm(rows: pd.DataFrame, gpu, floor: float) -> dict:
    """A grid over the memory efficiency and the latency the dtypes share, with, per pair, each
    dtype's best compute efficiency; each dtype's rows weigh equally (their mean |log error|),
    so a dtype with many rows does not set the shared memory term alone."""
    dtypes = [d for d in ("bf16", "fp8") if (rows["dtype"] == d).any()]
    best = None
    for me in ME_GRID:
        err = {d: _gemm_error(rows[rows["dtype"] == d], gpu, me, LAT_GRID, floor)
               / (rows["dtype"] == d).sum() for d in dtypes}
        per_lat = sum(e.min(axis=1) for e in err.values())
        i = int(np.argmin(per_lat))
        if best is None or per_lat[i] < best[0] - 1e-12:
            best = (float(per_lat[i]), float(me), float(LAT_GRID[i]),
                    {d: float(CE_GRID[int(np.argmin(err[d][i]))]) for d in dtypes})
    _, me, lat, ce = best
    out = {"gemm_memory_eff": me, "gemm_latency_s": round(lat, 8)}
    if "bf16" in ce:
        out["gemm_compute_eff"] = ce["bf16"]
    if "fp8" in ce:
        out["fp8_gemm_compute_eff"] = ce["fp8"]
    return out


def fit_allreduce(rows: pd.DataFrame, gpu) -> dict:
    meas = rows["measured_us"].to_numpy(dtype=float) * 1e-6
    n = rows["gpus"].astype(float).to_numpy()
    size = rows["size_bytes"].astype(float).to_numpy()
    link = _group_links(rows, gpu)[None, None, :]
    t = AR_LAT_GRID[:, None, None] + (2 * (n - 1) / n * size)[None, None, :] / (
        link * AR_EFF_GRID[None, :, None])
    err = np.abs(np.log(t / meas)).sum(axis=2)
    i, j = np.unravel_index(int(np.argmin(err)), err.shape)
    return {"allreduce_eff": float(AR_EFF_GRID[j]),
            "allreduce_latency_s": float(round(AR_LAT_GRID[i], 8))}


def fit_all(df: pd.DataFrame | None = None) -> dict:
    """``{gpu key: terms}`` fitted to each GPU's own ``fit`` rows."""
    df = load_kernels() if df is None else df
    floor, out = _floor(), {}
    for name in sorted(df["gpu"].unique()):
        gpu, rows = get_gpu(name), df[(df["gpu"] == name) & (df["split"] == "fit")]
        terms = {}
        g = rows[(rows["kind"] == "gemm") & rows["dtype"].isin(["bf16", "fp8"])]
        if len(g):
            terms.update(fit_gemm(g, gpu, floor))
        a = rows[(rows["kind"] == "allreduce") & (rows["gpus"] == 8)]
        if len(a):
            terms.update(fit_allreduce(a, gpu))
        out[_GPU_KEYS.get(gpu.name, gpu.name.lower())] = terms
    return out


def predict(df: pd.DataFrame, params: dict) -> np.ndarray:
    """Predicted seconds of every row of ``df`` with ``params`` ({gpu key: terms}) over the
    profiled GPUs' mean (the terms a GPU without a fit of that term gets)."""
    base = mean_terms(list(_fitted().get("params", {}).values()))
    floor = base.get("kernel_floor_s", RooflineParams().kernel_floor_s)
    out = np.full(len(df), np.nan)
    for name in df["gpu"].unique():
        gpu = get_gpu(name)
        p = {**base, **params.get(_GPU_KEYS.get(gpu.name, gpu.name.lower()), {})}
        d = RooflineParams()
        for kind in ("gemm", "allreduce"):
            s = ((df["gpu"] == name) & (df["kind"] == kind)).to_numpy()
            if not s.any():
                continue
            rows = df[s]
            if kind == "gemm":
                ce = p.get("gemm_compute_eff", d.gemm_compute_eff)
                out[s] = gemm_seconds(rows, gpu, ce, p.get("fp8_gemm_compute_eff") or ce,
                                      p.get("gemm_memory_eff", d.gemm_memory_eff),
                                      p.get("gemm_latency_s", d.gemm_latency_s), floor)
            else:
                out[s] = allreduce_seconds(rows, gpu, p.get("allreduce_eff", d.allreduce_eff),
                                           p.get("allreduce_latency_s", d.allreduce_latency_s))
    return out


def report(df: pd.DataFrame, params: dict) -> pd.DataFrame:
    """Median / P90 |error| per GPU, kind, dtype and split (``gpus`` for all-reduces)."""
    d = df.assign(ape=np.abs(predict(df, params) / (df["measured_us"] * 1e-6) - 1) * 100)
    d["dtype"] = np.where(d["kind"] == "allreduce",
                          d["gpus"].fillna(0).astype(int).astype(str) + " GPUs", d["dtype"])
    g = d.groupby(["gpu", "kind", "dtype", "split"])["ape"]
    return pd.DataFrame({"rows": g.size(), "median_ape_pct": g.median().round(2),
                         "p90_ape_pct": g.quantile(0.9).round(2)}).reset_index()


def document(params: dict, before: pd.DataFrame, after: pd.DataFrame) -> dict:
    return {"source": "experiments/fit_gpu_kernels.py on sim/data/gpu_kernels.csv (published "
                      "kernel timings of each GPU; sources per row)",
            "params": params,
            "report": after.to_dict(orient="records"),
            "report_assumed": before.to_dict(orient="records")}


def main(argv=None):
    """Fit and print the report (and the error with the assumed terms, for comparison)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true",
                    help=f"overwrite the shipped fit, {SHIPPED.name}")
    a = ap.parse_args(argv)
    df = load_kernels()
    params = fit_all(df)
    before, after = report(df, {}), report(df, params)
    print("fitted terms:")
    for gpu, terms in params.items():
        print(f"  {gpu}: " + ", ".join(f"{k} {v:g}" for k, v in terms.items()))
    merged = before.merge(after, on=["gpu", "kind", "dtype", "split", "rows"],
                          suffixes=("_assumed", "_fitted"))
    print(merged.to_string(index=False))
    if a.write:
        SHIPPED.write_text(json.dumps(document(params, before, after), indent=1) + "\n")
        print(f"wrote {SHIPPED}")
    else:
        print(f"not written (--write updates {SHIPPED.name})")


if __name__ == "__main__":
    main()
