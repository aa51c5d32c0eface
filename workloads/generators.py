"""Synthetic workloads: independent requests, shared system prompts, multi-turn conversations.

Prefix-sharing generators emit ``hash_ids`` at KV-block granularity (``attrs["block_size"]``):
block ``k`` of a prompt gets an id that stands for its exact content, so two prompts share block
``k`` exactly when they share tokens ``0 .. (k+1) * block_size``. A block only partly filled by a
shared prefix is not shared (the cheat sheet: keep the shared prefix identical from the first
token, and a multiple of the block size if you can).
"""

from __future__ import annotations

import gc
import itertools

import numpy as np
import pandas as pd

from .arrivals import _count, _pos, _rng, constant, cv_for, drawn_at, gamma, poisson
from .lengths import as_distribution
from .schema import _plain, validate


def _arrivals(n, rate, arrival, cv, rng):
    cv_for(arrival, cv)
    if arrival == "poisson":
        return poisson(n, rate, rng)
    if arrival == "gamma":
        return gamma(n, rate, cv, rng)
    if arrival == "constant":
        return constant(n, rate)
    raise ValueError(f"arrival must be 'poisson', 'gamma' or 'constant', got {arrival!r}")


def _drawn(df, rate, arrival, cv):
    """``df`` marked with the rate its arrivals were drawn at (``workloads.drawn_at``)."""
    return drawn_at(df, rate, {"poisson": 1.0, "constant": 0.0}.get(arrival, cv))


def synthetic(n, *, rate, prompt, output, arrival="poisson", cv=1.0, seed=0) -> pd.DataFrame:
    """``n`` independent requests: lengths from ``prompt``/``output`` (an int or a distribution
    from :mod:`workloads.lengths`), arrivals from ``arrival`` at ``rate`` requests/s."""
    rng = _rng(seed)
    n = _count(n)
    times = _arrivals(n, _pos("rate", rate), arrival, cv, rng)
    p = as_distribution(prompt, "prompt").sample(n, rng)
    o = as_distribution(output, "output").sample(n, rng)
    return _drawn(validate(pd.DataFrame({"arrival_time": times, "num_prompt_tokens": p,
                                         "num_output_tokens": o})), rate, arrival, cv)


class _BlockIds:
    """Content ids for blocks: the same (stream, block index, fill) -> the same id."""

    def __init__(self):
        self._ids = {}
        self._next = itertools.count()

    def __call__(self, key):
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = next(self._next)
        return got

    def take(self, n) -> int:
        """The first of ``n`` new ids for blocks no key will name again."""
        first = next(self._next)
        if n > 1:
            self._next = itertools.count(first + n)
        elif n == 0:
            self._next = itertools.count(first)
        return first


def _hash_ids(ids, stream, prompt, block_size, shared=None):
    """Block ids of a prompt. ``shared=(stream, tokens)``: its first ``tokens`` tokens are that
    shared stream's."""
    out = []
    for k in range(-(-prompt // block_size)):
        end = min((k + 1) * block_size, prompt)
        fill = end - k * block_size
        if shared is not None and end <= shared[1]:
            out.append(ids((shared[0], k, fill)))
        else:
            out.append(ids((stream, k, fill)))
    return out


def _shared_prefix_ids(prompts, groups, system_tokens, block_size):
    """Each prompt's block ids, as ``_hash_ids`` numbers them (ids in order of first sight):
    its blocks within the system prompt are its group's (a block ending past the system
    prompt is its own), the rest its own, never seen before. Its group's ids are looked up
    once per distinct run of shared blocks and its own are the next ids in order (100k
    2,000-token prompts: one dict lookup per block took most of 7 s)."""
    ids = _BlockIds()
    runs = {}  # (group, shared tokens) -> the ids of its shared blocks
    out = []
    was = gc.isenabled()
    gc.disable()  # a million new ints in lists: no collector passes over them meanwhile
    try:
        for p, g in zip(prompts, groups):
            blocks = -(-p // block_size)
            # blocks ending within the system prompt (the last one may end at the prompt's end)
            shared = min(blocks, system_tokens // block_size + (p <= system_tokens
                                                                and p % block_size > 0))
            tokens = min(p, shared * block_size)  # (its last shared block may be partial)
            key = (g, tokens)
            mine = runs.get(key)
            if mine is None:
                mine = runs[key] = _hash_ids(ids, None, tokens, block_size,
                                             (("sys", g), system_tokens))
            first = ids.take(blocks - shared)
            out.append(mine + list(range(first, first + blocks - shared)))
    finally:
        if was:
            gc.enable()
    return out


def _int_at_least(name, value, low) -> None:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {_plain(value)!r}")


def shared_prefix(n, *, n_groups, system_prompt_tokens, user_tokens, output, rate,
                  arrival="poisson", cv=1.0, block_size=16, seed=0) -> pd.DataFrame:
    """``n`` requests in ``n_groups`` groups; every prompt of a group starts with the same system
    prompt of ``system_prompt_tokens`` tokens, followed by its own ``user_tokens``."""
    rng = _rng(seed)
    n = _count(n)
    _int_at_least("n_groups", n_groups, 1)
    _int_at_least("system_prompt_tokens", system_prompt_tokens, 0)
    _int_at_least("block_size", block_size, 1)
    times = _arrivals(n, _pos("rate", rate), arrival, cv, rng)
    groups = rng.integers(0, n_groups, n)
    user = as_distribution(user_tokens, "user_tokens").sample(n, rng)
    out = as_distribution(output, "output").sample(n, rng)
    prompts = system_prompt_tokens + user
    hashes = _shared_prefix_ids(prompts.tolist(), groups.tolist(), system_prompt_tokens,
                                block_size)
    df = pd.DataFrame({"arrival_time": times, "num_prompt_tokens": prompts,
                       "num_output_tokens": out, "group": groups, "hash_ids": hashes})
    df.attrs["block_size"] = block_size
    return _drawn(validate(df), rate, arrival, cv)


def multi_turn(n_conversations, *, turns, user_tokens, output, rate, think_time=5.0,
               system_prompt_tokens=0, block_size=16, seed=0) -> pd.DataFrame:
    """Conversations starting as a Poisson process at ``rate``; turn ``t``'s prompt holds the
    system prompt, every earlier turn (user tokens and the model's output) and its new user
    tokens. Turn ``t + 1`` arrives an exponential ``think_time`` (mean, seconds) after turn ``t``
    (open loop; see ``ClosedLoop`` for a loop closed on completions)."""
    rng = _rng(seed)
    n_conv = _count(n_conversations)
    think_time = _pos("think_time", think_time, allow_zero=True)
    _int_at_least("system_prompt_tokens", system_prompt_tokens, 0)
    _int_at_least("block_size", block_size, 1)  # (0 divided by zero, -1 gave no hash ids)
    starts = poisson(n_conv, _pos("rate", rate), rng)
    n_turns = as_distribution(turns, "turns").sample(n_conv, rng)
    ids = _BlockIds()
    rows = []
    for c in range(n_conv):
        t = starts[c]
        context = system_prompt_tokens
        users = as_distribution(user_tokens, "user_tokens").sample(int(n_turns[c]), rng)
        outs = as_distribution(output, "output").sample(int(n_turns[c]), rng)
        for turn in range(int(n_turns[c])):
            prompt = context + int(users[turn])
            rows.append((t, prompt, int(outs[turn]), c, turn,
                         _hash_ids(ids, ("conv", c), prompt, block_size,
                                   (("sys", 0), system_prompt_tokens))))
            context = prompt + int(outs[turn])
            t += rng.exponential(think_time) if think_time else 0.0
    rows.sort(key=lambda r: r[0])
    df = pd.DataFrame(rows, columns=["arrival_time", "num_prompt_tokens", "num_output_tokens",
                                     "session_id", "turn", "hash_ids"])
    df.attrs["block_size"] = block_size
    return validate(df)


def ideal_prefix_hit_ratio(df: pd.DataFrame) -> float:
    """Fraction of prompt blocks an infinite prefix cache would hit, in arrival order: block ``k``
    of a request hits when an earlier request had the same ids in blocks ``0..k``. Rows without
    ids (None, NaN) have no blocks, as in :func:`ideal_prefix_hit_rate`."""
    if "hash_ids" not in df.columns:
        raise ValueError("workload has no hash_ids column")
    children = {}  # (parent node, block id) -> node
    next_node = itertools.count(1)
    hits = total = 0
    for ids in df["hash_ids"]:
        if not isinstance(ids, (list, tuple, np.ndarray)):
            continue
        node, matching = 0, True
        for h in ids:
            key = (node, h)
            child = children.get(key)
            if child is None:
                matching = False
                child = children[key] = next(next_node)
            elif matching:
                hits += 1
            node = child
            total += 1
    return hits / total if total else float("nan")
