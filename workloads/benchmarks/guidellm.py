"""guidellm benchmark reports (``benchmarks.json``, ``--output kind=json``).

Schema followed: vllm-project/guidellm (commit ee7a7745, August 2026, after v0.7.3):
``src/guidellm/benchmark/schemas/report.py`` (``GenerativeBenchmarksReport``: ``metadata``,
``config``, ``benchmarks``), ``benchmark.py`` (``GenerativeBenchmark``: ``config.strategy``,
``metrics``, ``requests`` by status, ``duration``), ``metrics.py`` (``GenerativeMetrics``),
``src/guidellm/schemas/statistics.py`` (a ``StatusDistributionSummary`` is ``successful``,
``incomplete``, ``errored``, ``total``, each ``{mean, median, mode, variance, std_dev, min,
max, count, total_sum, percentiles: {p001, p01, p05, p10, p25, p50, p75, p90, p95, p99,
p999}}``) and ``src/guidellm/schemas/request_stats.py`` (``GenerativeRequestStats``, whose
computed fields ``request_start_time``, ``prompt_tokens``, ``output_tokens`` are serialised).

guidellm's definitions (``request_stats.py``): ``time_to_first_token_ms``;
``time_per_output_token_ms`` = (last token - start) / output tokens, TTFT included;
``inter_token_latency_ms`` = (last token - first token) / (output tokens - 1), vLLM's TPOT;
``request_latency`` in seconds; ``requests_per_second``, ``output_tokens_per_second`` and
``tokens_per_second`` distributions over the run. Metrics here are ``"<name>.<stat>"`` over
successful requests, ``stat`` one of ``mean``, ``median``, ``std_dev``, ``min``, ``max``,
``count`` or a percentile key (``p99``); plus ``duration`` (s) and ``request_totals.<status>``.

The workload: the successful requests, each arriving at its ``request_start_time``; the
strategy says how they were sent: ``synchronous`` one client, ``concurrent`` ``streams``
clients (``concurrency``), ``constant``/``poisson`` an open loop at ``rate``, ``trace`` an open
loop at the requests' start times, ``throughput``
everything at once (its ``max_concurrency`` clients when set). A report of several benchmarks
(a sweep) needs ``index``.
"""

from __future__ import annotations

from .common import Measured, count, fail, listed, number, table, workload

TOOL = "guidellm"
STATS = ("mean", "median", "std_dev", "min", "max", "count")
PERCENTILES = ("p001", "p01", "p05", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "p999")


def is_guidellm(doc) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("benchmarks"), list)


def _strategy(bench, path, where):
    strategy = table(table(bench, "config", path, f"{where}.config"), "strategy", path,
                     f"{where}.config.strategy")
    kind = strategy.get("type_")
    at = f"{where}.config.strategy"
    if kind == "synchronous":
        return 1, None
    if kind == "concurrent":
        return count(strategy.get("streams"), path, f"{at}.streams", minimum=1), None
    if kind in ("constant", "poisson"):
        return None, number(strategy.get("rate"), path, f"{at}.rate")
    if kind == "trace":  # a replay of timed requests: the open loop of their start times
        return None, None
    if kind == "throughput":
        users = strategy.get("max_concurrency")
        return (None if users is None else count(users, path, f"{at}.max_concurrency",
                                                 minimum=1)), None
    fail(path, f"{at}.type_", f"{kind!r} is not a strategy read here (synchronous, concurrent, "
                              f"constant, poisson, trace, throughput)")


def _metrics(bench, path, where):
    metrics = {"duration": number(bench.get("duration"), path, f"{where}.duration")}
    m = table(bench, "metrics", path, f"{where}.metrics")
    for name, summary in m.items():
        if name == "request_totals" and isinstance(summary, dict):
            for status, n in summary.items():
                metrics[f"request_totals.{status}"] = number(n, path,
                                                             f"{where}.metrics.{name}.{status}")
            continue
        ok = summary.get("successful") if isinstance(summary, dict) else None
        if not isinstance(ok, dict) or "mean" not in ok:
            continue  # (the per-modality tables: text, image, ...)
        at = f"{where}.metrics.{name}.successful"
        for stat in STATS:
            if stat in ok:
                metrics[f"{name}.{stat}"] = number(ok[stat], path, f"{at}.{stat}")
        pcts = ok.get("percentiles") or {}
        for key in PERCENTILES:
            if key in pcts:
                metrics[f"{name}.{key}"] = number(pcts[key], path, f"{at}.percentiles.{key}")
    return metrics


def _tokens(req, key, usage, path, where):
    value = req.get(key)
    if value is None:
        value = (req.get(usage) or {}).get("total_tokens")
    return count(value, path, f"{where}.{key}", minimum=1)


def read_guidellm(doc, path, index=None) -> Measured:
    benches = listed(doc, "benchmarks", path)
    if not benches:
        fail(path, "benchmarks", "empty: the report holds no benchmark")
    if index is None:
        if len(benches) > 1:
            fail(path, "benchmarks", f"holds {len(benches)} benchmarks (a sweep): pass index= "
                                     f"0..{len(benches) - 1} to pick one")
        index = 0
    if not 0 <= index < len(benches):
        fail(path, "benchmarks", f"index {index} out of range: it holds {len(benches)}")
    where = f"benchmarks[{index}]"
    bench = benches[index]
    if not isinstance(bench, dict):
        fail(path, where, "must be an object")
    concurrency, rate = _strategy(bench, path, where)
    requests = table(bench, "requests", path, f"{where}.requests")
    done = requests.get("successful") or []
    if not isinstance(done, list):
        fail(path, f"{where}.requests.successful", "must be a list")
    t, prompts, outputs = [], [], []
    for i, req in enumerate(done):
        at = f"{where}.requests.successful[{i}]"
        if not isinstance(req, dict):
            fail(path, at, "must be an object")
        start = req.get("request_start_time")
        if start is None:
            start = ((req.get("info") or {}).get("timings") or {}).get("request_start")
        t.append(number(start, path, f"{at}.request_start_time"))
        prompts.append(_tokens(req, "prompt_tokens", "input_metrics", path, at))
        outputs.append(_tokens(req, "output_tokens", "output_metrics", path, at))
    failed = sum(len(requests.get(k) or []) for k in ("errored", "incomplete"))
    return Measured(TOOL, workload(t, prompts, outputs, path), _metrics(bench, path, where),
                    str(path), concurrency, rate, True, failed)
