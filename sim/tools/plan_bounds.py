"""The planner's second pruning stage: an upper bound on the request rate a candidate can
serve, from its cost model's price of the cheapest work the workload can ask for.

A replica's iteration computes prefill tokens and decode tokens; the rate it sustains is at
most the lower of

- **prefill**: the least time the prompts take, from the cost model's own floor where it
  declares one (the roofline's :meth:`~sim.costs.roofline.RooflineCost.least_prefill_time`:
  each prompt's attention, which sums to the whole prompt's however it is chunked, plus its
  tokens at the most prompt tokens a second any iteration reaches), else the prompts' tokens
  at the most tokens a second of the shapes it prices: ``k`` prefills of the shortest prompt
  ``m``, or one of ``2^i`` tokens, up to ``MAX_STEP_TOKENS`` tokens (a heuristic: another
  shape may be faster). The shortest prompts alone are no floor: each tiny prefill pays a
  sampled row and per-sequence costs that a long prompt's chunks share (the roofline priced
  them at 60 % of the prompt tokens a second an H100 TP4 reaches, and the bound fell below the
  rate the simulation served);
- **decode**: ``D / mean(output - 1)`` requests/s (the first token comes with the prefill),
  ``D`` the most decode tokens per second: ``B / cost(B decodes over B * (m + 1) tokens)``
  over ``B = 1 .. B_max``, ``B_max`` the scheduler's batch limit, and no more than the
  requests whose shortest KV (``m + 1`` tokens) fits the pool at once.

Each iteration's work is priced as if it did nothing else, at the least context, so a real
iteration mixing both costs at least as much; a cluster's prefill time is one replica's over
the replica count and its decode speed the replicas' sum (a perfect router), a disaggregated
one's prefill its prefill pool's and decode speed its decode pool's.

A finite workload need not be sustainable: its queue may grow and still meet the SLO before
the last arrival. So the bound is the finite one: at rate ``r`` the ``n`` requests arrive over
``(n - 1) / r`` seconds, and the ``ceil(attainment * n)`` that meet the SLO have their prefills
done within the TTFT limit (or E2E) of their arrival and their tokens within the E2E limit (or
TTFT + the TPOT/ITL limit x the longest output); their work is at least that of the cheapest
ones (the shortest prompts, the fewest decodes), so ``time(work) <= (n - 1) / r + limit``
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


def workload_terms(df) -> dict:
    """What the bound reads of the workload: its shortest prompt, sorted prompts and decodes."""
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


def _finite(n, seconds, deadline) -> float:
    """The highest rate at which work of ``seconds`` ends by the last of ``n`` arrivals plus
    ``deadline`` (``inf``: any rate)."""
    need = seconds - deadline
    return (n - 1) / need if need > 0 else math.inf


def _replica_bound(config, w, k) -> tuple:
    """``(prefill seconds, decode tokens/s)`` of one replica of ``config``: the least time it
    spends prefilling the ``k`` shortest prompts, and the most decode tokens a second."""
    from ..engine.core.batch import Batch, decode_pricer
    cost = config.resolved_cost_model()
    resolved = config.resolved()
    m = w["min_prompt"]
    if declared_with(cost, "least_prefill_time", "__call__"):  # (the roofline's floor)
        prefill = cost.least_prefill_time(w["prompts"][:k], int(w["prompts"].sum()))
    else:  # the most prompt tokens a second of the shapes priced
        pieces = [2 ** i for i in range(40) if 2 ** i * m <= MAX_STEP_TOKENS]
        whole = [2 ** i for i in range(40) if m < 2 ** i <= MAX_STEP_TOKENS]
        speed = max([j * m / cost(Batch(0, ((m, 0),) * j, j * m, 0, 0)) for j in pieces]
                    + [t / cost(Batch(0, ((t, 0),), t, 0, 0)) for t in whole])
        prefill = float(w["prompts"][:k].sum()) / speed
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
    return prefill, best_decode


def rate_bound(config, df, slo, attainment, terms=None) -> tuple:
    """``(bound, why)``: an upper bound on the rate at which ``config`` serves the workload
    ``df`` time-scaled to it with ``attainment`` of its requests meeting ``slo``'s per-request
    limits (see the module docstring), and which side sets it, in words. ``terms``: the
    workload's, ``workload_terms(df)`` (a plan computes them once for every candidate)."""
    if config.speculative is not None or "hash_ids" in df.columns:
        return math.inf, "not bounded (speculative decoding or cached prefixes)"
    w = workload_terms(df) if terms is None else terms
    n = len(df)
    k = math.ceil(attainment * n)
    if not any(key in slo for key in ("ttft", "e2e")) or k < 1:
        return math.inf, "not bounded (no TTFT or E2E limit)"
    if config.disaggregation is None:
        p, d = _replica_bound(config, w, k)
        p, d = p / config.replicas, config.replicas * d
    else:
        pre, dec = config.disaggregation.pool_configs(config)
        p = _replica_bound(pre, w, k)[0] / pre.replicas
        d = dec.replicas * _replica_bound(dec, w, k)[1]
    t_p, t_d = _deadlines(slo, w["max_decode"])
    rate_p = _finite(n, p, t_p)
    rate_d = _finite(n, float(w["decodes"][:k].sum()) / d, t_d)
    side = "prefill" if rate_p <= rate_d else "decode"
    return min(rate_p, rate_d), (f"{side}-bound: the cheapest {k} of {n} requests done in time "
                                 f"need at least {p:.4g} s of prefill and at most {d:.4g} "
                                 f"decode tokens/s")
