"""Results: per-request and per-iteration DataFrames, and summaries in the usual conventions.

- TTFT = first token - arrival; E2E = finish - arrival; queueing delay = first scheduled - arrival.
- TPOT = (E2E - TTFT) / (n - 1) (vLLM / GenAI-Perf); ``tpot_incl_ttft`` = E2E / n (LLMPerf,
  guidellm); NaN for a one-token request.
- ITL: every gap between consecutive tokens of a request, pooled over all requests (vLLM
  ``bench serve``); computed exactly from iteration end times and each request's runs of
  consecutive iterations, without materialising one value per token.
- Percentiles: numpy's linear interpolation, over finished requests.

A :class:`Result` is built by the engine (:mod:`sim.engine.records`); this module knows
nothing of the engine: it holds columns and computes summaries from them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

PCTS = (50, 90, 95, 99)
SLO_KEYS = ("ttft", "itl", "tpot", "e2e")


def weighted_percentiles(values, weights, qs) -> np.ndarray:
    """``np.percentile(np.repeat(values, weights), qs)`` without the repeat (linear method)."""
    values = np.asarray(values, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.int64)
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if values.size == 0:
        return np.full(len(qs), np.nan)
    order = np.argsort(values, kind="stable")
    v, cum = values[order], np.cumsum(weights[order])
    n = cum[-1]
    out = []
    for q in qs:
        h = (n - 1) * q / 100.0
        lo = int(np.floor(h))
        hi = min(lo + 1, n - 1)
        vlo = v[np.searchsorted(cum, lo, side="right")]
        vhi = v[np.searchsorted(cum, hi, side="right")]
        out.append(vlo + (h - lo) * (vhi - vlo))
    return np.array(out)


class Result:
    """What a run produced: ``requests`` and ``iterations`` DataFrames, and :meth:`summary`."""

    def __init__(self, requests, iterations, config, kv_blocks, wall_seconds, itl_data,
                 scheduler_name, cost_model_name):
        self.requests = requests
        self.iterations = iterations
        self.config = config
        self.kv_blocks = kv_blocks
        self.wall_seconds = wall_seconds
        self.seed = config.seed
        self.scheduler_name = scheduler_name
        self.cost_model_name = cost_model_name
        self._itl = itl_data  # (gap values per iteration, weights, extra gaps)

    def itl(self) -> np.ndarray:
        """Every inter-token gap, pooled over requests (materialised; for plots and checks)."""
        gaps, weights, extra = self._itl
        return np.concatenate([np.repeat(gaps, weights), extra])

    def itl_percentiles(self, qs=PCTS) -> np.ndarray:
        gaps, weights, extra = self._itl
        values = np.concatenate([gaps, extra])
        w = np.concatenate([weights, np.ones(len(extra), dtype=np.int64)])
        return weighted_percentiles(values, w, qs)

    def itl_mean(self) -> float:
        gaps, weights, extra = self._itl
        n = weights.sum() + len(extra)
        return float((gaps @ weights + extra.sum()) / n) if n else float("nan")

    def summary(self, slo=None) -> dict:
        """Flat dict of metrics; ``slo`` (seconds): any of ``ttft``, ``itl`` (every gap of a
        request), ``tpot``, ``e2e`` -> attainment (fraction of all requests meeting every SLO
        at once; rejected ones fail) and goodput (such requests per second)."""
        req, it = self.requests, self.iterations
        fin = req[req["status"] == "finished"]
        out = {"scheduler": self.scheduler_name, "cost_model": self.cost_model_name,
               "num_requests": len(req), "num_finished": len(fin),
               "num_rejected": int((req["status"] == "rejected").sum())}
        for key in ("ttft", "tpot", "e2e", "queueing_delay"):
            col = fin[key].dropna().to_numpy()
            out[f"{key}_mean"] = float(col.mean()) if col.size else float("nan")
            for q, v in zip(PCTS, np.percentile(col, PCTS) if col.size else [np.nan] * 4):
                out[f"{key}_p{q}"] = float(v)
        out["itl_mean"] = self.itl_mean()
        for q, v in zip(PCTS, self.itl_percentiles()):
            out[f"itl_p{q}"] = float(v)
        start = float(req["arrival_time"].min()) if len(req) else 0.0
        end = float(fin["finish_time"].max()) if len(fin) else start
        duration = end - start
        out["duration"] = duration
        rate = (lambda x: x / duration) if duration > 0 else (lambda x: float("nan"))
        out["request_throughput"] = rate(len(fin))
        out["output_token_throughput"] = rate(float(fin["num_output_tokens"].sum()))
        out["total_token_throughput"] = rate(float(fin["num_output_tokens"].sum()
                                                   + fin["num_prompt_tokens"].sum()))
        busy = float(it["duration"].sum()) if len(it) else 0.0
        w = it["duration"].to_numpy()
        out["busy_fraction"] = busy / duration if duration > 0 else float("nan")
        out["num_iterations"] = len(it)
        out["mean_batch_size"] = float(w @ it["num_running"].to_numpy() / busy) if busy else 0.0
        out["slot_utilization"] = out["mean_batch_size"] / self.config.max_batch_size
        out["kv_usage_mean"] = (float(w @ it["kv_blocks_used"].to_numpy() / busy / self.kv_blocks)
                                if busy else 0.0)
        out["kv_usage_max"] = float(it["kv_blocks_used"].max() / self.kv_blocks) if len(it) else 0.0
        out["kv_blocks"] = self.kv_blocks
        out["num_preemptions"] = int(req["num_preemptions"].sum())
        if slo:
            unknown = set(slo) - set(SLO_KEYS)
            if unknown:
                raise ValueError(f"slo keys must be among {SLO_KEYS}, got {sorted(unknown)}")
            ok = (req["status"] == "finished").to_numpy().copy()
            for key, limit in slo.items():
                col = "max_itl" if key == "itl" else key
                vals = req[col].to_numpy(dtype=np.float64)
                ok &= np.nan_to_num(vals, nan=0.0) <= float(limit)
                out[f"slo_{key}"] = float(limit)
            out["slo_attainment"] = float(ok.mean()) if len(ok) else float("nan")
            out["goodput"] = rate(float(ok.sum()))
        out["wall_seconds"] = self.wall_seconds
        return out

    def __repr__(self):
        return (f"Result({len(self.requests)} requests, {len(self.iterations)} iterations, "
                f"scheduler={self.scheduler_name})")
