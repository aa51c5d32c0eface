"""Benchmark tools' result files read back: what ``vllm bench serve``, AIPerf / GenAI-Perf and
guidellm ran (the workload) and what they measured (their metrics, in their own names).

:func:`from_benchmark` tells the tool by the file's content and returns a
:class:`~workloads.benchmarks.common.Measured`. Imports only ``workloads`` (never ``sim``).
Modules: ``common`` (the record and shared checks), ``vllm``, ``aiperf``, ``guidellm`` (one
reader each; each docstring names the schema and the source version it follows).
"""

from __future__ import annotations

import json
import numbers
from pathlib import Path

from .aiperf import is_summary, read_records, read_summary
from .common import TOOLS, Measured, fail
from .guidellm import is_guidellm, read_guidellm
from .timescale import rescaled
from .vllm import is_vllm, read_vllm

__all__ = ["TOOLS", "Measured", "from_benchmark"]

# the names the tools (and ``sim run --format``) give their result files
_FILES = ("vllm-bench.json", "profile_export_aiperf.json", "profile_export.jsonl",
          "benchmarks.json")


def from_benchmark(path, index=None, time_scale=1.0) -> Measured:
    """The run a benchmark tool's result file describes: a ``vllm bench serve`` result JSON, an
    AIPerf/GenAI-Perf ``profile_export.jsonl`` or ``profile_export_aiperf.json``, a guidellm
    ``benchmarks.json`` (``index``: which benchmark of a sweep). ``time_scale``: the run was
    measured against ``sim serve --time-scale S``; its times are brought back to simulated
    time (:func:`~workloads.benchmarks.timescale.rescaled`). ``ValueError`` (one line naming
    the file and the field) for a file of none of these forms or with a bad field."""
    return rescaled(_read(path, index), time_scale)


def _read(path, index) -> Measured:
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a file path (str or Path), got {type(path).__name__}")
    if index is not None and (isinstance(index, bool) or not isinstance(index, numbers.Integral)):
        raise TypeError(f"index must be an integer (which benchmark of a guidellm sweep), got "
                        f"{index!r}")
    path = Path(path)
    if path.is_dir():
        inside = [n for n in _FILES if (path / n).is_file()]
        raise ValueError(f"{path}: a folder, not a result file"
                         + (f" (give one of its files: {', '.join(inside)})" if inside else ""))
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    if path.suffix == ".jsonl":
        return read_records(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        fail(path, f"line {e.lineno}", f"not JSON ({e.msg})")
    except UnicodeDecodeError:
        fail(path, "content", "not UTF-8 text")
    if is_guidellm(doc):
        return read_guidellm(doc, path, index)
    if index is not None:
        raise ValueError(f"{path}: index {index} is for a guidellm report of several "
                         f"benchmarks; this file holds one run")
    if is_vllm(doc):
        return read_vllm(doc, path)
    if is_summary(doc):
        return read_summary(doc, path)
    keys = ", ".join(list(doc)[:6]) if isinstance(doc, dict) else type(doc).__name__
    raise ValueError(f"{path}: not a vllm bench serve, AIPerf or guidellm result: no "
                     f"'completed' + 'request_throughput' + one of 'backend', 'endpoint_type', "
                     f"'num_prompts' (vllm), metric tables (AIPerf) or a 'benchmarks' list "
                     f"(guidellm) (it has {keys})")
