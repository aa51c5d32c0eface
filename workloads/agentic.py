"""Agentic sessions: multi-turn sessions with tool-call gaps, growing contexts and sub-agents.

An agent's session is a conversation (``session_id``, ``turn``) whose turns wait on tools: after
a turn's answer the client runs a tool for ``gap_s`` seconds and only then sends the next turn,
whose prompt is the whole context so far (the previous prompt and answer) plus the tool's result
(``new_tokens``). A turn may also fan out: ``fan_out`` sub-agents, each a session of its own
whose rows name the turn that spawned it in ``parent`` (that turn's ``request_id``), start when
that turn's answer is finished; with ``join`` the parent's next turn waits until its sub-agents'
sessions are over (an orchestrator gathering its workers' results).

Columns beyond the schema's (:mod:`workloads.schema`, checked by :func:`check_columns`):

| column | meaning |
|---|---|
| ``gap_s`` | float seconds >= 0 (empty: 0): the turn is issued no sooner than this long after the previous turn's answer finished (a sub-agent's first turn: after its parent turn's) |
| ``parent`` | the ``request_id`` of the turn that spawns this session (empty: a root session, which a closed loop's user takes up) |
| ``join`` | bool (empty: True): the parent's next turn waits for this session to end |

Invariants of :func:`agentic`: a session's prompts grow turn by turn (turn ``t + 1``'s prompt is
turn ``t``'s prompt + answer + new tokens), its ``hash_ids`` extend the previous turn's over
every full block of that context, so a prefix cache that kept the context hits all of it;
sub-agents start from the shared system prompt only (fresh contexts); ``arrival_time`` is the
open-loop lower bound (a session's start plus its gaps, a sub-agent at its parent's arrival),
which a closed loop (``workloads.ClosedLoop``, :mod:`sim.engine.fleet.clients`) replaces by the
issue times that honour the answers, the gaps and the joins.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .arrivals import _count, _pos, _rng, poisson
from .generators import _BlockIds, _hash_ids, _int_at_least
from .lengths import as_distribution
from .schema import MUST, _booleans, _first_bad, _plain, validate

SESSION_COLUMNS = ("gap_s", "parent", "join")


class Exponential:
    """Durations (seconds, floats) drawn exponentially with mean ``mean`` (>= 0): a tool's
    run time. ``sample(n, rng)`` as the length distributions, without their rounding."""

    def __init__(self, mean):
        self.mean = _pos("mean", mean, allow_zero=True)

    def __repr__(self):
        return f"Exponential(mean={self.mean!r})"

    def sample(self, n, rng=None):
        n = _count(n)
        return rng.exponential(self.mean, n) if self.mean else np.zeros(n)


def _durations(name, spec, n, rng) -> np.ndarray:
    """``n`` seconds from ``spec``: a number (fixed) or anything with ``sample(n, rng)``."""
    if isinstance(spec, (int, float, np.integer, np.floating)) and not isinstance(spec, bool):
        if not (np.isfinite(spec) and spec >= 0):
            raise ValueError(f"{name} must be a finite number of seconds >= 0, got "
                             f"{_plain(spec)!r}")
        return np.full(n, float(spec))
    if not callable(getattr(spec, "sample", None)):
        raise TypeError(f"{name} must be seconds or a distribution with sample(n, rng), got "
                        f"{spec!r}")
    out = np.asarray(spec.sample(n, rng), dtype=np.float64)
    bad = ~np.isfinite(out) | (out < 0)
    if bad.any():
        raise ValueError(f"{name}: its distribution drew {_plain(out[_first_bad(bad)])!r} "
                         f"(must be seconds >= 0)")
    return out


def _counts(name, spec, n, rng) -> np.ndarray:
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        _int_at_least(name, spec, 0)
        return np.full(n, int(spec), dtype=np.int64)
    return as_distribution(spec, name).sample(n, rng)


def agentic(sessions, *, turns, tool_gap, new_tokens=200, output=100, fan_out=0,
            sub_turns=None, join=True, rate=None, system_prompt_tokens=0, block_size=16,
            seed=0) -> pd.DataFrame:
    """``sessions`` root agent sessions of ``turns`` turns (an int or a length distribution),
    each turn's prompt the context so far plus ``new_tokens``, its answer ``output`` tokens,
    the gap before each later turn drawn from ``tool_gap`` (seconds: a number or a distribution
    with ``sample(n, rng)``, e.g. :class:`Exponential`). Every root turn but the last spawns
    ``fan_out`` (an int >= 0 or a distribution) sub-agents of ``sub_turns`` turns (default
    ``turns``), which fan out no further; ``join``: the parent waits for them. Root sessions
    start as a Poisson process at ``rate`` (None: all at 0, for a closed loop)."""
    rng = _rng(seed)
    n_roots = _count(sessions)
    _int_at_least("system_prompt_tokens", system_prompt_tokens, 0)
    _int_at_least("block_size", block_size, 1)
    starts = np.zeros(n_roots) if rate is None else poisson(n_roots, _pos("rate", rate), rng)
    n_turns = as_distribution(turns, "turns").sample(n_roots, rng)
    ids = _BlockIds()
    system = (("sys", 0), system_prompt_tokens)
    rows = []  # (arrival, prompt, output, session, turn, gap, parent key, hash ids)
    next_session = [n_roots]

    def session(s, start, n, parent, spawn):
        gaps = _durations("tool_gap", tool_gap, n, rng)
        gaps[0] = 0.0  # (a session's first turn: issued when its user or parent is ready)
        news = as_distribution(new_tokens, "new_tokens").sample(n, rng)
        outs = as_distribution(output, "output").sample(n, rng)
        kids = _counts("fan_out", fan_out, n, rng) if spawn else np.zeros(n, dtype=np.int64)
        t, context = start, system_prompt_tokens
        for turn in range(n):
            t += gaps[turn]
            prompt = context + int(news[turn])
            rows.append((t, prompt, int(outs[turn]), s, turn, float(gaps[turn]), parent,
                         _hash_ids(ids, ("session", s), prompt, block_size, system)))
            context = prompt + int(outs[turn])
            if turn < n - 1:
                for _ in range(int(kids[turn])):
                    sub = next_session[0]
                    next_session[0] += 1
                    session(sub, t, int(sub_n.sample(1, rng)[0]), (s, turn), False)

    sub_n = as_distribution(turns if sub_turns is None else sub_turns)
    for s in range(n_roots):
        session(s, float(starts[s]), int(n_turns[s]), None, True)
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])  # stable: ties keep draw order
    rid = {(rows[i][3], rows[i][4]): k for k, i in enumerate(order)}
    cols = list(zip(*(rows[i] for i in order)))
    df = pd.DataFrame({"arrival_time": cols[0], "num_prompt_tokens": cols[1],
                       "num_output_tokens": cols[2], "session_id": cols[3], "turn": cols[4],
                       "gap_s": cols[5],
                       "parent": pd.array([pd.NA if p is None else rid[p] for p in cols[6]],
                                          dtype="Int64"),
                       "join": bool(join), "hash_ids": list(cols[7])})
    df.attrs["block_size"] = block_size
    return validate(df)


AGENTIC_NAME = "agentic"  # the named workload (workloads.load, sim run -w agentic)
NAMED_TURNS, NAMED_GAP_S, NAMED_NEW, NAMED_OUTPUT, NAMED_REQUESTS = 8, 5.0, 2900, 200, 512


def load_agentic(n=None, rate=None, seed=0, hash_block_tokens=None, arrival="poisson",
                 cv=1.0, arrival_times=None) -> pd.DataFrame:
    """The named ``agentic`` workload: coding-agent sessions shaped as the LMSYS HiCache
    post's community report (dialogues past 25K tokens over about 8 turns): ``NAMED_TURNS``
    turns of ``NAMED_NEW`` new tokens and ``NAMED_OUTPUT``-token answers, tool gaps
    exponential of mean ``NAMED_GAP_S`` s, no sub-agents. ``n`` requests (default
    ``NAMED_REQUESTS``): the first ``n`` in arrival order of ``ceil(n / 8)`` sessions;
    ``rate`` requests/s: sessions start as a Poisson process at ``rate / 8`` (None: all at
    0, for a closed loop). Other shapes: :func:`agentic`. Arguments that would shape a trace's
    arrivals (``arrival``, ``cv``, ``arrival_times``) or its blocks are an error."""
    if arrival_times is not None or arrival != "poisson" or cv != 1.0:
        raise ValueError(f"arrival=, cv= and arrival_times= do not shape {AGENTIC_NAME!r}: "
                         f"its sessions start at rate= (or all at 0) and wait their tool gaps")
    if hash_block_tokens is not None:
        raise ValueError(f"hash_block_tokens applies to workload files, not {AGENTIC_NAME!r} "
                         f"(its hash_ids are 16-token blocks)")
    n = NAMED_REQUESTS if n is None else _count(n)
    df = agentic(-(-n // NAMED_TURNS), turns=NAMED_TURNS, tool_gap=Exponential(NAMED_GAP_S),
                 new_tokens=NAMED_NEW, output=NAMED_OUTPUT,
                 rate=None if rate is None else _pos("rate", rate) / NAMED_TURNS, seed=seed)
    out = df.iloc[:n].drop(columns="request_id", errors="ignore").reset_index(drop=True)
    out.attrs.update(df.attrs)
    return validate(out)


def check_columns(df, where="") -> None:
    """The session columns of ``df`` (a validated workload with ``request_id``), checked; a
    bad one is a one-line ``ValueError`` naming the column, row and value: a negative or
    non-finite ``gap_s``, a ``parent`` without ``session_id``, naming no request of the file, a
    turn of its own session, differing between a session's rows, or in a cycle of sessions."""
    if "gap_s" in df.columns:
        raw = df["gap_s"]
        gaps = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
        bad = (~np.isfinite(gaps) | (gaps < 0)) & raw.notna().to_numpy() | _booleans(raw)
        if bad.any():
            i = _first_bad(bad)
            raise ValueError(f"{where}gap_s: row {i} has {_plain(raw.iloc[i])!r} "
                             f"({MUST['gap_s']})")
    if "parent" not in df.columns:
        return
    if "session_id" not in df.columns:
        raise ValueError(f"{where}parent: the workload has no session_id column (a parent "
                         f"spawns sessions)")
    row_of = {rid: i for i, rid in enumerate(df["request_id"].tolist())}
    sessions = df["session_id"].tolist()
    parent_of = {}  # session -> the session of its parent turn
    for i, (p, s) in enumerate(zip(df["parent"].tolist(), sessions)):
        if p is None or p is pd.NA or isinstance(p, float) and p != p:
            continue
        if isinstance(p, float) and p == int(p) and p not in row_of:  # (a CSV's NaN column)
            p = int(p)
        j = row_of.get(p)
        if j is None:
            raise ValueError(f"{where}parent: row {i} names request {_plain(p)!r}, which is "
                             f"not in the workload")
        if s is None or isinstance(s, float) and s != s:
            raise ValueError(f"{where}parent: row {i} has a parent but no session_id")
        if sessions[j] == s:
            raise ValueError(f"{where}parent: row {i} names request {_plain(p)!r} of its own "
                             f"session {_plain(s)!r}")
        if parent_of.setdefault(s, (sessions[j], p))[1] != p:
            raise ValueError(f"{where}parent: row {i} names request {_plain(p)!r} but session "
                             f"{_plain(s)!r} was spawned by request "
                             f"{_plain(parent_of[s][1])!r}")
    for s in parent_of:
        seen, up = {s}, parent_of[s][0]
        while up in parent_of:
            if up in seen:
                raise ValueError(f"{where}parent: session {_plain(s)!r} is its own ancestor "
                                 f"(a cycle of parents: none of them could start)")
            seen.add(up)
            up = parent_of[up][0]
