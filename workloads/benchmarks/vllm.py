"""``vllm bench serve`` result files (``--save-result``; per-request lists with
``--save-detailed``).

Schema followed: vLLM's ``vllm/benchmarks/serve.py`` (vllm-project/vllm, commit 009e6d4a),
``main_async`` and ``benchmark``: the run's settings (``backend``, ``model_id``,
``num_prompts``, ``request_rate`` - a number or ``"inf"`` -, ``burstiness``,
``max_concurrency``), the totals (``duration`` s, ``completed``, ``failed``,
``total_input_tokens``, ``total_output_tokens``, ``request_throughput`` req/s,
``output_throughput`` and ``total_token_throughput`` tok/s) and, per selected metric
(``--percentile-metrics``, default ttft,tpot,itl) ``mean_/median_/std_<m>_ms`` and
``p<q>_<m>_ms`` (``--metric-percentiles``, default 99) in milliseconds. With
``--save-detailed`` the file keeps one entry per request in ``input_lens``, ``output_lens``,
``start_times`` (``time.perf_counter()`` when sent, seconds), ``ttfts``, ``itls``, ``errors``.

vLLM's definitions (``calculate_metrics``), over successful requests: TTFT; TPOT = (latency -
TTFT) / (output_len - 1) for output_len > 1; ITL every gap between streamed chunks, pooled;
E2EL the latency; the throughputs count per second of ``duration``.

The workload: with the per-request lists, one row per successful request (empty ``errors``
entry) arriving at its ``start_times`` entry; without them, ``completed`` requests of the mean
lengths at the configured rate (``per_request`` False). ``request_rate`` ``"inf"`` with a
``max_concurrency``: a closed loop of that many clients (``concurrency``).
"""

from __future__ import annotations

import math
import re

from .common import Measured, count, fail, listed, number, rebuilt, workload

TOOL = "vllm-bench"
METRIC = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
TOTALS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
          "request_throughput", "output_throughput", "total_token_throughput")
REQUIRED = ("duration", "completed", "total_input_tokens", "total_output_tokens",
            "request_throughput")
PER_REQUEST = ("input_lens", "output_lens", "start_times")


def is_vllm(doc) -> bool:
    return isinstance(doc, dict) and "completed" in doc and "request_throughput" in doc \
        and ("backend" in doc or "endpoint_type" in doc or "num_prompts" in doc)


def _rate(doc, path):
    rate = doc.get("request_rate", "inf")
    if rate in ("inf", None) or (isinstance(rate, float) and math.isinf(rate)):
        return None
    rate = number(rate, path, "request_rate")
    if not rate > 0:
        fail(path, "request_rate", f"must be > 0 or \"inf\", got {rate!r}")
    return rate


def read_vllm(doc, path) -> Measured:
    """The :class:`~workloads.benchmarks.common.Measured` of a ``vllm bench serve`` result."""
    for key in REQUIRED:
        if key not in doc:
            fail(path, key, "missing (not a complete 'vllm bench serve --save-result' file)")
    metrics = {}
    for key in TOTALS:
        if key in doc:
            metrics[key] = number(doc[key], path, key)
    for key, value in doc.items():
        if METRIC.match(key) and value is not None:  # (null: a metric with no values)
            metrics[key] = number(value, path, key)
    rate = _rate(doc, path)
    concurrency = doc.get("max_concurrency")
    if concurrency is not None:
        concurrency = count(concurrency, path, "max_concurrency", minimum=1)
    notes = []
    if concurrency is not None and rate is not None:
        notes.append(f"max_concurrency {concurrency} at request_rate {rate:g}: replayed as an "
                     f"open loop at the requests' send times (vLLM's client queue is not "
                     f"simulated)")
        concurrency = None
    completed = count(doc["completed"], path, "completed")
    if all(k in doc for k in PER_REQUEST):
        lists = {k: listed(doc, k, path) for k in PER_REQUEST}
        n = len(lists["start_times"])
        errors = doc.get("errors") or [""] * n
        for k, v in (*lists.items(), ("errors", errors)):
            if len(v) != n:
                fail(path, k, f"has {len(v)} entries, start_times has {n}")
        keep = [i for i in range(n) if not errors[i]]
        t = [number(lists["start_times"][i], path, f"start_times[{i}]") for i in keep]
        prompts = [count(lists["input_lens"][i], path, f"input_lens[{i}]", minimum=1)
                   for i in keep]
        outputs = [count(lists["output_lens"][i], path, f"output_lens[{i}]", minimum=1)
                   for i in keep]
        df = workload(t, prompts, outputs, path)
        return Measured(TOOL, df, metrics, str(path), concurrency, rate, True, n - len(keep),
                        tuple(notes))
    some = [k for k in PER_REQUEST if k in doc]
    if some:  # a --save-detailed file with a list missing: not replayed as means, silently
        missing = [k for k in PER_REQUEST if k not in doc]
        fail(path, missing[0], f"missing while {', '.join(some)} "
                               f"{'is' if len(some) == 1 else 'are'} there (a "
                               f"--save-detailed file needs all of {', '.join(PER_REQUEST)})")
    if completed < 1:
        fail(path, "completed", "no successful request: nothing to replay")
    prompt = number(doc["total_input_tokens"], path, "total_input_tokens") / completed
    output = number(doc["total_output_tokens"], path, "total_output_tokens") / completed
    df = rebuilt(completed, prompt, output, rate, path)
    notes.append("no per-request lists (saved without --save-detailed): the workload is "
                 f"{completed} requests of the mean lengths, {round(prompt)} prompt and "
                 f"{round(output)} output tokens, "
                 + (f"evenly spaced at {rate:g} req/s" if rate else "all sent at once"))
    failed = count(doc.get("failed", 0), path, "failed")
    return Measured(TOOL, df, metrics, str(path), concurrency, rate, False, failed, tuple(notes))
