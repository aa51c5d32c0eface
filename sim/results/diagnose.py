"""Troubleshooting: what went wrong in a run, in the cheat sheet's words, with the measured
figure that shows it and what to try.

:func:`diagnose` reads only a :class:`~sim.results.metrics.Result` (its summary, columns and
config) and returns a list of :class:`Finding`. Each rule below fires on a measured condition
(thresholds are named constants) and has a test scenario that triggers it and one that does not
(tests/test_diagnose.py):

- ``overloaded`` - requests arrive faster than they are served: the queue grows while they
  arrive (not merely drains after the last one);
- ``users_queue`` - a closed loop whose users spend most of their latency waiting for their
  first iteration (more users than the replicas serve at once; a closed loop's queue cannot
  grow past its users, so ``overloaded`` never says so);
- ``context_length`` - requests rejected at arrival because their prompt + output tokens
  exceed ``max_model_len`` (the model's context length unless set), as vLLM's and SGLang's
  servers refuse them;
- ``max_num_tokens`` - requests rejected at arrival because their prompt exceeds the
  tensorrt-llm preset's ``max_num_tokens`` without chunked context, as TensorRT-LLM refuses
  them;
- ``rejected`` - requests that can never fit in the KV pool (the rejections of neither kind
  above nor below);
- ``conversation_abandoned`` - a closed loop's turns never sent: each user dropped the rest of
  a conversation whose turn was rejected (:mod:`sim.engine.fleet.clients`);
- ``idle_slots`` - static batching leaves batch slots empty while requests wait;
- ``decode_stalls`` - P99 inter-token latency far above the median while iterations prefill
  thousands of tokens beside running decodes (or, with the ``sglang`` preset, alone while
  they wait: its prefill batches exclude the decodes);
- ``rare_stalls`` - the longest inter-token gap (P100; P99.9 reported beside it) far above the
  median while P99 looks healthy, with prefills of thousands of tokens beside running decodes:
  one long prompt in twenty under continuous batching stalls every decode of its iteration,
  invisible at P99 (the cheat sheet: chunked prefill);
- ``kv_bound_batch`` - requests wait while the batch runs well under ``max_batch_size`` with the
  KV pool nearly full: the pool, not the batch limit, sets the batch (400 blocks of 16 tokens
  and 1,000-token prompts: ~5 of 64 slots); a larger batch limit would change nothing;
- ``kv_pool_too_small`` - preemptions recompute a share of the prefill work (prefill computed
  plus the prefix cache's first-admission hits, over the prompt tokens: caching hides none);
- ``no_prefix_hits`` - prefix caching is on and the workload names prefix blocks (hash_ids
  covering a full block: ``Result.num_prefix_keyed``) but no prompt token came from the cache;
  a workload naming none cannot hit by construction, which is no finding;
- ``speculation_slower`` - speculative decoding with the acceptance it measured and its draft's
  cost ratio ``c`` gives ``speculative_speedup = E / (k c + 1)`` below 1 (the cheat sheet's
  "speculation got slower: measure the acceptance rate first"). ``c``: the configured
  ``draft_cost_ratio``, or a draft model's step over the target's for one decode at 1,024
  tokens of context (``DraftCost.cost_ratio``), or 0 for n-gram drafting;
- ``tool_gap_eviction`` - agentic turns after a tool gap served fewer cached tokens than their
  previous turn's context holds: evicted during the gap, with the offload tier that would keep
  them (:mod:`sim.results.session_findings`);
- ``fragile`` - a run with error bands (``run(..., bands=0.9)``) whose TTFT or TPOT P99 band
  spans more than ``FRAGILE`` times (hi / lo): the operating point sits at the knee, where the
  cost model's measured step-time error alone moves the tail that much.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..checks import plural
from .session_findings import tool_gap_eviction

BACKLOG = 0.1  # overloaded: requests unfinished at the last arrival above this share
IDLE_SLOTS = 0.5  # static batching: slot utilisation below this while requests wait
STALL_RATIO = 5.0  # ITL P99 / P50 above this, with prefills of STALL_PREFILL_TOKENS or more
STALL_PREFILL_TOKENS = 2048  # beside decodes in one iteration (a chunk budget rarely exceeds it)
RECOMPUTE = 1.05  # (prefill computed + cache hits) / prompt tokens above this: pool too small
QUEUED = 0.5  # closed loop: mean queueing delay above this share of the mean E2E
RARE_STALL_RATIO = 10.0  # the longest ITL gap / the median above this, while P99 / P50 is not
KV_BOUND_SLOTS = 0.5  # while requests wait: running / max_batch_size below this, with ...
KV_BOUND_USAGE = 0.8  # ... the KV pool's blocks in use above this share (the pool binds)
FRAGILE = 2.0  # error bands: a P99 band's hi / lo above this (sim.engine.bands)


@dataclass(frozen=True)
class Finding:
    """``code`` (stable, for scripts), ``message`` (what happened, with the figure),
    ``action`` (what to try) and ``value`` (the measured figure)."""

    code: str
    message: str
    action: str
    value: float

    def __str__(self):
        return f"{self.message} — {self.action}"


def diagnose(result, summary=None) -> list:
    """The findings for ``result`` (empty when nothing looks wrong). ``summary``: its
    ``result.summary(...)`` when the caller made it (with any ``slo``: no finding reads the
    SLO keys), else made here."""
    s = result.summary() if summary is None else summary
    req, it, cfg = result.requests, result.iterations, result.config
    out = []
    fin = req[req["status"] == "finished"]
    if len(req) >= 2 and len(fin) and len(it):
        arrivals = req["arrival_time"].to_numpy()
        t0, t1 = arrivals.min(), arrivals.max()
        span = t1 - t0
        if span > 0:
            # the queue grows while requests keep arriving: waiting requests in the second half
            # of the arrival window well above the first half, and a backlog at the last
            # arrival (the drain after it is not overload)
            start = it["start"].to_numpy()
            waiting = it["num_waiting"].to_numpy()
            first = waiting[(start >= t0) & (start < t0 + span / 2)]
            second = waiting[(start >= t0 + span / 2) & (start <= t1)]
            finished_by = int((fin["finish_time"] <= t1).sum())
            backlog = len(req) - finished_by
            offered = (len(req) - 1) / span
            served = finished_by / span
            if (len(first) and len(second) and second.mean() > 2 * first.mean() + 1
                    and backlog > BACKLOG * len(req)):
                out.append(Finding(
                    "overloaded",
                    f"overloaded: requests arrive at {offered:.3g}/s but are served at "
                    f"{served:.3g}/s while they arrive; the queue grows (from {first.mean():.3g} "
                    f"to {second.mean():.3g} waiting on average, "
                    f"{plural(backlog, 'request')} still unfinished at the last arrival)",
                    "lower the request rate, add replicas, or raise throughput (larger batches, "
                    "a faster GPU, quantized weights)", served / offered))
    loop = getattr(cfg, "closed_loop", None)
    queued, e2e = s["queueing_delay_mean"], s["e2e_mean"]
    if loop is not None and len(fin) and e2e > 0 and queued > QUEUED * e2e:
        out.append(Finding(
            "users_queue",
            f"{plural(loop.num_users, 'user')} queue: a request waits {queued:.3g} s on average "
            f"for its first iteration, {queued / e2e:.0%} of its mean end-to-end latency "
            f"({e2e:.3g} s), while the replicas run {s['mean_batch_size']:.3g} at a time",
            "fewer users or a longer think time, add replicas, or raise throughput (a larger "
            "max_batch_size, more KV blocks, a faster GPU)", queued / e2e))
    too_long = s["num_rejected_context_length"]
    if too_long:
        over = req[result.over_max_model_len()]
        longest = int((over["num_prompt_tokens"] + over["num_output_tokens"]).max())
        given = getattr(cfg, "max_model_len", None)
        model = cfg.model_context_length() if hasattr(cfg, "model_context_length") else None
        limit = given if given is not None else model
        whose = "" if limit is None else f" {limit:,}" + (
            "" if given is not None else " (the model's context length)")
        action = (f"raise max_model_len (up to the model's context length, {model:,})"
                  if given is not None and model and given < model else
                  "serve them with a model of a longer context, or leave them out of the "
                  "workload (workloads.load(..., max_context=N))")
        out.append(Finding(
            "context_length",
            f"{too_long:,} of {len(req):,} requests were rejected at arrival: their prompt + "
            f"output tokens (up to {longest:,}) exceed max_model_len{whose}, as vLLM and "
            f"SGLang refuse them", action, float(too_long)))
    over_budget = s["num_rejected_max_num_tokens"]
    if over_budget:
        longest = int(req.loc[result.over_max_num_tokens(), "num_prompt_tokens"].max())
        budget = getattr(cfg, "token_budget", None)
        whose = "" if budget is None else f" {budget:,}"
        out.append(Finding(
            "max_num_tokens",
            f"{over_budget:,} of {len(req):,} requests were rejected at arrival: their prompts "
            f"(up to {longest:,} tokens) exceed max_num_tokens{whose} without chunked context, "
            f"as TensorRT-LLM refuses them",
            "turn on TensorRT-LLM's chunked context (enable_chunked_context=True, sim run "
            "--enable-chunked-context) or raise max_num_tokens (token_budget, sim run "
            "--token-budget)", float(over_budget)))
    abandoned = s["num_rejected_conversation_abandoned"]
    if s["num_rejected"] > too_long + over_budget + abandoned:
        n = s["num_rejected"] - too_long - over_budget - abandoned
        out.append(Finding(
            "rejected",
            f"{n:,} of {plural(len(req), 'request')} "
            f"{'was rejected: it' if n == 1 else 'were rejected: each'} needs more KV "
            f"blocks than the whole pool ({s['kv_blocks']:,}) holds",
            "enlarge the KV pool (kv_blocks, memory, quantized KV, more GPUs) or cap the "
            "requests' lengths", float(n)))
    if abandoned:
        out.append(Finding(
            "conversation_abandoned",
            f"{abandoned:,} of {plural(len(req), 'request')} "
            f"{'was' if abandoned == 1 else 'were'} never sent: later turns of conversations "
            f"whose turn was rejected, dropped by their users (as vLLM's multi-turn benchmark "
            f"client drops a conversation whose request failed)",
            "remove the rejections that ended those conversations (the findings above); a "
            "later turn's prompt holds the rejected one's", float(abandoned)))
    name = str(result.scheduler_name)
    if name == "static" and len(it):
        waiting = (it["num_waiting"] > 0).to_numpy()
        if waiting.any():
            util = float(it["num_running"][waiting].mean()) / cfg.max_batch_size
            if util < IDLE_SLOTS:
                out.append(Finding(
                    "idle_slots",
                    f"static batching keeps only {util:.0%} of the {cfg.max_batch_size} batch "
                    f"slots busy while requests wait: a batch runs until its longest request "
                    f"finishes",
                    "use continuous batching (scheduler='continuous' or 'chunked')", util))
    p50, p99 = s["itl_p50"], s["itl_p99"]
    # SGLang runs a prefill batch alone: the running decodes wait out its whole iteration
    # (its decode tokens are 0 there; prefill pools of a disaggregated run hold no decodes)
    alone = name == "sglang" and getattr(cfg, "disaggregation", None) is None
    if p50 > 0 and p99 / p50 > STALL_RATIO and len(it):
        largest = _largest_stalling_prefill(it, alone)
        if largest:
            out.append(Finding(
                "decode_stalls",
                f"decode stalls: P99 inter-token latency {p99 * 1e3:.3g} ms is "
                f"{p99 / p50:.1f}x the median, as decodes wait for prefills of up to {largest:,} "
                f"tokens " + ("running alone (SGLang's prefill batches)" if alone else
                              "in their iteration"), _stall_action(result, cfg), p99 / p50))
    elif p50 > 0 and len(it):  # P99 healthy: the rare stalls only the tail's end shows
        p999, longest = (float(v) for v in result.itl_percentiles((99.9, 100)))
        largest = _largest_stalling_prefill(it, alone)
        if longest / p50 > RARE_STALL_RATIO and largest:
            out.append(Finding(
                "rare_stalls",
                f"rare long stalls: the longest inter-token gap, {longest * 1e3:.3g} ms, is "
                f"{longest / p50:.1f}x the median (P99.9 {p999 / p50:.1f}x) while P99 is "
                f"{p99 / p50:.1f}x: decodes wait for prefills of up to {largest:,} tokens in "
                f"their iteration, rare enough to pass P99", _stall_action(result, cfg),
                longest / p50))
    kv_bound = _kv_bound(result, s)
    if kv_bound is not None:
        running, usage = kv_bound
        out.append(Finding(
            "kv_bound_batch",
            f"the KV pool holds the batch small: while requests waited, {running:.3g} ran at a "
            f"time of max_batch_size {cfg.max_batch_size:,}, with {usage:.0%} of the pool's "
            f"{s['kv_blocks']:,} blocks ({s.get('kv_tokens') or 0:,} tokens) in use",
            "more KV memory (kv_blocks or kv_tokens, gpu_memory_utilization, kv_dtype='fp8', "
            "more GPUs) or shorter requests: a larger max_batch_size changes nothing",
            running / cfg.max_batch_size))
    ratio = _recompute_ratio(req, fin)
    if ratio == ratio and ratio > RECOMPUTE and s["num_preemptions"]:
        out.append(Finding(
            "kv_pool_too_small",
            f"KV pool too small: {plural(s['num_preemptions'], 'preemption')} (up to "
            f"{s['max_preemptions']} of one request) recomputed {ratio - 1:.0%} more prefill "
            f"than the prompts",
            "compare KV memory with the budget before raising the batch size: fewer running "
            "requests, more KV blocks (memory, quantized KV, more GPUs) or shorter outputs",
            ratio))
    if getattr(cfg, "prefix_caching", False) and len(fin) and s.get("prefix_hit_rate") == 0 \
            and result.num_prefix_keyed:  # a workload naming no prefix block cannot hit
        out.append(Finding(
            "no_prefix_hits",
            "no prefix hits: prefix caching is on but no prompt token came from the cache",
            "is the system prompt identical from the first token (and a multiple of the block "
            "size)? does the workload carry hash_ids?", 0.0))
    spec = getattr(cfg, "speculative", None)
    length = s.get("spec_mean_acceptance_length", float("nan"))
    if spec is not None and length == length:
        k = spec.num_speculative_tokens
        c = _draft_cost_ratio(cfg)
        speedup = length / (k * c + 1) if c is not None else float("nan")
        if speedup < 1:
            out.append(Finding(
                "speculation_slower",
                f"speculation got slower: {s['spec_acceptance_rate']:.0%} of draft tokens "
                f"accepted, {length:.2f} tokens per verification for k = {k}; with a draft "
                f"step costing {c:.2g} of a target step that is a {speedup:.2f}x speedup",
                "measure the acceptance rate first: fewer speculative tokens, a better-matched "
                "draft, or no speculation", speedup))
    gap = tool_gap_eviction(result)
    if gap is not None:
        out.append(Finding("tool_gap_eviction", gap[1], gap[2], gap[0]))
    out.extend(_fragile(s))
    return out


def _fragile(s) -> list:
    """The ``fragile`` findings of a summary with error bands (none without)."""
    out = []
    for key, name in (("ttft_p99", "TTFT P99"), ("tpot_p99", "TPOT P99")):
        point, lo, hi = s.get(key), s.get(f"{key}_lo"), s.get(f"{key}_hi")
        if lo is None or not (lo > 0 and hi / lo > FRAGILE):
            continue
        slower = s["bands_factor_hi"] - 1
        out.append(Finding(
            "fragile",
            f"fragile operating point: a step {slower:.0%} slower (the slow end of the "
            f"{s['bands_level']:.0%} error band) gives {name} {hi:.3g} s, {hi / point:.2g}x the "
            f"{point:.3g} s estimated; its band spans {lo:.3g}-{hi:.3g} s ({hi / lo:.2g}x)",
            "leave headroom: a lower request rate, another replica or a faster configuration "
            "(sim capacity finds the knee; measure this GPU's step time to narrow the band)",
            hi / lo))
    return out


def _largest_stalling_prefill(it, alone) -> int:
    """The largest prefill of ``STALL_PREFILL_TOKENS`` or more in an iteration that holds
    decodes (``alone``: SGLang's, beside running requests), or 0 when there is none."""
    mixed = it[(it["num_prefill_tokens"] >= STALL_PREFILL_TOKENS)
               & ((it["num_decode_tokens"] > 0) | (alone & (it["num_running"] > 1)))]
    return int(mixed["num_prefill_tokens"].max()) if len(mixed) else 0


def _stall_action(result, cfg) -> str:
    """What to try against decodes stalled by prefills, in the scheduler's knobs."""
    chunk = getattr(cfg, "chunk_size", None)
    if chunk:
        return f"lower the token budget (chunk_size, now {chunk:,})"
    if str(result.scheduler_name) == "tensorrt-llm":  # (chunk_size: not its knob)
        return ("turn on TensorRT-LLM's chunked context (enable_chunked_context=True, sim run "
                "--enable-chunked-context; off by default)"
                if not getattr(cfg, "enable_chunked_context", None) else
                f"lower max_num_tokens (token_budget, now {cfg.token_budget:,})")
    return "use chunked prefill (scheduler='chunked') or a smaller chunk_size"


def _kv_bound(result, s):
    """``(mean running, mean KV usage)`` over the iterations where requests waited, when the
    batch ran under ``KV_BOUND_SLOTS`` of its slots with the pool over ``KV_BOUND_USAGE`` full;
    else None. A cluster's iterations each count against their replica's pool."""
    it, cfg = result.iterations, result.config
    slots = getattr(cfg, "max_batch_size", None)
    waiting = (it["num_waiting"] > 0).to_numpy() if len(it) else None
    if not slots or waiting is None or not waiting.any() or not s["kv_blocks"]:
        return None
    blocks = s["kv_blocks"]
    if result.replica_pools is not None:
        blocks = np.asarray(result.replica_pools[0], dtype=np.float64)[
            it["replica"].to_numpy()][waiting]
    running = float(it["num_running"].to_numpy()[waiting].mean())
    usage = float((it["kv_blocks_used"].to_numpy()[waiting] / blocks).mean())
    if running < KV_BOUND_SLOTS * slots and usage > KV_BOUND_USAGE:
        return running, usage
    return None


def _recompute_ratio(req, fin) -> float:
    """Prefill computed, plus the prompt tokens the prefix cache served at first admission, over
    the prompt tokens (NaN without the columns or prompts): 1 when no preemption recomputed
    anything. Without a cache it is ``prefill_compute_ratio``; with one that ratio counts the
    hits as work saved and hid the recomputation (2,048-token shared prompts with a 97 % hit
    rate and 1,154 preemptions: 0.13, where 10 % more prefill was computed)."""
    if "num_prefill_computed" not in req or "num_cached_tokens" not in fin:
        return float("nan")
    prompt = float(fin["num_prompt_tokens"].sum())
    done = float(req["num_prefill_computed"].sum()) + float(fin["num_cached_tokens"].sum())
    return done / prompt if prompt else float("nan")


def _draft_cost_ratio(cfg):
    """``c`` of the run's draft (None when its cost model cannot say)."""
    spec = cfg.speculative
    if spec.method == "ngram":
        return 0.0
    if spec.draft_cost_ratio is not None:
        return float(spec.draft_cost_ratio)
    try:  # the engine's DraftCost prices one draft step against one target step
        return float(cfg.resolved_cost_model().cost_ratio())
    except (AttributeError, TypeError, ValueError):
        return None
