"""The TOML a plan writes for its winner (``winner.toml``, :mod:`sim.cli.plan` and
:mod:`sim.cli.plan_day`): settings as TOML text, values as plain Python, and the files as
absolute paths, so that the file runs from any folder."""

from __future__ import annotations

import json
from pathlib import Path


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def to_toml(settings) -> str:
    """``settings`` (key -> scalar, list or a one-level table) as TOML text."""
    top = [f"{k} = {_toml_value(v)}" for k, v in settings.items() if not isinstance(v, dict)]
    for k, v in settings.items():
        if isinstance(v, dict):
            top += ["", f"[{k}]"] + [f"{kk} = {_toml_value(vv)}" for kk, vv in v.items()]
    return "\n".join(top) + "\n"


def plain(v):
    """``v`` as a plain Python value (a numpy scalar's ``item()``), for TOML and messages."""
    return v.item() if hasattr(v, "item") else v


def absolute_paths(s, out) -> dict:
    """``s`` with its files (``workload``, ``profile``, a ``model`` config.json) as absolute
    paths and ``output`` the absolute ``out/winner``: a TOML file's relative path is read from
    the working directory, so a winner.toml of relative paths ran only from where the plan
    did (``cd out && sim run winner.toml`` found no workload)."""
    from workloads import trace_names
    for key in ("workload", "profile", "model"):
        value = s.get(key)
        if isinstance(value, str) and value.strip() and value not in trace_names() \
                and Path(value).exists():  # (a trace's name, a preset's: as they are)
            s[key] = str(Path(value).resolve())
    s["output"] = str((Path(out) / "winner").resolve())
    return s
