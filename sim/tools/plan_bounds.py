"""The planner's second pruning stage: an upper bound on the request rate a candidate can
serve, from its cost model's price of the cheapest work the workload can ask for.

A replica's iteration computes prefill tokens and decode tokens; the rate it sustains is at
most the lower of

- **prefill**: ``P / mean_prompt`` requests/s, ``P`` the most prompt tokens per second any one
  iteration reaches: ``k * m / cost(k prefills of m new tokens, nothing cached)`` over
  ``k = 1, 2, 4, ...`` up to ``MAX_STEP_TOKENS`` tokens, ``m`` the workload's shortest prompt
  (pieces of the shortest prompt attend over the least context; a chunked prompt's attention
  sums to its whole prompt's);
- **decode**: ``D / mean(output - 1)`` requests/s (the first token comes with the prefill),
  ``D`` the most decode tokens per second: ``B / cost(B decodes over B * (m + 1) tokens)``
  over ``B = 1 .. B_max``, ``B_max`` the scheduler's batch limit, and no more than the
  requests whose shortest KV (``m + 1`` tokens) fits the pool at once.

Each iteration's work is priced as if it did nothing else, at the least context, so a real
iteration mixing both costs at least as much; a cluster's speeds are its replicas' sum (a
perfect router), a disaggregated one's prefill speed its prefill pool's and decode speed its
decode pool's.

A finite workload need not be sustainable: its queue may grow and still meet the SLO before
the last arrival. So the bound is the finite one: at rate ``r`` the ``n`` requests arrive over
``(n - 1) / r`` seconds, and the ``ceil(attainment * n)`` that meet the SLO have their prefills
done within the TTFT limit (or E2E) of their arrival and their tokens within the E2E limit (or
TTFT + the TPOT/ITL limit x the longest output); their work is at least that of the cheapest
ones (the shortest prompts, the fewest decodes), so ``work / speed <= (n - 1) / r + limit``
gives the rate. As ``n`` grows it tends to the steady state's ``speed / (attainment x mean
work)``. The planner prunes a candidate when this bound, raised by ``margin`` (the slack for a
cost model that prices a mixed iteration below its parts), is below the target rate.

Not bounded (``math.inf``: never pruned here): speculative decoding (an iteration emits more
than one token per request) a workload with ``hash_ids`` (a cached prefix skips prefill
and shares KV blocks), and SLOs with neither a TTFT nor an E2E limit.
"""

from __future__ import annotations

import math

import numpy as np

from ..checks import declared_with

MAX_STEP_TOKENS = 16384  # the largest iteration priced for the prefill bound
MAX_BATCH = 1024  # the decode batch priced when the scheduler sets no limit


def _workload_terms(df) -> dict:
    prompt = df["num_prompt_tokens"].to_numpy()
    out = df["num_output_tokens"].to_numpy()
    return {"min_prompt": max(int(prompt.min()), 1), "prompts": np.sort(prompt),
            "decodes": np.sort(np.maximum(out - 1, 0)), "max_decode": int(max(out.max() - 1, 0))}


def _deadlines(slo, max_decode) -> tuple:
    """``(prefill, decode)``: how long after its arrival a request meeting ``slo`` has its
    prefill done, and its last token (``inf``: the SLO does not say)."""
    ttft, e2e = slo.get("ttft", math.inf), slo.get("e2e", math.inf)
    gap = slo.get("tpot", slo.get("itl", math.inf))
    return min(ttft, e2e), min(e2e, ttft + gap * max_decode)


def _finite(n, work, speed, deadline) -> float:
    """The highest rate at which ``work`` done at ``speed`` ends by the last of ``n`` arrivals
    plus ``deadline`` (``inf``: any rate)."""
    need = work / speed - deadline
    return (n - 1) / need if need > 0 else math.inf


def _replica_bound(config, w) -> tuple:
    """``(prefill rate, decode rate)`` bounds of one replica of ``config``."""
    from ..engine.core.batch import Batch, decode_pricer
    cost = config.resolved_cost_model()
    resolved = config.resolved()
    m = w["min_prompt"]
    best_prefill = 0.0
    sizes = [1] + [2 ** i for i in range(1, 40) if 2 ** i * m <= MAX_STEP_TOKENS]
    if hasattr(cost, "memoise_linear"):  # (the layers of every size priced in one pass)
        cost.memoise_linear([(k * m, k) for k in sizes])
    for k in sizes:
        t = cost(Batch(0, ((m, 0),) * k, k * m, 0, 0))
        best_prefill = max(best_prefill, k * m / t)
    b_max = resolved.max_batch_size or MAX_BATCH
    block = resolved.block_size or 16
    fit = resolved.resolved_kv_blocks() // max(math.ceil((m + 1) / block), 1)
    b_max = max(min(b_max, fit), 1)
    pure = decode_pricer(cost)  # (bit for bit cost(batch) of b decodes: no Batch per b)
    every = cost.pure_decode_costs if pure is not None and declared_with(
        cost, "pure_decode_costs", "__call__") else None  # (all b at once, bit for bit)
    if every is not None:
        b = np.arange(1, b_max + 1)
        best_decode = float((b / every(b, b * (m + 1))).max())
    else:
        best_decode = max(b / (pure(b)(b * (m + 1)) if pure is not None
                               else cost(Batch(0, (), 0, b, b * (m + 1))))
                          for b in range(1, b_max + 1))
    return best_prefill, best_decode


def rate_bound(config, df, slo, attainment) -> tuple:
    """``(bound, why)``: an upper bound on the rate at which ``config`` serves the workload
    ``df`` time-scaled to it with ``attainment`` of its requests meeting ``slo``'s per-request
    limits (see the module docstring), and which side sets it, in words."""
    if config.speculative is not None or "hash_ids" in df.columns:
        return math.inf, "not bounded (speculative decoding or cached prefixes)"
    w = _workload_terms(df)
    n = len(df)
    k = math.ceil(attainment * n)
    if not any(key in slo for key in ("ttft", "e2e")) or k < 1:
        return math.inf, "not bounded (no TTFT or E2E limit)"
    if config.disaggregation is None:
        p, d = _replica_bound(config, w)
        p, d = config.replicas * p, config.replicas * d
    else:
        pre, dec = config.disaggregation.pool_configs(config)
        p = pre.replicas * _replica_bound(pre, w)[0]
        d = dec.replicas * _replica_bound(dec, w)[1]
    t_p, t_d = _deadlines(slo, w["max_decode"])
    rate_p = _finite(n, float(w["prompts"][:k].sum()), p, t_p)
    rate_d = _finite(n, float(w["decodes"][:k].sum()), d, t_d)
    side = "prefill" if rate_p <= rate_d else "decode"
    return min(rate_p, rate_d), (f"{side}-bound: at most {p:.4g} prompt and {d:.4g} decode "
                                 f"tokens/s, the cheapest {k} of {n} requests done in time")
