"""A run as guidellm reports it: ``benchmarks.json``, one benchmark.

Schema: vllm-project/guidellm ee7a7745: ``GenerativeBenchmarksReport`` (``metadata`` version
2, ``config``, ``benchmarks``), ``GenerativeBenchmark`` (``config.strategy``, ``metrics``,
``requests`` by status, ``start_time``, ``end_time``, ``duration``), each metric a
``StatusDistributionSummary`` (``successful``, ``incomplete``, ``errored``, ``total``) of
``DistributionSummary`` (``mean``, ``median``, ``mode``, ``variance``, ``std_dev``, ``min``,
``max``, ``count``, ``total_sum``, ``percentiles`` p001..p999, ``pdf`` null), and each request a
``GenerativeRequestStats`` with its serialised computed fields. The strategy: a closed loop is
``concurrent`` with ``streams`` users; an open loop ``trace`` (guidellm's replay of timed
requests). Times are simulated seconds (guidellm's are epoch seconds); a rejected request is
errored. The rates (``requests_per_second`` ...) are one value each, the window's mean: guidellm
keeps a distribution over time there, which a file from here does not fake.
"""

from __future__ import annotations

import numpy as np

from .strict import json_text
from .metrics import GUIDELLM_PCTS, guidellm_metrics

FILE = "benchmarks.json"
SERIES = ("request_latency", "prompt_token_count", "output_token_count", "total_token_count",
          "time_to_first_token_ms", "time_per_output_token_ms", "inter_token_latency_ms")
RATES = ("requests_per_second", "output_tokens_per_second", "tokens_per_second")


def distribution(values) -> dict:
    v = np.asarray(values, dtype=np.float64)
    if not v.size:
        return {"mean": 0.0, "median": 0.0, "mode": 0.0, "variance": 0.0, "std_dev": 0.0,
                "min": 0.0, "max": 0.0, "count": 0, "total_sum": 0.0,
                "percentiles": dict.fromkeys(GUIDELLM_PCTS, 0.0), "pdf": None}
    uniq, counts = np.unique(v, return_counts=True)
    return {"mean": float(v.mean()), "median": float(np.median(v)),
            "mode": float(uniq[np.argmax(counts)]), "variance": float(v.var()),
            "std_dev": float(v.std()), "min": float(v.min()), "max": float(v.max()),
            "count": int(v.size), "total_sum": float(v.sum()),
            "percentiles": {k: float(np.percentile(v, q)) for k, q in GUIDELLM_PCTS.items()},
            "pdf": None}


def _status(values) -> dict:
    d = distribution(values)
    return {"successful": d, "incomplete": distribution([]), "errored": distribution([]),
            "total": d}


def _request(row):
    first = row.first_token_time
    last = row.finish_time
    n = int(row.num_output_tokens)
    p = int(row.num_prompt_tokens)
    base = {"type_": "generative_request_stats", "request_id": str(row.request_id),
            "response_id": None, "request_args": None, "output": None, "reasoning_output": None,
            "tool_calls": None,
            "input_metrics": {"text_tokens": p, "total_tokens": p}}
    start = float(row.arrival_time)
    if row.status != "finished":
        base["info"] = {"timings": {"request_start": start, "request_end": start,
                                    "resolve_end": start, "token_iterations": 0,
                                    "request_iterations": 0}, "error": str(row.reason)}
        base["output_metrics"] = {"text_tokens": None, "total_tokens": None}
        base.update({"request_start_time": start, "request_end_time": start,
                     "request_latency": 0.0, "prompt_tokens": p, "output_tokens": None})
        return base
    base["info"] = {"timings": {"request_start": start, "first_token_iteration": first,
                                "last_token_iteration": last, "token_iterations": n,
                                "request_iterations": n, "request_end": last,
                                "resolve_end": last}}
    base["output_metrics"] = {"text_tokens": n, "total_tokens": n}
    base.update({"request_start_time": start, "request_end_time": last,
                 "request_latency": last - start, "prompt_tokens": p, "output_tokens": n,
                 "total_tokens": p + n, "time_to_first_token_ms": 1000 * row.ttft,
                 "time_per_output_token_ms": 1000 * row.tpot_incl_ttft,
                 "inter_token_latency_ms": 1000 * row.tpot if n > 1 else None})
    return base


def files(result, info) -> dict:
    req = result.requests
    fin = req[req["status"] == "finished"]
    m = guidellm_metrics(result)
    n = fin["num_output_tokens"].to_numpy()
    values = {"request_latency": fin["e2e"], "prompt_token_count": fin["num_prompt_tokens"],
              "output_token_count": n, "total_token_count": fin["num_prompt_tokens"] + n,
              "time_to_first_token_ms": fin["ttft"] * 1000,
              "time_per_output_token_ms": fin["tpot_incl_ttft"] * 1000,
              "inter_token_latency_ms": np.where(n > 1, fin["tpot"].fillna(0.0), 0.0) * 1000}
    metrics = {"request_totals": {k: int(m[f"request_totals.{k}"])
                                  for k in ("successful", "incomplete", "errored", "total")}}
    metrics.update({name: _status(values[name]) for name in SERIES})
    metrics.update({name: _status([m[f"{name}.mean"]]) for name in RATES})
    users = info.get("concurrency")
    strategy = ({"type_": "concurrent", "streams": users} if users is not None
                else {"type_": "trace"})
    start = float(req["arrival_time"].min())
    rows = [_request(row) for row in req.itertuples()]
    bench = {"type_": "generative_benchmark", "id_": "sim-0", "run_id": "sim", "run_index": 0,
             "config": {"strategy": strategy, "constraints": {}},
             "metrics": metrics,
             "requests": {"successful": [r for r, ok in zip(rows, req["status"] == "finished")
                                         if ok],
                          "incomplete": [],
                          "errored": [r for r, ok in zip(rows, req["status"] == "finished")
                                      if not ok]},
             "start_time": start, "end_time": start + m["duration"], "duration": m["duration"]}
    report = {"metadata": {"version": 2, "guidellm_version": "sim", "python_version": None,
                           "platform": None},
              "config": {"target": "sim", "profile": strategy["type_"],
                         "model": info.get("model")},
              "benchmarks": [bench]}
    return {FILE: json_text(report)}
