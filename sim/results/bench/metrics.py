"""A run's metrics as each benchmark tool names and defines them, over finished requests.

The keys are those ``workloads.from_benchmark`` returns for the tool's files, so a measured run
and its simulation compare key by key:

- ``vllm-bench`` (``vllm/benchmarks/serve.py``, ``calculate_metrics``): ``mean_/median_/std_
  <m>_ms`` and ``p<q>_<m>_ms`` for ``ttft``; ``tpot`` = (E2E - TTFT) / (n - 1), n > 1; ``itl``
  every token gap, pooled; ``e2el``; ``request_throughput``, ``output_throughput``,
  ``total_token_throughput`` per second of ``duration``; ``completed``, ``failed`` (rejected).
- ``aiperf`` (``aiperf/metrics/types/``): ``<tag>.<stat>`` for ``time_to_first_token``,
  ``request_latency``, ``inter_token_latency`` (= vLLM's TPOT, per request),
  ``output_token_throughput_per_user`` (1 / that), ``input_sequence_length``,
  ``output_sequence_length``, ``inter_chunk_latency`` (the pooled gaps), stats ``avg``,
  ``p1``..``p99``, ``min``, ``max``, ``std``; derived ``.avg`` only: ``request_count``,
  ``benchmark_duration`` (s), ``total_isl``, ``total_osl``, ``request_throughput``,
  ``output_token_throughput``.
- ``guidellm`` (``src/guidellm/schemas/request_stats.py``): ``<name>.<stat>`` for
  ``time_to_first_token_ms``, ``time_per_output_token_ms`` (= E2E / n, TTFT included),
  ``inter_token_latency_ms`` (= vLLM's TPOT; 0 for a one-token request, as guidellm's ``or
  0.0`` counts it), ``request_latency`` (s), ``prompt_token_count``, ``output_token_count``,
  ``total_token_count``, stats ``mean``, ``median``, ``std_dev``, ``min``, ``max``, ``count``,
  ``p001``..``p999``; ``requests_per_second``, ``output_tokens_per_second``,
  ``tokens_per_second`` (``.mean``: per second of the window; guidellm's are distributions over
  time, whose mean is that rate only approximately); ``duration``; ``request_totals.*``.

Milliseconds where the tool's name says ``_ms`` or its unit is ``ms``. Percentiles are numpy's
linear interpolation (vLLM's and AIPerf's; guidellm interpolates its own PDF, which differs at
the tails of a small sample). The window is the summary's: first arrival to last finish.
"""

from __future__ import annotations

import numpy as np

VLLM_PCTS = (50, 90, 95, 99)
AIPERF_PCTS = (1, 5, 10, 25, 50, 75, 90, 95, 99)
GUIDELLM_PCTS = {"p001": 0.1, "p01": 1, "p05": 5, "p10": 10, "p25": 25, "p50": 50, "p75": 75,
                 "p90": 90, "p95": 95, "p99": 99, "p999": 99.9}
# the metrics ``sim compare`` prints, in order (others: ``--all``)
HEADLINE = {
    "vllm-bench": [f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
                   for s in ("mean", "median", "p99")]
    + ["request_throughput", "output_throughput", "total_token_throughput"],
    "aiperf": [f"{m}.{s}" for m in ("time_to_first_token", "inter_token_latency",
                                    "inter_chunk_latency", "request_latency")
               for s in ("avg", "p50", "p99")]
    + ["request_throughput.avg", "output_token_throughput.avg"],
    "guidellm": [f"{m}.{s}" for m in ("time_to_first_token_ms", "time_per_output_token_ms",
                                      "inter_token_latency_ms", "request_latency")
                 for s in ("mean", "median", "p99")]
    + ["requests_per_second.mean", "output_tokens_per_second.mean"],
}


def _pct_name(q) -> str:
    return str(int(q)) if int(q) == q else str(q)


def _stats(values, names) -> dict:
    """mean/median/std/min/max (under ``names``' keys) of ``values``; NaN when empty."""
    v = np.asarray(values, dtype=np.float64)
    funcs = {"mean": np.mean, "median": np.median, "std": np.std, "min": np.min, "max": np.max,
             "count": np.size}
    return {name: (float(funcs[ours](v)) if v.size else float("nan"))
            for ours, name in names.items()}


def _pcts(values, qs) -> list:
    v = np.asarray(values, dtype=np.float64)
    return [float(x) for x in np.percentile(v, qs)] if v.size else [float("nan")] * len(qs)


def _finished(result):
    req = result.requests
    return req[req["status"] == "finished"]


def _window(result, fin):
    start = float(result.requests["arrival_time"].min())
    return float(fin["finish_time"].max()) - start if len(fin) else 0.0


def _per_s(x, duration):
    return x / duration if duration > 0 else float("nan")


def vllm_metrics(result, percentiles=VLLM_PCTS) -> dict:
    fin = _finished(result)
    duration = _window(result, fin)
    n_in, n_out = int(fin["num_prompt_tokens"].sum()), int(fin["num_output_tokens"].sum())
    out = {"duration": duration, "completed": float(len(fin)),
           "failed": float(len(result.requests) - len(fin)),
           "total_input_tokens": float(n_in), "total_output_tokens": float(n_out),
           "request_throughput": _per_s(len(fin), duration),
           "output_throughput": _per_s(n_out, duration),
           "total_token_throughput": _per_s(n_in + n_out, duration)}
    series = {"ttft": fin["ttft"].to_numpy(), "tpot": fin["tpot"].dropna().to_numpy(),
              "itl": result.itl(), "e2el": fin["e2e"].to_numpy()}
    for name, v in series.items():
        ms = np.asarray(v, dtype=np.float64) * 1000
        for stat, value in _stats(ms, {"mean": "mean", "median": "median", "std": "std"}).items():
            out[f"{stat}_{name}_ms"] = value
        for q, value in zip(percentiles, _pcts(ms, percentiles)):
            out[f"p{_pct_name(q)}_{name}_ms"] = value
    return out


def aiperf_metrics(result) -> dict:
    fin = _finished(result)
    duration = _window(result, fin)
    tpot = fin["tpot"].dropna().to_numpy() * 1000
    series = {"time_to_first_token": fin["ttft"].to_numpy() * 1000,
              "request_latency": fin["e2e"].to_numpy() * 1000,
              "inter_token_latency": tpot,
              "output_token_throughput_per_user": 1000 / tpot[tpot > 0],
              "input_sequence_length": fin["num_prompt_tokens"].to_numpy(),
              "output_sequence_length": fin["num_output_tokens"].to_numpy(),
              "inter_chunk_latency": result.itl() * 1000}
    out = {}
    for tag, v in series.items():
        for stat, value in _stats(v, {"mean": "avg", "min": "min", "max": "max",
                                      "std": "std"}).items():
            out[f"{tag}.{stat}"] = value
        for q, value in zip(AIPERF_PCTS, _pcts(v, AIPERF_PCTS)):
            out[f"{tag}.p{q}"] = value
    n_in, n_out = float(fin["num_prompt_tokens"].sum()), float(fin["num_output_tokens"].sum())
    out.update({"request_count.avg": float(len(fin)), "benchmark_duration.avg": duration,
                "total_isl.avg": n_in, "total_osl.avg": n_out,
                "request_throughput.avg": _per_s(len(fin), duration),
                "output_token_throughput.avg": _per_s(n_out, duration)})
    return out


def guidellm_metrics(result) -> dict:
    fin = _finished(result)
    duration = _window(result, fin)
    n = fin["num_output_tokens"].to_numpy()
    itl = np.where(n > 1, fin["tpot"].fillna(0.0).to_numpy(), 0.0) * 1000
    series = {"request_latency": fin["e2e"].to_numpy(),
              "prompt_token_count": fin["num_prompt_tokens"].to_numpy(),
              "output_token_count": n,
              "total_token_count": fin["num_prompt_tokens"].to_numpy() + n,
              "time_to_first_token_ms": fin["ttft"].to_numpy() * 1000,
              "time_per_output_token_ms": fin["tpot_incl_ttft"].to_numpy() * 1000,
              "inter_token_latency_ms": itl}
    names = {"mean": "mean", "median": "median", "std": "std_dev", "min": "min", "max": "max",
             "count": "count"}
    out = {"duration": duration}
    total = float(len(result.requests))
    out.update({"request_totals.successful": float(len(fin)), "request_totals.incomplete": 0.0,
                "request_totals.errored": total - len(fin), "request_totals.total": total})
    for name, v in series.items():
        for stat, value in _stats(v, names).items():
            out[f"{name}.{stat}"] = value
        for key, value in zip(GUIDELLM_PCTS, _pcts(v, list(GUIDELLM_PCTS.values()))):
            out[f"{name}.{key}"] = value
    n_in, n_out = float(fin["num_prompt_tokens"].sum()), float(n.sum())
    out["requests_per_second.mean"] = _per_s(len(fin), duration)
    out["output_tokens_per_second.mean"] = _per_s(n_out, duration)
    out["tokens_per_second.mean"] = _per_s(n_in + n_out, duration)
    return out


def tool_metrics(result, tool) -> dict:
    """``result``'s metrics in ``tool``'s names and definitions (the module docstring)."""
    funcs = {"vllm-bench": vllm_metrics, "aiperf": aiperf_metrics, "guidellm": guidellm_metrics}
    if tool not in funcs:
        raise ValueError(f"tool must be one of {', '.join(funcs)}, got {tool!r}")
    return funcs[tool](result)


def compare_rows(measured, simulated, keys=None) -> list:
    """(metric, measured, simulated, relative error) for every key in both (``keys``: those,
    in that order, when present in both); the error is (simulated - measured) / measured, NaN
    where the measured value is 0 or either is NaN."""
    keys = [k for k in (keys if keys is not None else measured) if k in measured
            and k in simulated]
    rows = []
    for k in keys:
        m, s = float(measured[k]), float(simulated[k])
        err = (s - m) / m if m and m == m and s == s else float("nan")
        rows.append((k, m, s, err))
    return rows
