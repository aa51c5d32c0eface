"""Where each roofline term of a GPU comes from: fitted to that GPU's kernels, or assumed.

Concept. :func:`sim.costs.roofline_params.fitted_params` gives a GPU its own fitted terms
(``roofline_fit.json``'s ``params[gpu]``: per-op profiles), else, term by term, the mean over the
profiled GPUs (:func:`~sim.costs.roofline_params.mean_terms`) under the terms fitted to its own
published kernel timings (``gpu_kernel_fit.json``), plus terms shared by every GPU. This module
says which is which, per term (:func:`provenance`), and counts them (:func:`summary_line`), so
a prediction on a GPU with no measured terms says so.

Kinds (:data:`KINDS`): ``fitted`` (this GPU's own kernel timings: its per-op profiles or its
published GEMM / all-reduce measurements), ``assumed`` (the profiled GPUs' mean: no
measurement of this GPU; the MoE expert-GEMM scale on a GPU with no fused-MoE fit rows of its
own: the value fitted on the GPUs that have them, :func:`moe_assumed_note`), ``shared`` (one
value for every GPU, fitted or sourced once: the CPU overheads, the custom all-reduce) and
``default`` (a constant of :class:`~sim.costs.roofline_params.RooflineParams` no fit sets).
Invariants: every field of ``RooflineParams`` gets exactly one kind; a GPU listed by
:func:`~sim.costs.roofline_params.fitted_gpus` has at least one ``fitted`` term, any other GPU
none.
"""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from importlib import resources

from .roofline_params import KERNEL_FIT, RooflineParams

KINDS = ("fitted", "assumed", "shared", "default")


def _load(name):
    return json.loads(resources.files("sim").joinpath("data", name).read_text())


def provenance(gpu_key: str) -> dict:
    """``{term: (kind, note)}`` for every ``RooflineParams`` field on ``gpu_key`` ("h100",
    "mi300x", ... as ``RooflineCost.gpu_key``)."""
    return dict(_provenance(gpu_key))


@lru_cache(maxsize=None)  # (the package's data files: read once per GPU, not per cost model)
def _provenance(gpu_key: str) -> tuple:
    fit = _load("roofline_fit.json")
    fits = fit.get("params", {})
    shared = {**fit.get("shared", {}), **_load("moe_fit.json").get("shared", {})}
    own = fits.get(gpu_key, {})
    kernels = _load(KERNEL_FIT).get("params", {}).get(gpu_key, {})
    moe = _load("moe_fit.json")
    moe_own = moe.get("params", {}).get(gpu_key, {})
    out = {}
    for f in dataclasses.fields(RooflineParams):
        if kernels.get(f.name) is not None:
            out[f.name] = ("fitted", f"fitted to {gpu_key}'s published kernel timings "
                                     f"(gpu_kernels.csv)")
        elif own.get(f.name) is not None:
            out[f.name] = ("fitted", f"fitted to {gpu_key}'s kernel timings")
        elif moe_own.get(f.name) is not None:
            out[f.name] = ("fitted", f"fitted to {gpu_key}'s published fused-MoE kernel "
                                     f"timings (moe_kernels.csv)")
        elif f.name in moe.get("shared", {}):
            out[f.name] = ("assumed", moe_assumed_note(gpu_key))
        elif f.name in shared:
            out[f.name] = ("shared", "one value for every GPU (roofline_fit/moe_fit 'shared')")
        else:
            donors = sorted(g for g, p in fits.items() if p.get(f.name) is not None)
            out[f.name] = (("assumed", f"no {gpu_key} measurement: mean of {', '.join(donors)}")
                           if donors else ("default", "RooflineParams default, not fitted"))
    return tuple(out.items())


def counts(gpu_key: str) -> dict:
    """How many terms of each kind ``gpu_key`` has."""
    kinds = [k for k, _ in provenance(gpu_key).values()]
    return {k: kinds.count(k) for k in KINDS}


def fitted_terms(gpu_key: str) -> tuple:
    """The names of ``gpu_key``'s ``fitted`` terms, in field order."""
    return tuple(t for t, (kind, _) in provenance(gpu_key).items() if kind == "fitted")


def summary_line(gpu_key: str) -> str:
    """One line for a run's report: ``"fitted 9, assumed 3, shared 5, default 7 (mi300x)"``."""
    c = counts(gpu_key)
    return ", ".join(f"{k} {c[k]}" for k in KINDS) + f" ({gpu_key})"


def moe_assumed_note(gpu_key: str) -> str:
    """Why ``gpu_key``'s ``moe_gemm_compute_scale`` is assumed: which GPUs it was fitted on and
    what, if anything, the kernel rows hold of this GPU (``moe_fit.json``'s ``report``)."""
    moe = _load("moe_fit.json")
    donors = ", ".join(sorted(moe.get("params", {}))) or "no GPU"
    held = sum(r["rows"] for r in moe.get("report", []) if r["gpu"] == gpu_key)
    seen = (f"; its {held} fused-MoE rows are memory-bound or held out, no fit" if held
            else f"; no {gpu_key} fused-MoE kernel timing found")
    return f"no {gpu_key} fit: the value fitted on {donors}'s fused-MoE timings{seen}"


def moe_note(cost) -> str | None:
    """A run's line when a MoE model's expert GEMMs use an assumed scale on this GPU (None: a
    dense model, or the scale fitted to this GPU's own fused-MoE timings)."""
    model, params = getattr(cost, "model", None), getattr(cost, "params", None)
    if not getattr(model, "is_moe", False) or params is None:
        return None
    kind, note = provenance(cost.gpu_key)["moe_gemm_compute_scale"]
    if kind != "assumed":
        return None
    return (f"MoE expert GEMMs at moe_gemm_compute_scale "
            f"{params.moe_gemm_compute_scale:g}, assumed on {cost.gpu.name} ({note})")
