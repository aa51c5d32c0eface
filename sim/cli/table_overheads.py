"""The engine-overheads setting, appended to the settings table (:data:`sim.cli.table.SETTINGS`).

``--engine-overheads`` / TOML ``engine_overheads`` -> ``SimConfig.engine_overheads``
(:mod:`sim.engine.engine_overheads`): ``none`` (default), ``fitted`` (the sglang or vllm
preset's terms from ``sim/data/engine_overheads.json``), ``auto`` (fitted where the
scheduler has fitted terms, none elsewhere), or the four terms written out,
``REQUEST_MS,ITER_US,SEQ_US,sync|overlap``. Which engine has fitted terms is the config's
check (an error naming the scheduler).
"""

from __future__ import annotations

import math

from .setting import Setting as S

SPEC = "REQUEST_MS,ITER_US,SEQ_US,sync|overlap"


def engine_overheads(shown, value):
    """``none`` / ``fitted`` / ``auto`` (any case) or :data:`SPEC` -> an ``EngineOverheads``."""
    if not isinstance(value, str):
        raise ValueError(f"{shown} must be none, fitted, auto or {SPEC}, got {value!r}")
    name = value.strip().lower()
    if name in ("none", "off", "fitted", "auto"):
        return "none" if name == "off" else name
    parts = [p.strip() for p in name.split(",")]
    if len(parts) != 4 or parts[3] not in ("sync", "overlap"):
        raise ValueError(f"{shown} must be none, fitted, auto or {SPEC}, got {value!r}")
    try:
        ms, iter_us, seq_us = (float(p) for p in parts[:3])
    except ValueError:
        raise ValueError(f"{shown} {value!r}: the three times must be numbers "
                         f"({SPEC})") from None
    for term, text, x in zip(SPEC.split(",")[:3], parts, (ms, iter_us, seq_us)):
        if not (math.isfinite(x) and x >= 0):  # (in the unit written, not seconds)
            raise ValueError(f"{shown} {value!r}: {term} must be a finite number >= 0, got "
                             f"{text}")
    from ..costs.overheads import EngineOverheads
    try:
        return EngineOverheads(per_request_s=ms * 1e-3, per_iter_s=iter_us * 1e-6,
                               per_seq_s=seq_us * 1e-6, overlap=parts[3] == "overlap",
                               source=f"given: {value}")
    except ValueError as e:
        raise ValueError(f"{shown} {value!r}: {e}") from None


ROWS = (
    S("engine_overheads", ("--engine-overheads",), metavar="SPEC", check=engine_overheads,
      help="the engine's time outside the roofline: none; fitted (the sglang or vllm "
           "preset's terms, fitted on sim/data/validation_runs.csv: per request, seen on "
           "TTFT and E2E, and CPU time per sequence per iteration, added to the GPU's step "
           f"or overlapped with it); auto (fitted where the scheduler has such terms, none "
           f"elsewhere); or {SPEC}",
      default_help="default none", kind=f"none | fitted | auto | {SPEC}"),
)
