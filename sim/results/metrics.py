"""Results: per-request and per-iteration DataFrames, and summaries in the usual conventions.

A :class:`Result` is built by the engine (:mod:`sim.engine.core.records`); this module knows
nothing of the engine: it holds columns and computes summaries from them.

``requests``: one row per request, in workload order. ``status`` is ``"finished"`` or
``"rejected"`` at arrival, ``reason`` saying why: its prompt + output tokens exceed the run's
``max_model_len`` (a reason starting with :data:`CONTEXT_LENGTH`, the model's context length
unless set; vLLM's and SGLang's servers refuse such a request), its prompt exceeds the
tensorrt-llm preset's ``max_num_tokens`` without chunked context (a reason starting with
:data:`MAX_NUM_TOKENS`; TensorRT-LLM refuses it), or it could never fit the KV pool (a reason
starting with :data:`KV_POOL`: its prompt + output need more blocks than the pool, or a decode
replica's, holds); or, in a
closed loop with conversations, it is a later turn of a conversation whose turn was rejected,
never sent (a reason starting with :data:`CONVERSATION_ABANDONED`; its ``arrival_time`` is when
its user dropped the conversation, as vLLM's multi-turn benchmark client drops it). A rejected
request's times and latencies are NaN. The summary counts every kind in ``num_rejected``, the
first also in ``num_rejected_context_length``, the second in ``num_rejected_max_num_tokens``,
the third in ``num_rejected_kv_pool``, the last in ``num_rejected_conversation_abandoned``.
Per request
(n = ``num_output_tokens``):

- TTFT = first token - arrival; E2E = finish - arrival; queueing delay = first scheduled - arrival.
- TPOT = (E2E - TTFT) / (n - 1) (vLLM / GenAI-Perf); ``tpot_incl_ttft`` = E2E / n (LLMPerf,
  guidellm); TPOT is NaN for a one-token request.
- ``max_itl``: the request's largest gap between consecutive tokens (NaN when n = 1).
- ``num_cached_tokens``: prompt tokens served from the prefix cache at first admission;
  ``num_prefill_computed``: prefill tokens computed for the request, recomputation after
  preemptions included. Summary: ``prefix_hit_rate`` = cached / prompt tokens and
  ``prefill_compute_ratio`` = computed / prompt tokens (both over finished requests; the
  ratio is 1 without caching or preemption; ``prefix_hit_rate`` counts each request's first
  admission, as vLLM's per-request ``num_cached_tokens``, not its Prometheus hit rate, which
  also counts preempted requests coming back), ``prefill_tokens_computed``, and
  ``max_preemptions`` (of one request) beside ``num_preemptions`` (in all).
- Speculative decoding (columns ``spec_steps``, ``spec_drafted``, ``spec_accepted``: a
  request's verifications, draft tokens proposed and accepted, preempted work included):
  ``spec_acceptance_rate`` = accepted / drafted (vLLM's definition) and
  ``spec_mean_acceptance_length`` = tokens emitted per verification, the bonus token included
  (``1 + accepted / verifications``; at most k + 1). Users confuse the two: a rate of 0.8 with
  k = 5 is a mean length of ~3.7 under independent acceptance.

``iterations``: one row per engine iteration: ``start``, ``duration`` (what the cost model
returned), the batch's ``num_prefill_tokens`` and ``num_decode_tokens``, and the replica once the
batch was formed: ``num_running``, ``num_waiting``, ``kv_blocks_used`` (this iteration's blocks
already reserved), ``num_preemptions`` (made to form it; their sum equals the requests' sum).

ITL (inter-token latency): every gap between consecutive tokens of a request, pooled over all
requests (vLLM ``bench serve``), so a request weighs by its number of tokens. Stored without one
value per token as ``(gaps, weights, extra)``: ``gaps[j] = end[j] - end[j-1]`` (iteration end
times), ``weights[j]`` = how many requests emitted a token in both iterations ``j-1`` and ``j``,
``extra`` = the gap across each preemption that split a request's tokens. The pooled multiset is
``repeat(gaps, weights) ++ extra``. Invariants, per finished request: n - 1 gaps, summing to
E2E - TTFT; so ``len(itl()) == sum(n - 1)`` and ``sum(itl()) == sum(E2E - TTFT)``, and
``max_itl >= TPOT``. With speculative decoding an iteration may emit several tokens at once: ITL
is then the gap between emissions (as ``vllm bench serve`` times streamed chunks), so a request
has (emissions - 1) gaps, still summing to E2E - TTFT; TPOT stays (E2E - TTFT) / (n - 1).

:meth:`Result.summary` conventions:

- Latency percentiles: numpy's linear interpolation (``np.percentile``), over finished requests
  (TTFT, TPOT, E2E, queueing delay; NaNs dropped) or over pooled tokens (ITL).
- The window: from the first arrival of any request (rejected ones included) to the last finish;
  ``duration`` = its length. Throughputs count finished requests and their tokens per second of
  the window; ``busy_fraction`` = sum of iteration durations / window / replicas (<= 1: a
  cluster's replicas on average).
- Occupancy is time-weighted over busy time (an iteration counts for its duration, not once):
  ``mean_batch_size`` = sum(duration x num_running) / sum(duration); ``slot_utilization`` = that
  / ``max_batch_size``; ``kv_usage_mean`` likewise for ``kv_blocks_used`` / ``kv_blocks``;
  ``kv_usage_max`` the peak fraction. The pool: ``kv_blocks``, ``kv_tokens`` (blocks x
  ``block_size``: the same memory across presets of other block sizes) and ``kv_pool``, what
  sized it (``SimConfig.pool_source``: ``"memory budget"``, ``"cheat sheet"``, ...).
- A cluster (``replicas`` > 1, :mod:`sim.engine.fleet.cluster`): ``requests`` and ``iterations``
  have a ``replica`` column (0 for one replica; in a cluster -1 for an abandoned turn, never
  routed; ``iteration`` counts each replica's own); the summary stays whole-cluster
  (occupancy means are per replica, over all replicas' busy time) and adds ``num_replicas``
  and ``num_gpus`` (replicas x their GPUs: ``tensor_parallel`` x ``attention_dp``), and with an SLO ``goodput_per_gpu``;
  :meth:`Result.replica_summary` gives one row per replica.
  Disaggregation: ``replica`` is where a request decoded (its prefill replica when it finished
  there), ``prefill_replica`` where it prefilled, ``kv_transfer_time`` from prefill done to its
  KV landed (NaN when not transferred), summarised as ``kv_transfer_time_mean/_p50/_p99``;
  ``kv_blocks`` is the decode pool's, ``replica_pools`` each replica's (KV blocks, max batch
  size), over which slot and KV usage are computed iteration by iteration.
- Degenerate runs: nothing finished -> window 0 and every rate NaN; no iterations -> the
  time-weighted means are 0.0; no tokens -> ITL statistics NaN.
"""

from __future__ import annotations

import numbers

import numpy as np

from ..numerics import dot  # a @ b in a fixed order, on any CPU
from .economics import economics
from .offload_metrics import offload_metrics

PCTS = (50, 90, 95, 99)
CONTEXT_LENGTH = "context_length"  # how the reason of a request over max_model_len starts
MAX_NUM_TOKENS = "max_num_tokens"  # ... of a prompt over TensorRT-LLM's max_num_tokens
CONVERSATION_ABANDONED = "conversation_abandoned"  # ... of a turn after a rejected one
KV_POOL = "kv_pool"  # ... of a request needing more KV than the whole pool holds
SLO_KEYS = ("ttft", "itl", "tpot", "e2e")


def weighted_cdf(values, weights):
    """``(v, cum)``: the distinct values of weight > 0, sorted, and the total weight of the
    values <= each (``cum[-1]``: all); what :func:`cdf_percentiles` reads. Ties merged, an
    unstable sort (6x a stable one's speed) gives the same bytes on any CPU."""
    values = np.asarray(values, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.int64)
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    order = np.argsort(values)
    v, cum = values[order], np.cumsum(weights[order])
    last = np.append(v[1:] != v[:-1], True)[:len(v)]  # the last of each run of equal values
    return v[last], cum[last]


def cdf_percentiles(v, cum, qs) -> np.ndarray:
    """Percentiles ``qs`` of the multiset whose :func:`weighted_cdf` is ``(v, cum)`` (linear
    method); NaN for every ``q`` when it is empty."""
    if v.size == 0:
        return np.full(len(qs), np.nan)
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


def weighted_percentiles(values, weights, qs) -> np.ndarray:
    """``np.percentile(np.repeat(values, weights), qs)`` without the repeat (linear method).

    Equal to the repeat up to rounding; entries of weight 0 are ignored; NaN for every ``q``
    when the total weight is 0. Cost O(k log k + len(qs) log k) for k entries, however large the
    weights. ``qs`` in percent, in [0, 100] (not checked: values outside are clamped
    or fail, where ``np.percentile`` raises); ``values`` must not hold NaN (sorted last here,
    propagated by ``np.percentile``).
    """
    return cdf_percentiles(*weighted_cdf(values, weights), qs)


class Result:
    """What a run produced: ``requests`` and ``iterations`` DataFrames, and :meth:`summary`.

    Also ``config`` (the :class:`~sim.engine.SimConfig`), ``seed`` (``config.seed``),
    ``kv_blocks`` (the pool size the run used), ``wall_seconds`` (the simulation's runtime),
    ``scheduler_name``, ``cost_model_name``. ``itl_data`` is ``(gaps, weights, extra)`` as in
    the module docstring.
    """

    def __init__(self, requests, iterations, config, kv_blocks, wall_seconds, itl_data,
                 scheduler_name, cost_model_name):
        self.requests = requests
        self.iterations = iterations
        self.config = config
        self.kv_blocks = kv_blocks
        # disaggregation: per replica (KV blocks, max batch size), pools may differ; else None
        self.replica_pools = None
        self.wall_seconds = wall_seconds
        self.seed = config.seed
        self.scheduler_name = scheduler_name
        self.cost_model_name = cost_model_name
        # requests whose prompt names at least one cacheable prefix block (their hash_ids cover
        # a full block); 0 without prefix caching. Set by the engine (sim.engine.core.records)
        self.num_prefix_keyed = 0
        self.offload_bytes = None  # an offload tier's (stored, loaded) bytes (kv.offload)
        self.lora_stats = None  # LoRA adapters' metrics (sim.engine.kv.lora.lora_stats)
        self._itl = itl_data  # (gap values per iteration, weights, extra gaps)
        self._itl_sorted = (None, None)  # (the _itl it was computed from, its weighted_cdf)
        self.bands = None  # run(..., bands=): the band's runs (sim.engine.bands.Bands)

    def over_max_model_len(self) -> np.ndarray:
        """Which requests (rows of ``requests``) were rejected for exceeding ``max_model_len``:
        their reason starts with :data:`CONTEXT_LENGTH`."""
        return self._rejected_for(CONTEXT_LENGTH)

    def over_max_num_tokens(self) -> np.ndarray:
        """Which requests were rejected for a prompt over the tensorrt-llm preset's
        ``max_num_tokens`` without chunked context: their reason starts with
        :data:`MAX_NUM_TOKENS`."""
        return self._rejected_for(MAX_NUM_TOKENS)

    def abandoned(self) -> np.ndarray:
        """Which requests were turns of a conversation dropped by its closed-loop user after
        an earlier turn was rejected, never sent: their reason starts with
        :data:`CONVERSATION_ABANDONED`."""
        return self._rejected_for(CONVERSATION_ABANDONED)

    def _rejected_for(self, prefix, rejected=None) -> np.ndarray:
        req = self.requests  # (rejected: the status column's mask, when the caller made it)
        out = np.array(req["status"] == "rejected" if rejected is None else rejected, dtype=bool)
        if "reason" not in req or not out.any():  # (a frame built by hand may lack it)
            return np.zeros(len(req), dtype=bool)
        reasons = req["reason"].to_numpy()[out]  # (the rejected few: no pass over every row)
        out[out] = [str(x).startswith(prefix) for x in reasons]
        return out

    def itl(self) -> np.ndarray:
        """Every inter-token gap, pooled over requests (materialised; for plots and checks)."""
        gaps, weights, extra = self._itl
        return np.concatenate([np.repeat(gaps, weights), extra])

    def itl_cdf(self):
        """``(v, cum)``: the distinct gaps of :meth:`itl` sorted, with cumulative counts
        (:func:`weighted_cdf`). Sorted once per Result and kept (summary, findings, plots)."""
        source, cdf = self._itl_sorted
        if source is not self._itl:
            gaps, weights, extra = self._itl
            cdf = weighted_cdf(np.concatenate([gaps, extra]),
                               np.concatenate([weights, np.ones(len(extra), dtype=np.int64)]))
            self._itl_sorted = (self._itl, cdf)
        return cdf

    def itl_percentiles(self, qs=PCTS) -> np.ndarray:
        """Percentiles of :meth:`itl` (``np.percentile``'s linear method), without materialising
        it; NaN when no request emitted two tokens."""
        return cdf_percentiles(*self.itl_cdf(), qs)

    def itl_mean(self) -> float:
        """Mean of :meth:`itl`, without materialising it; NaN when there is no gap."""
        gaps, weights, extra = self._itl
        n = weights.sum() + len(extra)
        return float((dot(gaps, weights) + extra.sum()) / n) if n else float("nan")

    def summary(self, slo=None) -> dict:
        """Flat dict of metrics (conventions in the module docstring).

        ``slo``: limits in seconds on any of ``ttft``, ``itl`` (on each request's ``max_itl``:
        every gap must meet it), ``tpot``, ``e2e``; other keys raise ``ValueError`` naming them.
        A request meets the SLO when it finished and each metric is <= its limit (inclusive);
        a metric it does not have (TPOT and ITL of a one-token request) is met. Adds
        ``slo_<key>`` (the limit), ``slo_attainment_<key>`` (fraction of all requests meeting
        that limit: the ITL one is each request's largest gap, where ``itl_p99`` pools every
        gap of every request), ``slo_attainment`` (fraction of *all* requests meeting every
        limit at once; rejected ones count and fail) and ``goodput`` (such requests per second
        of the window).
        """
        req, it = self.requests, self.iterations
        status = req["status"].to_numpy(dtype=object)  # (compared as objects: 4x faster
        finished, rejected = status == "finished", status == "rejected"  # than Arrow's ==)
        fin = req[finished]  # (each status compared once: 0.4 ms a pass at 400 requests)
        out = {"scheduler": self.scheduler_name, "cost_model": self.cost_model_name,
               "num_requests": len(req), "num_finished": len(fin),
               "num_rejected": int(rejected.sum())}
        for prefix in (CONTEXT_LENGTH, MAX_NUM_TOKENS, KV_POOL, CONVERSATION_ABANDONED):
            out[f"num_rejected_{prefix}"] = int(self._rejected_for(prefix, rejected).sum())
        for key in ("ttft", "tpot", "e2e", "queueing_delay"):
            col = fin[key].to_numpy(dtype=np.float64)
            col = col[~np.isnan(col)]
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
        fleet = getattr(self.config, "fleet", None)
        replicas, gpus = fleet() if fleet else (1, 1)
        out["busy_fraction"] = busy / duration / replicas if duration > 0 else float("nan")
        out["num_iterations"] = len(it)
        out["mean_batch_size"] = dot(w, it["num_running"].to_numpy()) / busy if busy else 0.0
        out["slot_utilization"] = out["mean_batch_size"] / self.config.max_batch_size
        out["kv_usage_mean"] = (dot(w, it["kv_blocks_used"].to_numpy()) / busy / self.kv_blocks
                                if busy else 0.0)
        out["kv_usage_max"] = float(it["kv_blocks_used"].max() / self.kv_blocks) if len(it) else 0.0
        out["kv_blocks"] = self.kv_blocks
        block_size = getattr(self.config, "block_size", None)  # (None: a Result built by hand)
        out["kv_tokens"] = self.kv_blocks * block_size if block_size else None
        source = getattr(self.config, "pool_source", None)
        out["kv_pool"] = source() if source else "given"
        if self.replica_pools is not None and len(it):  # each iteration over its own pool
            blocks, slots = (np.asarray(x, dtype=np.float64)[it["replica"].to_numpy()]
                             for x in self.replica_pools)
            used = it["kv_blocks_used"].to_numpy() / blocks
            out["slot_utilization"] = dot(w, it["num_running"].to_numpy() / slots) / busy \
                if busy else 0.0
            out["kv_usage_mean"] = dot(w, used) / busy if busy else 0.0
            out["kv_usage_max"] = float(used.max())
        out["num_replicas"] = replicas
        out["num_gpus"] = gpus
        out.update(economics(self, out))  # dollars and joules: sim.results.economics
        if "kv_transfer_time" in req:  # disaggregation: prefill done -> KV landed
            col = fin["kv_transfer_time"].dropna().to_numpy()
            out["kv_transfer_time_mean"] = float(col.mean()) if col.size else float("nan")
            for q, v in zip((50, 99), np.percentile(col, (50, 99)) if col.size else [np.nan] * 2):
                out[f"kv_transfer_time_p{q}"] = float(v)
        overheads = getattr(self.config, "overheads_summary", None)  # (engine_overheads)
        out.update(overheads() if overheads else {})
        out["num_preemptions"] = int(req["num_preemptions"].sum())
        out["max_preemptions"] = int(req["num_preemptions"].max()) if len(req) else 0
        prompt = float(fin["num_prompt_tokens"].sum())
        if "num_prefill_computed" in req:  # (a Result built by hand may lack these columns)
            computed = float(req["num_prefill_computed"].sum())
            out["prefill_tokens_computed"] = int(computed)
            out["prefill_compute_ratio"] = computed / prompt if prompt else float("nan")
            out["prefix_hit_rate"] = (float(fin["num_cached_tokens"].sum()) / prompt
                                      if prompt else float("nan"))
        if "num_offload_tokens" in req:  # an offload tier under the prefix cache
            out.update(offload_metrics(req, fin, prompt, self.offload_bytes))
        if self.lora_stats:  # LoRA adapters
            out.update(self.lora_stats)
        if "spec_steps" in req:  # speculative decoding
            steps, drafted = float(req["spec_steps"].sum()), float(req["spec_drafted"].sum())
            accepted = float(req["spec_accepted"].sum())
            out["spec_acceptance_rate"] = accepted / drafted if drafted else float("nan")
            out["spec_mean_acceptance_length"] = ((accepted + steps) / steps if steps
                                                  else float("nan"))
        if slo:
            unknown = set(slo) - set(SLO_KEYS)
            if unknown:
                raise ValueError(f"slo keys must be among {SLO_KEYS}, got {sorted(unknown)}")
            ok = finished.copy()
            for key, limit in slo.items():
                if isinstance(limit, bool) or not isinstance(limit, numbers.Real) or not limit > 0:
                    raise ValueError(f"slo[{key!r}] must be a positive number of seconds, got "
                                     f"{limit!r}")
                col = "max_itl" if key == "itl" else key
                vals = req[col].to_numpy(dtype=np.float64)
                met = finished & (np.nan_to_num(vals, nan=0.0) <= float(limit))
                ok &= met
                out[f"slo_{key}"] = float(limit)
                out[f"slo_attainment_{key}"] = float(met.mean()) if len(met) else float("nan")
            out["slo_attainment"] = float(ok.mean()) if len(ok) else float("nan")
            out["goodput"] = rate(float(ok.sum()))
            out["goodput_per_gpu"] = out["goodput"] / out["num_gpus"]
        if self.bands is not None:  # <metric>_lo / <metric>_hi (sim.engine.bands)
            out.update(self.bands.columns(out, slo))
        out["wall_seconds"] = self.wall_seconds
        return out

    def replica_summary(self) -> "pd.DataFrame":
        """One row per replica (index ``replica``): ``num_requests`` routed there,
        ``num_finished``, ``load_share`` (its fraction of all requests), ``busy_fraction``
        (its iterations' time / the run's window), ``mean_batch_size``, ``slot_utilization``
        and ``kv_usage_mean`` (time-weighted over its busy time, as in :meth:`summary`),
        ``num_iterations``, ``num_preemptions``, ``prefix_hit_rate`` (cached / prompt tokens of
        its finished requests) and its finished requests' ``ttft_p50`` / ``ttft_p99``."""
        import pandas as pd
        req, it = self.requests, self.iterations
        fleet = getattr(self.config, "fleet", None)
        n = fleet()[0] if fleet else 1
        fin = req["status"] == "finished"
        start = float(req["arrival_time"].min()) if len(req) else 0.0
        end = float(req.loc[fin, "finish_time"].max()) if fin.any() else start
        window = end - start
        rows = []
        pools = self.replica_pools or ([self.kv_blocks] * n, [self.config.max_batch_size] * n)
        for k in range(n):
            here = req["replica"] == k
            if "prefill_replica" in req:  # disaggregation: a request visits two replicas
                here |= req["prefill_replica"] == k
            mine, its = req[here], it[it["replica"] == k]
            done = mine[mine["status"] == "finished"]
            w = its["duration"].to_numpy()
            busy = float(w.sum())
            batch = dot(w, its["num_running"].to_numpy()) / busy if busy else 0.0
            prompt = float(done["num_prompt_tokens"].sum())
            ttft = done["ttft"].dropna().to_numpy()
            p50, p99 = np.percentile(ttft, (50, 99)) if ttft.size else (np.nan, np.nan)
            rows.append({
                "replica": k, "num_requests": len(mine), "num_finished": len(done),
                "load_share": len(mine) / len(req) if len(req) else float("nan"),
                "busy_fraction": busy / window if window > 0 else float("nan"),
                "mean_batch_size": batch,
                "slot_utilization": batch / pools[1][k],
                "kv_usage_mean": (dot(w, its["kv_blocks_used"].to_numpy()) / busy / pools[0][k]
                                   if busy else 0.0),
                "num_iterations": len(its),
                "num_preemptions": int(mine["num_preemptions"].sum()),
                "prefix_hit_rate": (float(done["num_cached_tokens"].sum()) / prompt
                                    if prompt else float("nan")),
                "ttft_p50": float(p50), "ttft_p99": float(p99)})
        return pd.DataFrame(rows).set_index("replica")

    def diagnose(self, summary=None) -> list:
        """Findings in the cheat sheet's words (:mod:`sim.results.diagnose`): overloaded, idle
        slots, decode stalls, KV pool too small, no prefix hits; empty when none applies
        (``summary``: this result's :meth:`summary` when the caller has it)."""
        from .diagnose import diagnose
        return diagnose(self, summary)

    def __repr__(self):
        return (f"Result({len(self.requests)} requests, {len(self.iterations)} iterations, "
                f"scheduler={self.scheduler_name})")
