"""A run as ``vllm bench serve --save-result --save-detailed`` writes it: ``vllm-bench.json``.

Schema: vllm-project/vllm 009e6d4a, ``vllm/benchmarks/serve.py`` (``main_async``'s
``result_json``: settings, then ``benchmark()``'s ``result``, then the per-metric statistics of
``process_one_metric`` with ``--percentile-metrics ttft,tpot,itl,e2el`` and the default
``--metric-percentiles 99``). ``backend`` is ``"sim"``; ``start_times`` are the arrivals
(simulated seconds, not ``perf_counter``); a rejected request is a failed one, its ``errors``
entry its reason, its output length, TTFT and latency 0 as vLLM's defaults; ``queue_times``
are 0 (no client-side queue); ``generated_texts`` empty strings. ``max_output_tokens_per_s``
and ``max_concurrent_requests`` follow ``calculate_metrics``: tokens per one-second bucket from
the first start, and the peak of overlapping [start, end) intervals.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np

from .strict import json_text
from .gaps import token_gaps
from .metrics import vllm_metrics

FILE = "vllm-bench.json"


def _peaks(starts, ttfts, itls, latencies):
    """vLLM's ``max_output_tokens_per_s`` and ``max_concurrent_requests`` (successful
    requests)."""
    if not len(starts):
        return 0.0, 0
    t0 = min(starts)
    end = max(s + lat for s, lat in zip(starts, latencies))
    buckets = np.zeros(int(np.ceil(end - t0)) + 1)
    for s, ttft, gaps in zip(starts, ttfts, itls):
        times = s + ttft + np.concatenate([[0.0], np.cumsum(gaps)])
        idx = (times - t0).astype(np.int64)
        np.add.at(buckets, idx[(idx >= 0) & (idx < len(buckets))], 1)
    events = sorted([(s, 1) for s in starts] + [(s + lat, -1) for s, lat in zip(starts,
                                                                               latencies)])
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    return float(buckets.max()), peak


def files(result, info) -> dict:
    req = result.requests
    gaps, _ = token_gaps(result)
    ok = (req["status"] == "finished").to_numpy()
    zero = lambda col: np.where(ok, req[col].to_numpy(dtype=np.float64), 0.0)  # noqa: E731
    starts = req["arrival_time"].to_numpy(dtype=np.float64)
    ttfts, latencies = zero("ttft"), zero("e2e")
    itls = [g.tolist() for g in gaps]
    peak_tokens, peak_requests = _peaks(starts[ok], ttfts[ok], [itls[i] for i in
                                                                np.flatnonzero(ok)],
                                        latencies[ok])
    rate, users = info.get("rate"), info.get("concurrency")
    doc = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), "endpoint_type": "sim",
           "backend": "sim", "label": None, "model_id": info.get("model"),
           "tokenizer_id": None, "num_prompts": len(req),
           "request_rate": rate if rate else "inf",  # (a closed loop's users: no rate)
           "burstiness": info.get("burstiness") or 1.0,
           "max_concurrency": users}
    m = vllm_metrics(result, percentiles=(99,))
    doc.update({"duration": m["duration"], "completed": int(m["completed"]),
                "failed": int(m["failed"]), "total_input_tokens": int(m["total_input_tokens"]),
                "total_output_tokens": int(m["total_output_tokens"]),
                "request_throughput": m["request_throughput"], "request_goodput": None,
                "output_throughput": m["output_throughput"],
                "total_token_throughput": m["total_token_throughput"],
                "input_lens": req["num_prompt_tokens"].tolist(),
                "output_lens": np.where(ok, req["num_output_tokens"], 0).tolist(),
                "ttfts": ttfts, "itls": itls, "latencies": latencies,
                "start_times": starts, "queue_times": [0.0] * len(req),
                "generated_texts": [""] * len(req),
                "errors": ["" if good else str(reason) for good, reason in
                           zip(ok, req["reason"].tolist())],
                "max_output_tokens_per_s": peak_tokens, "max_concurrent_requests": peak_requests,
                "rtfx": 0.0})
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p99"):
            key = f"{stat}_{name}_ms"
            doc[key] = m[key]
    return {FILE: json_text(doc)}
