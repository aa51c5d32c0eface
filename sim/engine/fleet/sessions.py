"""Agentic sessions for the closed-loop clients: tool gaps and sub-agents
(:mod:`workloads.agentic` writes the columns, :mod:`sim.engine.fleet.clients` honours them).

:func:`plan` turns a workload's conversations into :class:`Sessions`: the root conversations
(those a closed loop's users take up, in order of first turns), each request's ``gap`` (its
``gap_s``: seconds it waits after the moment it would otherwise be issued) and, per spawning
turn, its sub-agent sessions with whether the parent waits for each (``join``). A sub-agent
session needs no user: it starts when its parent turn's answer finishes and ends with its last
turn (or its first rejected one); its own sub-agents nest the same way.

:func:`gap_turns` is what the tool-gap finding reads from a run (``Result.sessions``):
per request, its previous turn's row and the prompt tokens of that turn's context (prompt and
cached answer) that a prefix cache which evicted nothing would serve it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


class Sessions(list):
    """The root conversations (a list, as :func:`~sim.engine.fleet.clients.conversations`
    returns) plus ``gap`` (request index -> seconds), ``children`` (request index -> its
    sub-agent conversations) and ``joins`` (id of a sub-agent conversation -> the parent waits
    for it)."""

    def __init__(self, roots, gap, children, joins):
        super().__init__(roots)
        self.gap, self.children, self.joins = gap, children, joins


def _filled(df, column, default):
    if column not in df.columns:
        return None
    return df[column].astype(object).where(df[column].notna(), default).tolist()


def plan(df, order):
    """``order`` (conversations, lists of requests) as :class:`Sessions` when the workload has
    ``gap_s`` or ``parent`` (checked by ``workloads.validate``); else ``order`` itself."""
    if order is None or ("gap_s" not in df.columns and "parent" not in df.columns):
        return order
    gaps = _filled(df, "gap_s", 0.0)
    gap = np.zeros(len(df)) if gaps is None else np.asarray(gaps, dtype=np.float64)
    parents = _filled(df, "parent", None)
    joins_col = _filled(df, "join", True)
    if parents is None:
        return Sessions(order, gap, {}, {})
    row_of = {rid: i for i, rid in enumerate(df["request_id"].tolist())}
    roots, children, joins = [], {}, {}
    for conv in order:
        first = conv[0].index
        p = parents[first]
        if p is None:
            roots.append(conv)
            continue
        j = row_of.get(p)
        j = row_of[int(p)] if j is None else j  # (a float id read back from a file)
        children.setdefault(j, []).append(conv)
        joins[id(conv)] = bool(joins_col[first]) if joins_col is not None else True
    return Sessions(roots, gap, children, joins)


def gap_turns(df, requests, block_size):
    """Per request of ``df`` (workload order): ``prev`` (the row of its conversation's previous
    turn in workload order, as the engine pairs answers with next turns; -1 for a first turn),
    ``gap_s`` and ``reusable``: the tokens of its leading full blocks that its previous turn's
    prompt or cached answer holds (the engine's block keys, ``block_keys``/``output_keys``),
    capped at ``(prompt - 1) // block_size`` blocks as the block cache caps a hit - what the
    prefix cache serves when nothing was evicted during the gap. None without ``gap_s`` or
    ``session_id``, or when the requests carry no keys (prefix caching off, or radix mode)."""
    if "gap_s" not in df.columns or "session_id" not in df.columns:
        return None
    if not any(r.block_keys is not None for r in requests):
        return None
    from workloads.prefix import next_turns
    prev = np.full(len(df), -1, dtype=np.int64)
    reusable = np.zeros(len(df), dtype=np.int64)
    for p, i in enumerate(next_turns(df["session_id"].tolist())):
        if i < 0:
            continue
        prev[i] = p
        a, b = requests[i], requests[p]
        if a.block_keys is None or b.block_keys is None:
            continue
        held = set(b.block_keys) | set(b.output_keys if b.output_keys is not None else ())
        cap = (a.num_prompt_tokens - 1) // block_size
        n = 0
        for k in a.block_keys[:cap]:
            if k not in held:
                break
            n += 1
        reusable[i] = n * block_size
    gap = pd.to_numeric(df["gap_s"], errors="coerce").fillna(0.0).to_numpy(dtype=np.float64)
    return pd.DataFrame({"prev": prev, "gap_s": gap, "reusable": reusable})
