"""The engine-overheads setting, appended to the settings table (:data:`sim.cli.table.SETTINGS`).

``--engine-overheads`` / TOML ``engine_overheads`` -> ``SimConfig.engine_overheads``
(:mod:`sim.engine.engine_overheads`): ``none`` (default), ``fitted`` (the sglang or vllm
preset's terms from ``sim/data/engine_overheads.json``), ``auto`` (fitted where the
scheduler has fitted terms, none elsewhere), or the four terms written out,
``REQUEST_MS,ITER_US,SEQ_US,sync|overlap``, optionally followed by ``NAME=VALUE`` terms
(:data:`EXTRAS`: ``request_layer_ms``, ``prefill_iter_ms``, ``host_layer_ms``,
``host_launch_us``, each one field of ``EngineOverheads`` in the unit its name says). Which
engine has fitted terms is the config's check (an error naming the scheduler).
"""

from __future__ import annotations

import math

from .setting import Setting as S

SPEC = "REQUEST_MS,ITER_US,SEQ_US,sync|overlap[,NAME=VALUE...]"
# the optional terms after the four: name in the spec -> (EngineOverheads field, unit in s)
EXTRAS = {"request_layer_ms": ("per_request_layer_s", 1e-3),
          "prefill_iter_ms": ("per_prefill_iter_s", 1e-3),
          "host_layer_ms": ("prefill_host_layer_s", 1e-3),
          "host_launch_us": ("prefill_host_launch_s", 1e-6)}


def _number(shown, value, term, text) -> float:
    try:
        x = float(text)
    except ValueError:
        raise ValueError(f"{shown} {value!r}: {term} must be a number ({SPEC}), got "
                         f"{text!r}") from None
    if not (math.isfinite(x) and x >= 0):  # (in the unit written, not seconds)
        raise ValueError(f"{shown} {value!r}: {term} must be a finite number >= 0, got {text}")
    return x


def _extras(shown, value, parts) -> dict:
    """The optional ``NAME=VALUE`` terms (:data:`EXTRAS`) -> EngineOverheads fields."""
    out = {}
    for part in parts:
        name, eq, text = (x.strip() for x in part.partition("="))
        if not eq or name not in EXTRAS:
            raise ValueError(f"{shown} {value!r}: {part!r} must be NAME=VALUE with NAME one "
                             f"of {', '.join(EXTRAS)}")
        if EXTRAS[name][0] in out:
            raise ValueError(f"{shown} {value!r}: {name} given twice")
        field, unit = EXTRAS[name]
        out[field] = _number(shown, value, name, text) * unit
    return out


def engine_overheads(shown, value):
    """``none`` / ``fitted`` / ``auto`` (any case) or :data:`SPEC` -> an ``EngineOverheads``."""
    if not isinstance(value, str):
        raise ValueError(f"{shown} must be none, fitted, auto or {SPEC}, got {value!r}")
    name = value.strip().lower()
    if name in ("none", "off", "fitted", "auto"):
        return "none" if name == "off" else name
    parts = [p.strip() for p in name.split(",")]
    if len(parts) < 4 or parts[3] not in ("sync", "overlap"):
        raise ValueError(f"{shown} must be none, fitted, auto or {SPEC}, got {value!r}")
    ms, iter_us, seq_us = (_number(shown, value, term, text) for term, text in
                           zip(("REQUEST_MS", "ITER_US", "SEQ_US"), parts[:3]))
    extras = _extras(shown, value, parts[4:])
    from ..costs.overheads import EngineOverheads
    try:
        return EngineOverheads(per_request_s=ms * 1e-3, per_iter_s=iter_us * 1e-6,
                               per_seq_s=seq_us * 1e-6, overlap=parts[3] == "overlap",
                               source=f"given: {value}", **extras)
    except ValueError as e:
        raise ValueError(f"{shown} {value!r}: {e}") from None


ROWS = (
    S("engine_overheads", ("--engine-overheads",), metavar="SPEC", check=engine_overheads,
      help="the engine's time outside the roofline: none; fitted (the sglang or vllm "
           "preset's terms, fitted on sim/data/validation_runs.csv: per request, seen on "
           "TTFT and E2E, and CPU time per sequence per iteration, added to the GPU's step "
           f"or overlapped with it); auto (fitted where the scheduler has such terms, none "
           f"elsewhere); or {SPEC}, NAME one of {', '.join(EXTRAS)}",
      default_help="default none", kind=f"none | fitted | auto | {SPEC}"),
)
