"""A run as AIPerf exports it: ``profile_export.jsonl`` (one record per request) and
``profile_export_aiperf.json`` (the summary).

Schema: ai-dynamo/aiperf db4f6397, ``docs/tutorials/working-with-profile-exports.md`` (a
record's ``metadata``, ``metrics`` as ``{"value", "unit"}``, ``error``) and
``aiperf/common/models/export_models.py`` (``JsonExportData``: a ``{"unit", "avg", "p1".."p99",
"min", "max", "std"}`` per metric, ``input_config``). Times are the simulated seconds as
nanoseconds (``request_start_ns`` = arrival, ``request_end_ns`` = finish; AIPerf's are epoch
times); a rejected request is an error record (code 400, its reason as the message, its prompt
as ``error_isl``), as AIPerf writes a failed request. ``request_ack_ns`` is null (no HTTP).
"""

from __future__ import annotations

import json

from .strict import clean, json_text
from .gaps import token_gaps
from .metrics import AIPERF_PCTS, aiperf_metrics

RECORDS = "profile_export.jsonl"
SUMMARY = "profile_export_aiperf.json"
UNITS = {"time_to_first_token": "ms", "request_latency": "ms", "inter_token_latency": "ms",
         "inter_chunk_latency": "ms", "output_token_throughput_per_user": "tokens/sec/user",
         "input_sequence_length": "tokens", "output_sequence_length": "tokens",
         "request_count": "requests", "benchmark_duration": "sec", "total_isl": "tokens",
         "total_osl": "tokens", "request_throughput": "requests/sec",
         "output_token_throughput": "tokens/sec"}
STATS = ("avg", *(f"p{q}" for q in AIPERF_PCTS), "min", "max", "std")


def _ns(seconds) -> int:
    return int(round(float(seconds) * 1e9))


def _record(i, row, gaps):
    meta = {"session_num": i, "x_request_id": str(row.request_id),
            "x_correlation_id": str(row.request_id), "conversation_id": str(row.request_id),
            "turn_index": 0, "request_start_ns": _ns(row.arrival_time), "request_ack_ns": None,
            "request_end_ns": None, "worker_id": "sim", "record_processor_id": "sim",
            "benchmark_phase": "profiling", "was_cancelled": False, "cancellation_time_ns": None}
    if row.status != "finished":
        meta["request_end_ns"] = meta["request_start_ns"]
        return {"metadata": meta,
                "metrics": {"error_isl": {"value": int(row.num_prompt_tokens), "unit": "tokens"}},
                "error": {"code": 400, "type": "RequestRejected", "message": str(row.reason)}}
    meta["request_end_ns"] = _ns(row.finish_time)
    n = int(row.num_output_tokens)
    metrics = {"input_sequence_length": {"value": int(row.num_prompt_tokens), "unit": "tokens"},
               "time_to_first_token": {"value": 1000 * row.ttft, "unit": "ms"},
               "request_latency": {"value": 1000 * row.e2e, "unit": "ms"},
               "output_token_count": {"value": n, "unit": "tokens"}}
    if n > 1:
        metrics["inter_chunk_latency"] = {"value": [1000 * g for g in gaps], "unit": "ms"}
    metrics["output_sequence_length"] = {"value": n, "unit": "tokens"}
    if n > 1:
        metrics["inter_token_latency"] = {"value": 1000 * row.tpot, "unit": "ms"}
        metrics["output_token_throughput_per_user"] = {"value": 1 / row.tpot,
                                                       "unit": "tokens/sec/user"}
    return {"metadata": meta, "metrics": metrics, "error": None}


def files(result, info) -> dict:
    gaps, _ = token_gaps(result)
    records = [json.dumps(clean(_record(i, row, g)), allow_nan=False)
               for i, (row, g) in enumerate(zip(result.requests.itertuples(), gaps))]
    m = aiperf_metrics(result)
    summary = {}
    for tag, unit in UNITS.items():
        stats = {s: m[f"{tag}.{s}"] for s in STATS if f"{tag}.{s}" in m}
        summary[tag] = {"unit": unit, **stats}
    summary["error_request_count"] = {"unit": "requests",
                                      "avg": int((result.requests["status"] != "finished")
                                                 .sum())}
    load = {"request_count": len(result.requests)}
    if info.get("concurrency") is not None:
        load["concurrency"] = info["concurrency"]
    elif info.get("rate"):
        load["request_rate"] = info["rate"]
    summary["input_config"] = {"endpoint": {"model_names": [info.get("model")]},
                               "loadgen": load}
    summary["was_cancelled"] = False
    summary["error_summary"] = []
    return {RECORDS: "".join(r + "\n" for r in records), SUMMARY: json_text(summary)}
