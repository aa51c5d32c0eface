"""AIPerf (and GenAI-Perf) profile exports: ``profile_export.jsonl``, one record per request,
and ``profile_export_aiperf.json``, the run's summary.

Schema followed: ai-dynamo/aiperf (commit db4f6397, October 2025):
``docs/tutorials/working-with-profile-exports.md``, ``aiperf/common/models/record_models.py``
and ``aiperf/common/models/export_models.py`` (``JsonExportData``, which mimics GenAI-Perf's
``profile_export_genai_perf.json``). A JSONL record is ``{"metadata": {"request_start_ns",
"request_end_ns", ...}, "metrics": {tag: {"value", "unit"}}, "error": null | {...}}``; the
summary holds one ``{"unit", "avg", "p1".."p99", "min", "max", "std"}`` per metric tag, plus
``input_config`` (``loadgen.concurrency``, ``loadgen.request_rate``, ``loadgen.request_count``;
AIPerf 0.13.0, checked by running it against ``sim serve``: ``phases``, each with ``kind``,
``type`` - ``concurrency`` or a rate type -, ``concurrency``, ``rate``, ``requests``).

AIPerf's definitions (``aiperf/metrics/types/``): ``time_to_first_token``, ``request_latency``
(ms); ``inter_token_latency`` = (request_latency - TTFT) / (OSL - 1) per request (vLLM's TPOT);
``inter_chunk_latency`` the gaps between chunks; ``benchmark_duration`` = last response - first
request; ``request_throughput`` = valid requests / duration, ``output_token_throughput`` = total
OSL / duration; statistics numpy's mean, population std and linear percentiles
(``aiperf/metrics/metric_dicts.py``). Metrics here are ``"<tag>.<stat>"`` (``"time_to_first
_token.p99"``); a derived metric's single value is its ``.avg``, as in the summary file.

The workload: from the records (a summary file reads its ``profile_export.jsonl`` beside it when
there is one), each successful request arriving at its ``request_start_ns``; else rebuilt from
``input_config`` and the mean ISL and OSL (``per_request`` False).
"""

from __future__ import annotations

import json
from pathlib import Path

from .common import Measured, count, describe_stats, fail, number, rebuilt, workload

TOOL = "aiperf"
RECORDS_FILE = "profile_export.jsonl"
STATS = {"mean": "avg", "min": "min", "max": "max", "std": "std"}
PCTS = {f"p{q}": q for q in (1, 5, 10, 25, 50, 75, 90, 95, 99)}
SUMMARY_STATS = ("avg", *PCTS, "min", "max", "std")
TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "sec": 1e3, "s": 1e3}
RECORD_METRICS = ("time_to_first_token", "request_latency", "inter_token_latency",
                  "output_token_throughput_per_user", "input_sequence_length",
                  "output_sequence_length")


def is_summary(doc) -> bool:
    return isinstance(doc, dict) and ("input_config" in doc or any(
        isinstance(v, dict) and "unit" in v and "avg" in v for v in doc.values()))


def _value(rec, tag, path, where):
    m = rec["metrics"].get(tag)
    if not isinstance(m, dict) or "value" not in m:
        fail(path, f"{where}.metrics.{tag}", "missing (each record needs its value and unit)")
    unit = m.get("unit", "")
    if isinstance(m["value"], list):
        vals = [number(x, path, f"{where}.metrics.{tag}.value") for x in m["value"]]
        return [x * TO_MS.get(unit, 1.0) for x in vals]
    return number(m["value"], path, f"{where}.metrics.{tag}.value") * TO_MS.get(unit, 1.0)


def records_of(path):
    """The JSON objects of a JSONL file, each checked to be a record."""
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                fail(path, f"line {i}", f"not JSON ({e.msg})")
            if not isinstance(rec, dict) or not isinstance(rec.get("metadata"), dict) \
                    or not isinstance(rec.get("metrics"), (dict, type(None))):
                fail(path, f"line {i}", "not an AIPerf record (needs metadata and metrics)")
            out.append((i, rec))
    if not out:
        fail(path, "records", "the file holds no record")
    return out


def _from_records(path):
    """(workload, metrics, failed) of a records file, the metrics as AIPerf defines them."""
    good, failed = [], 0
    for i, rec in records_of(path):
        if rec.get("error") is not None or not rec.get("metrics"):
            failed += 1
            continue
        good.append((f"line {i}", rec))
    values = {tag: [] for tag in RECORD_METRICS}
    chunks, starts, ends = [], [], []
    for where, rec in good:
        meta = rec["metadata"]
        starts.append(number(meta.get("request_start_ns"), path,
                             f"{where}.metadata.request_start_ns"))
        ends.append(number(meta.get("request_end_ns"), path, f"{where}.metadata.request_end_ns"))
        for tag in RECORD_METRICS:
            if tag in rec["metrics"] or tag in ("input_sequence_length",
                                                "output_sequence_length"):
                values[tag].append(_value(rec, tag, path, where))
        if "inter_chunk_latency" in rec["metrics"]:
            chunks += _value(rec, "inter_chunk_latency", path, where)
    prompts = [count(v, path, "input_sequence_length", minimum=1)
               for v in values["input_sequence_length"]]
    outputs = [count(v, path, "output_sequence_length", minimum=1)
               for v in values["output_sequence_length"]]
    df = workload([s / 1e9 for s in starts], prompts, outputs, path)
    metrics = {}
    for tag, vals in (*values.items(), ("inter_chunk_latency", chunks)):
        if vals:
            for stat, v in describe_stats(vals, STATS, PCTS).items():
                metrics[f"{tag}.{stat}"] = v
    duration = (max(ends) - min(starts)) / 1e9
    metrics["request_count.avg"] = float(len(good))
    metrics["benchmark_duration.avg"] = duration
    metrics["total_isl.avg"] = float(sum(prompts))
    metrics["total_osl.avg"] = float(sum(outputs))
    metrics["request_throughput.avg"] = len(good) / duration if duration > 0 else float("nan")
    metrics["output_token_throughput.avg"] = (sum(outputs) / duration if duration > 0
                                              else float("nan"))
    return df, metrics, failed


def read_records(path) -> Measured:
    df, metrics, failed = _from_records(path)
    return Measured(TOOL, df, metrics, str(path), None, None, True, failed,
                    ("replayed open loop at the records' request_start_ns (a JSONL file does "
                     "not say the concurrency the run held)",))


def _profiling_phase(phases, path):
    """AIPerf 0.13's ``input_config.phases``: (concurrency, rate, requests) of the profiling
    phase (``kind`` "profiling"; a warmup phase is not measured). A ``concurrency`` phase is a
    closed loop; a rate phase (``poisson``, ``gamma``, ``constant``, ...) an open loop at
    ``rate``, its ``concurrency`` only a cap (the send times are replayed)."""
    if not isinstance(phases, list) or not all(isinstance(p, dict) for p in phases):
        fail(path, "input_config.phases", "must be a list of objects")
    found = [(i, p) for i, p in enumerate(phases) if p.get("kind", "profiling") == "profiling"]
    if not found:
        fail(path, "input_config.phases", "no phase of kind 'profiling'")
    i, phase = found[-1]
    where = f"input_config.phases[{i}]"
    if phase.get("type") == "concurrency":
        return (count(phase.get("concurrency"), path, f"{where}.concurrency", minimum=1), None,
                phase.get("requests"))
    rate = number(phase.get("rate"), path, f"{where}.rate", allow_none=True)
    return None, rate, phase.get("requests")


def _loadgen(doc, path):
    cfg = doc.get("input_config") or {}
    if not isinstance(cfg, dict):
        fail(path, "input_config", "must be an object")
    if "phases" in cfg and "loadgen" not in cfg:
        return _profiling_phase(cfg["phases"], path)
    load = cfg.get("loadgen") or {}
    if not isinstance(load, dict):
        fail(path, "input_config.loadgen", "must be an object")
    concurrency = load.get("concurrency")
    if concurrency is not None:
        concurrency = count(concurrency, path, "input_config.loadgen.concurrency", minimum=1)
    rate = number(load.get("request_rate"), path, "input_config.loadgen.request_rate",
                  allow_none=True)
    return concurrency, rate, load.get("request_count")


def read_summary(doc, path) -> Measured:
    metrics = {}
    for tag, value in doc.items():
        if isinstance(value, dict) and "unit" in value:
            for stat in SUMMARY_STATS:
                if value.get(stat) is not None:
                    metrics[f"{tag}.{stat}"] = number(value[stat], path, f"{tag}.{stat}")
    if not metrics:
        fail(path, "metrics", "no metric of the form {\"unit\": ..., \"avg\": ...}")
    concurrency, rate, n = _loadgen(doc, path)
    notes = []
    if concurrency is None and rate is None:
        concurrency = 1
        notes.append("input_config sets neither concurrency nor request_rate: concurrency 1")
    records = Path(path).with_name(RECORDS_FILE)
    if records.exists():
        df, _, failed = _from_records(records)
        notes.append(f"per-request workload from {records}")
        return Measured(TOOL, df, metrics, str(path), concurrency, rate, True, failed,
                        tuple(notes))
    for tag in ("input_sequence_length.avg", "output_sequence_length.avg"):
        if tag not in metrics:
            fail(path, tag.split(".")[0], f"missing, and no {RECORDS_FILE} beside the file: "
                                          f"the workload's lengths are unknown")
    if "request_count.avg" in metrics:
        n = metrics["request_count.avg"]
    n = count(n if n is not None else 10, path, "request_count", minimum=1)
    df = rebuilt(n, metrics["input_sequence_length.avg"], metrics["output_sequence_length.avg"],
                 rate, path)
    notes.append(f"no {RECORDS_FILE} beside the file: the workload is {n} requests of the mean "
                 f"ISL and OSL" + (f", evenly spaced at {rate:g} req/s" if rate else ""))
    failed = metrics.get("error_request_count.avg", 0.0)
    return Measured(TOOL, df, metrics, str(path), concurrency, rate, False, int(failed),
                    tuple(notes))
