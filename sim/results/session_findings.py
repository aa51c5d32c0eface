"""The ``tool_gap_eviction`` finding (:func:`~sim.results.diagnose.diagnose`): agentic turns
whose context was evicted from the prefix cache while the client ran a tool.

A run of a workload with ``gap_s`` and prefix caching (``"block"``) carries ``Result.sessions``
(:func:`sim.engine.fleet.sessions.gap_turns`): per request its previous turn and the prompt
tokens a cache that evicted nothing would serve it (its previous turn's prompt and answer, in
whole blocks). A *turn after a tool gap* is a finished turn with ``gap_s > 0`` and such a
reusable prefix whose previous turn finished on the same replica before it was issued; it
*lost its prefix* when it was served fewer cached tokens than that (the evicted tokens: the
difference). The rule fires when at least :data:`LOST_PREFIX` of those turns lost theirs.

The offload estimate (stated in the finding's action): each lost prefix is a unit of
``ceil(evicted tokens / block_size)`` blocks of the model's KV bytes per block
(``sim.specs.memory.kv_cache_bytes``: what an offload tier would store), parked from its
previous turn's finish to its own issue. ``X`` is the mean bytes parked while any gap is open
(time-weighted); ``Y`` the share of the evicted tokens a first-in-first-out tier of ``X``
bytes, written at each gap's start and read at its end, still holds when read (a unit larger
than the tier is not stored); the action names the peak parked bytes too. It ignores when in
the gap the blocks were evicted, the other blocks a real tier stores and its bandwidth (what
``kv_offload`` simulates). Against a simulated LRU tier of ``X`` GB with free transfers
(five agentic workloads, Llama-3.1-8B on an H100, 900-1,500 blocks): the guide's example
said 44 % and the tier kept 43 % of the evicted tokens; the others were 6-24 points off
either way; a tier of the peak kept 55-76 %, not all (it also stores blocks never asked for
again).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

LOST_PREFIX = 0.05  # share of the turns after a tool gap that lost their prefix: the finding


def _block_bytes(cfg):
    """The model's KV bytes per block of ``cfg`` (a resolved config), or None."""
    from ..specs.memory import kv_cache_bytes
    try:
        return float(kv_cache_bytes(cfg.block_size, model=cfg.resolved_model(),
                                    dtype=cfg.kv_dtype, tensor_parallel=cfg.tensor_parallel))
    except (AttributeError, TypeError, ValueError, KeyError):
        return None


def fifo_kept(start, end, size, tokens, capacity) -> float:
    """The share of ``tokens`` whose unit (``size`` bytes, stored at ``start``, read and
    dropped at ``end``) a first-in-first-out store of ``capacity`` bytes still holds at its
    ``end`` (ends before starts at one moment; 0 when there are no tokens)."""
    events = sorted([(float(e), 0, k) for k, e in enumerate(end)]
                    + [(float(s), 1, k) for k, s in enumerate(start)])
    held, used, kept = OrderedDict(), 0.0, 0.0
    for _, is_start, k in events:
        if is_start:
            if size[k] > capacity:
                continue
            while used + size[k] > capacity:
                used -= held.popitem(last=False)[1]
            held[k] = size[k]
            used += size[k]
        elif k in held:
            used -= held.pop(k)
            kept += tokens[k]
    total = float(np.sum(tokens))
    return kept / total if total else 0.0


def _parked(start, end, size):
    """(peak bytes parked at once, mean bytes parked while any unit is)."""
    events = sorted([(float(s), 1, b) for s, b in zip(start, size)]
                    + [(float(e), 0, b) for e, b in zip(end, size)])
    now, peak, area, busy, open_ = 0.0, 0.0, 0.0, 0.0, 0.0
    for t, is_start, b in events:
        if open_ > 0:
            area += open_ * (t - now)
            busy += t - now
        now = t
        open_ += b if is_start else -b
        peak = max(peak, open_)
    return peak, (area / busy if busy > 0 else peak)


def tool_gap_eviction(result):
    """``(share lost, message, action)`` when turns after tool gaps lost their cached prefix
    (the module docstring), else None."""
    turns = getattr(result, "sessions", None)
    if turns is None:
        return None
    req, cfg = result.requests, result.config
    prev = turns["prev"].to_numpy()
    reusable = turns["reusable"].to_numpy()
    done = (req["status"] == "finished").to_numpy()
    p = np.where(prev >= 0, prev, 0)
    arrival, finish = req["arrival_time"].to_numpy(), req["finish_time"].to_numpy(np.float64)
    replica = req["replica"].to_numpy()
    after = ((prev >= 0) & (turns["gap_s"].to_numpy() > 0) & (reusable > 0) & done & done[p]
             & (replica == replica[p]) & (arrival >= finish[p]))
    n = int(after.sum())
    if not n:
        return None
    evicted = np.where(after, np.maximum(reusable - req["num_cached_tokens"].to_numpy(), 0), 0)
    lost = evicted > 0
    share = float(lost.sum()) / n
    if share < LOST_PREFIX:
        return None
    message = (f"{share:.0%} of {n:,} turns after a tool gap lost their cached prefix "
               f"({int(evicted.sum()):,} tokens evicted while the client ran a tool)")
    per_block = _block_bytes(cfg)
    if per_block is None:
        return share, message, ("a larger KV pool, shorter tool gaps, or a KV offload tier "
                                "(kv_offload) to keep the contexts")
    blocks = -(-evicted[lost] // cfg.block_size)
    size = blocks * per_block
    start, end = finish[p][lost], arrival[lost]
    peak, mean = _parked(start, end, size)
    kept = fifo_kept(start, end, size, evicted[lost], mean)
    message += f"; an offload tier of {mean / 1e9:.3g} GB would keep {kept:.0%} of it"
    action = (f"add a KV offload tier (kv_offload; {peak / 1e9:.3g} GB is the most parked at "
              f"once; estimate: the evicted blocks' KV bytes held first-in-first-out from each "
              f"answer to the next turn), a larger KV pool, or shorter tool gaps")
    return share, message, action
