"""A fit profile: the roofline with its efficiencies scaled and its per-iteration overhead set to
values ``sim fit`` found against a user's own measured runs.

The profile (:data:`FIT_FORMAT`, a JSON object ``sim fit`` writes and ``sim run --profile``
reads) holds three terms (:data:`TERMS`) applied to the fitted roofline terms of the run's GPU
(:func:`~sim.costs.roofline_params.fitted_params`):

- ``compute_eff_scale``: multiplies every compute efficiency (the GEMMs' at fp16 and FP8, the
  prefill attention's at fp16 and FP8);
- ``memory_eff_scale``: multiplies every bandwidth efficiency (the GEMMs' weight reads, the
  decode attention's KV reads, the elementwise ops');
- ``overhead_s``: the engine's CPU time per iteration (replaces the roofline's).

Invariants: a scaled efficiency is capped at 1 (no kernel runs above the peak; a scale past
``1 / efficiency`` changes nothing more), so every :class:`~sim.costs.roofline.RooflineParams`
check holds; scales 1 and the roofline's own ``overhead_s`` give the unfitted roofline bit for
bit; every term is checked (a scale > 0, an overhead >= 0) with a one-line error naming the
profile and the field. The cost model stays a :class:`~sim.costs.roofline.RooflineCost` (its
memo, CUDA-graph rule and fast-forward path unchanged).
"""

from __future__ import annotations

import dataclasses
import math

from .roofline import RooflineCost
from .roofline_params import RooflineParams

FIT_FORMAT = "llm-serving-sim fit profile v1"
TERMS = ("compute_eff_scale", "memory_eff_scale", "overhead_s")
COMPUTE_EFFS = ("gemm_compute_eff", "fp8_gemm_compute_eff", "attn_prefill_compute_eff",
                "attn_prefill_fp8_compute_eff")
MEMORY_EFFS = ("gemm_memory_eff", "attn_decode_memory_eff")


def is_fit_profile(doc) -> bool:
    return isinstance(doc, dict) and doc.get("format") == FIT_FORMAT


def _capped(value, scale):
    return None if value is None else min(1.0, value * scale)


def scaled_params(base: RooflineParams, compute_eff_scale=1.0, memory_eff_scale=1.0,
                  overhead_s=None) -> RooflineParams:
    """``base`` with its compute and bandwidth efficiencies multiplied (each capped at 1) and
    its per-iteration overhead set (``None``: ``base``'s); scales 1 and no overhead: ``base``
    itself."""
    for name, v in (("compute_eff_scale", compute_eff_scale),
                    ("memory_eff_scale", memory_eff_scale)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a number > 0, got {v!r}")
    if compute_eff_scale == 1 and memory_eff_scale == 1 and overhead_s is None:
        return base
    change = {f: _capped(getattr(base, f), compute_eff_scale) for f in COMPUTE_EFFS}
    change.update({f: _capped(getattr(base, f), memory_eff_scale) for f in MEMORY_EFFS})
    change["elementwise_eff"] = {op: _capped(e, memory_eff_scale)
                                 for op, e in base.elementwise_eff.items()}
    if overhead_s is not None:
        change["overhead_s"] = overhead_s  # (RooflineParams checks it: >= 0)
    return dataclasses.replace(base, **change)


def profile_terms(doc, where="profile") -> dict:
    """The checked :data:`TERMS` of a fit profile (``where`` names it in an error)."""
    if not is_fit_profile(doc):
        raise ValueError(f"{where}: format: not a fit profile (format "
                         f"{doc.get('format') if isinstance(doc, dict) else None!r})")
    terms = doc.get("terms")
    if not isinstance(terms, dict):
        raise ValueError(f"{where}: terms: must be an object with {', '.join(TERMS)}")
    out = {}
    for k in TERMS:
        v = terms.get(k)
        low = 0.0 if k == "overhead_s" else None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (
                v < 0 if low is not None else v <= 0):
            raise ValueError(f"{where}: terms.{k}: must be a number "
                             f"{'>= 0' if low is not None else '> 0'}, got {v!r}")
        out[k] = float(v)
    return out


def fitted_roofline(terms: dict, model, gpu, *, tensor_parallel=1, weight_dtype="fp16",
                    kv_dtype="fp16", activation_dtype=None, expert_parallel=1,
                    expert_skew=0.0, attention_dp=1, expert_weight_dtype=None) -> RooflineCost:
    """The roofline of ``model`` on ``gpu`` with the fit's ``terms`` applied (see the module
    docstring); ``attention_dp`` > 1: :class:`~sim.costs.dp_attention.DPAttentionCost`."""
    from .dp_attention import DPAttentionCost
    cls = DPAttentionCost if attention_dp > 1 else RooflineCost
    same = dict(tensor_parallel=tensor_parallel, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                activation_dtype=activation_dtype, expert_parallel=expert_parallel,
                expert_skew=expert_skew, attention_dp=attention_dp,
                expert_weight_dtype=expert_weight_dtype)
    base = cls(model, gpu, **same)
    params = scaled_params(base.params, terms["compute_eff_scale"], terms["memory_eff_scale"],
                           terms["overhead_s"])
    if params is base.params:
        return base
    return cls(model, gpu, params=params, **same)
