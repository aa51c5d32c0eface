"""A published run replayed on the server the benchmark found: warm prefix cache included.

Why. The SGLang cookbook's blocks of one page run one after another against one
``sglang.launch_server`` (until the page gives a new deployment command), with
the radix prefix cache on (SGLang's default) and never flushed (``bench_serving``'s
``--flush-cache`` is off by default). Every block draws its prompts with the same seed:
``bench_serving``'s ``random`` (and ``sharegpt``) sampler shuffles ShareGPT with
``random.seed(seed)`` and builds prompt ``i`` from the ``i``-th non-empty conversation, repeated
and cut to ``input_lens[i]`` tokens (sglang ``benchmark/datasets/random.py``:
``(prompt_token_ids * ratio)[: input_lens[i]]``). So prompt ``i`` of a block and prompt ``i``
of any earlier block on the same server share their first ``min`` of the two lengths' tokens,
and the later block finds them cached. Replayed cold, a block's first burst of
``concurrency`` prompts is prefilled from scratch (at 64 x ~4,000 tokens of Llama-3.1-70B on
8 A100s, tens of seconds: a TTFT P99 the published 1.9 s rules out).

What. :func:`history` names the earlier blocks of the row's server (same source page and
deployment command - the CSV's ``server`` column: the page's ``launch_server`` line the block
follows; a new command is a new, cold server - and the same model, GPU and engine; earlier
line in the page = ran earlier); :func:`replay` runs them first (the
warm-up: requests ``w<j>:<i>``, at ``MaxConcurrency(concurrency)``, all sent at 0), then the
row's requests (``m:<i>``) all sent at ``t0``, after the warm-up has drained (``t0`` = three
times the warm-up alone's makespan plus 1 s, 0 without one; checked: no warm-up request ends
after ``t0``),
and :func:`measured_summary` reports the row's requests alone, as the benchmark did (its
duration from ``t0`` to the last finish). Prefix identity as ``hash_ids`` of :data:`UNIT`
tokens: full block ``k`` of prompt ``i`` is ``(i, k)`` in every block of the page; a prompt's
partial last block is its own.

Invariants: a row without history is not replayed here (the caller's plain replay, bit for
bit); the measured requests come out once each; the warm-up never overlaps the measured part.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

import workloads
from sim.results.metrics import cdf_percentiles, weighted_cdf

UNIT = 16  # tokens per hash id (SGLang's page size 1 divides it)
_PARTIAL = 1 << 40  # partial last blocks' ids start here (full blocks: i * _STRIDE + k)
_STRIDE = 1 << 20
METRIC_KEYS = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99",
               "e2e_p50", "output_token_throughput")


def page_line(run_id: str):
    """``(page, line)`` of an SGLang-cookbook run id (``sglang-cookbook:Llama3.1:L307``);
    None for any other source (no shared server is known)."""
    parts = str(run_id).split(":")
    if len(parts) != 3 or parts[0] != "sglang-cookbook" or not parts[2].startswith("L"):
        return None
    return parts[1], int(parts[2][1:])


def _server(row):
    s = getattr(row, "server", None)
    return None if s is None or s != s or str(s) == "" else str(s)


def history(rows: pd.DataFrame, row) -> list:
    """The rows that ran before ``row`` on its server (same page, same ``server``: the
    deployment command's line; and the same model, GPU and engine), in the order they ran."""
    me, server = page_line(row.run_id), _server(row)
    if me is None or server is None:
        return []
    out = []
    for r in rows.itertuples():
        other = page_line(r.run_id)
        if other is not None and other[0] == me[0] and other[1] < me[1] and \
                _server(r) == server and \
                (r.model, r.gpu, r.engine) == (row.model, row.gpu, row.engine):
            out.append(r)
    return sorted(out, key=lambda r: page_line(r.run_id)[1])


def prefix_ids(prompts, fresh) -> list:
    """``hash_ids`` of prompts ``0..n-1`` (lengths ``prompts``): full block ``k`` of prompt
    ``i`` is ``i * _STRIDE + k``; a partial last block takes the next id of ``fresh`` (an
    iterator shared by every prompt of the workload)."""
    out = []
    for i, p in enumerate(np.asarray(prompts).tolist()):
        full, part = divmod(int(p), UNIT)
        if full >= _STRIDE:
            raise ValueError(f"prompt {i} of {p} tokens exceeds {UNIT * _STRIDE} tokens")
        ids = [i * _STRIDE + k for k in range(full)]
        out.append(ids + ([next(fresh)] if part else []))
    return out


def workload(parts, t0: float) -> pd.DataFrame:
    """One workload of the warm-up blocks (``parts[:-1]``, sent at 0) and the row's block
    (``parts[-1]``, sent at ``t0``); ``parts``: the blocks' request frames (lengths only)."""
    fresh = iter(range(_PARTIAL, _PARTIAL + 10 ** 9))
    frames = []
    for j, df in enumerate(parts):
        last = j == len(parts) - 1
        tag = "m" if last else f"w{j}"
        frames.append(pd.DataFrame({
            "request_id": [f"{tag}:{i}" for i in range(len(df))],
            "arrival_time": np.full(len(df), t0 if last else 0.0),
            "num_prompt_tokens": df["num_prompt_tokens"].to_numpy(),
            "num_output_tokens": df["num_output_tokens"].to_numpy(),
            "hash_ids": prefix_ids(df["num_prompt_tokens"], fresh)}))
    out = pd.concat(frames, ignore_index=True)
    out.attrs["block_size"] = UNIT
    return out


def _itl(result, t0):
    """The ITL gaps of the decode steps that end after ``t0`` (the measured part's alone:
    the warm-up has drained by then, at least ``2 t0 / 3`` earlier) and every extra gap."""
    gaps, weights, extra = result._itl
    it = result.iterations
    # the decode steps' end times: gaps[j] = end[j] - end[j-1] (gaps[0] = 0), the last step
    # ending with the run (a policy's prefill-only iterations are no steps: SGLang's)
    last = float((it["start"] + it["duration"]).max())
    csum = np.cumsum(gaps)
    keep = last - (csum[-1] - csum) > t0
    return weighted_cdf(np.concatenate([gaps[keep], extra]),
                        np.concatenate([weights[keep], np.ones(len(extra), dtype=np.int64)]))


def measured_summary(result, t0: float) -> dict:
    """The row's metrics (:data:`METRIC_KEYS`, seconds and tokens/s) from its requests alone."""
    req = result.requests
    mine = req["request_id"].astype(str).str.startswith("m:")
    warm, fin = req[~mine], req[mine & (req["status"] == "finished")]
    if len(warm) and (warm["status"] != "finished").any() or (
            len(warm) and float(warm["finish_time"].max()) > t0):
        raise ValueError(f"the warm-up has not drained by t0 = {t0:g} s")
    if mine.sum() != len(fin):
        raise ValueError(f"{int(mine.sum() - len(fin))} measured requests did not finish")
    out = {}
    for key in ("ttft", "tpot", "e2e"):
        col = fin[key].dropna().to_numpy()
        for q, v in zip((50, 99), np.percentile(col, (50, 99))):
            out[f"{key}_p{q}"] = float(v)
    for q, v in zip((50, 99), cdf_percentiles(*_itl(result, t0), (50, 99))):
        out[f"itl_p{q}"] = float(v)
    duration = float(fin["finish_time"].max()) - t0
    out["output_token_throughput"] = float(fin["num_output_tokens"].sum()) / duration
    return out


def replay(parts, config, bands=None) -> dict:
    """Run the warm-up and the row (see the module docstring): the measured summary, and with
    ``bands`` its ``<metric>_lo`` / ``_hi`` over the band's two scaled runs."""
    import sim
    t0 = 0.0
    if len(parts) > 1:  # the warm-up alone, for its makespan
        alone = sim.run(workload(parts[:-1] + [parts[-1].iloc[:0]], 0.0), config)
        t0 = 3.0 * float(alone.requests["finish_time"].max()) + 1.0
    wl = workload(parts, t0)
    if bands is None:
        return measured_summary(sim.run(wl, config), t0)
    res = sim.run(wl, dataclasses.replace(config, bands=bands))
    point = measured_summary(res, t0)
    ends = [measured_summary(r, t0) for r in (res.bands.fast, res.bands.slow)]
    for k in METRIC_KEYS:
        vals = [v for v in (point[k], ends[0][k], ends[1][k]) if v == v]
        point[f"{k}_lo"], point[f"{k}_hi"] = min(vals), max(vals)
    return point


def closed_loop(concurrency: int):
    """The loop the replay runs under (sends honour arrival times)."""
    return workloads.MaxConcurrency(int(concurrency))
