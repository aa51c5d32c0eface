"""Closed-loop clients: ``num_users`` users; each issues its next request ``think_time`` after
its previous one finished or was rejected. One event per request. A loop that honours arrival
times (``workloads.MaxConcurrency``) issues a request at the later of that moment and its
``arrival_time``: at most ``num_users`` out at once, none sent early (a client's semaphore).

What a user issues next: the next request in workload order, or - when the workload has
conversations (a ``session_id`` column: :func:`conversations`) - the next turn of the
conversation it holds, and the next conversation (in order of first turns) once that one is
over, as multi-turn benchmark clients do (vLLM's ``benchmark_serving_multi_turn.py``: a client
sends a conversation's turns in order, each after the answer to the previous one). So a turn
is never issued before the turn it follows finished (its history is in the prompt).

A rejected turn ends its conversation, as in that client (vllm-project/vllm@00d39539,
benchmarks/multi_turn/benchmark_serving_multi_turn.py, ``client_main``: a turn that fails
after its retries - none by default, ``--max-retries 0`` - counts as a failure and its
conversation is removed from the active ones, "should not be used again"; the client then
sleeps as after any request and takes up its next conversation). The conversation's later
turns are never sent: they come out rejected at that moment (``arrival_time`` now, reason
starting with :data:`~sim.results.metrics.CONVERSATION_ABANDONED`), taking none of the user's
time; the user issues the first turn of its next conversation ``think_time`` after the
rejection, as after any other. (That client also stops altogether on a timeout or an
exception; no request here times out.) Without conversations each request is a conversation
of its own: the next request in workload order, nothing abandoned.

Shared by one replica (:mod:`sim.engine.simulation`) and a cluster or disaggregated pools
(:mod:`sim.engine.fleet.cluster`): ``submit(r) -> bool`` queues (or routes) a request issued now,
False when it was rejected; each replica's ``on_finish`` hook reports a completion (chained
after a hook already there); abandoned turns are recorded by the first replica's ``reject``
verb (never routed: their ``replica`` reads -1 in a cluster). Bound methods, not closures that
refer to one another: no reference cycle keeps the requests alive once the run is over.

Agentic sessions (:mod:`sim.engine.fleet.sessions`: ``gap_s``, ``parent``, ``join``): a turn
is also held its ``gap_s`` past that moment; a finished turn's sub-agent sessions start at
once, each run by a user of its own beside the ``num_users`` (so more requests may be out),
and a joined parent issues its next turn (think time, gap) only once they are all over; a
rejected or abandoned turn's sub-agents are abandoned (tests/test_agentic.py).

A request path (``path``: a :class:`~sim.engine.fleet.request_path.ClosedPath`) puts the
client outside the engine: a request issued now reaches the engine (``submit``) when the path
says (after ``in_s`` and the tokeniser's queue), and the user sees a finish or a rejection
``out_s`` after the engine's: what follows it (think time, gap, sub-agents, the conversation's
abandoned turns) runs from then. Without a path (None) every request is submitted as issued.

Invariants (tests/test_clients.py): every request comes out once, issued (finished or
rejected) or abandoned; at most ``num_users`` requests are out at once (sub-agents aside); a
conversation's turns are issued in order, each at or after the previous turn's finish
(+ ``think_time`` + ``gap_s``); the turns after a rejected one are abandoned, none issued.
"""

from __future__ import annotations

from functools import partial
from itertools import count

from ...results.metrics import CONVERSATION_ABANDONED
from .sessions import plan


def conversations(df, requests):
    """``requests`` grouped by the workload's ``session_id`` column, in order of each
    conversation's first request, turns in the order of the ``turn`` column where the
    workload has one without gaps (stable: equal turns keep workload order), else in workload
    order (a request without an id - None, NaN, ``pd.NA`` - is a conversation of its own);
    None when there is no such column. An id that is no dict key (a list) is a ``TypeError``
    naming its row."""
    if "session_id" not in df.columns:
        return None
    groups, order = {}, []
    ids = df["session_id"]
    for row, (r, s, missing) in enumerate(zip(requests, ids.tolist(), ids.isna().tolist())):
        if missing:  # no conversation
            order.append([r])
            continue
        try:
            turns = groups.get(s)
        except TypeError:
            raise TypeError(f"workload column session_id: row {row} holds {s!r}, not an id "
                            f"(a conversation's id is a number or a string)") from None
        if turns is None:
            turns = groups[s] = []
            order.append(turns)
        turns.append(r)
    if "turn" in df.columns and not df["turn"].isna().any():
        turn = df["turn"].tolist()  # (a turn's request, by its index in the workload)
        order = [sorted(c, key=lambda r: turn[r.index]) if len(c) > 1 else c for c in order]
    return plan(df, order)  # (agentic sessions: gaps and sub-agents, fleet.sessions)


class ClosedLoopClients:
    """The users of ``loop`` (a ``workloads.ClosedLoop``) issuing the ``conversations`` (lists
    of requests, see :func:`conversations`) one per user, or, without, ``requests`` in
    order: each one a conversation of its own."""

    def __init__(self, env, replicas, requests, submit, loop, conversations=None, path=None):
        self.env, self.submit, self.path = env, submit, path
        self.out = path.out_s if path is not None else 0.0  # (the client sees an end later)
        self.think = float(loop.think_time)
        # a loop that honours arrival times (workloads.MaxConcurrency, vLLM's --max-concurrency)
        # sends no request before its arrival_time: a user holds it until then
        self.paced = bool(getattr(loop, "honours_arrival_times", False))
        self.held = {}  # user -> the request it sends at its arrival time
        self.pending = iter(conversations) if conversations is not None else (
            [r] for r in requests)
        self.turns = {}  # user -> iterator over the turns left of its conversation
        self.user_of = {}  # request index -> the user who issued it (until it finishes)
        self.reject = replicas[0].reject  # (abandoned turns: never routed)
        # agentic sessions (fleet.sessions.Sessions): a turn's tool gap, and sub-agents run by
        # users of their own (numbered from num_users) that end with their session
        self.gap = getattr(conversations, "gap", None)
        self.children = getattr(conversations, "children", None) or {}
        self.joins = getattr(conversations, "joins", None)
        self.roots, self.subs = int(loop.num_users), count(int(loop.num_users))
        self.parent_of, self.waiting = {}, {}  # sub-user -> the user it joins; user -> count
        for rep in replicas:
            rep.on_finish = chain(rep.on_finish, self._done)
        for user in range(int(loop.num_users)):
            self._issue(user)

    def _issue(self, user, _event=None):
        """``user``'s next turn. A loop, not _issue -> _done -> _issue: with no think time a
        user moves straight on after a rejection, and a run of rejections (a workload of
        prompts over max_model_len) would otherwise recurse once per request, past Python's
        recursion limit."""
        while True:
            turns = self.turns.get(user)
            r = self.held.pop(user, None)
            if r is None:
                r = None if turns is None else next(turns, None)
                if r is None:  # its conversation is over (or it held none): the next one
                    if user >= self.roots:  # a sub-agent's: its user ends with it
                        self.turns.pop(user, None)
                        self._joined(user)
                        return
                    conversation = next(self.pending, None)
                    if conversation is None:
                        self.turns.pop(user, None)
                        return
                    self.turns[user] = iter(conversation)
                    continue
                due = self.env.now if self.gap is None else self.env.now + self.gap[r.index]
                if self.paced and r.arrival_time > due:
                    due = r.arrival_time
                if due > self.env.now:
                    self.held[user] = r
                    self.env.timeout(due - self.env.now).callbacks.append(
                        partial(self._issue, user))
                    return
            r.arrival_time = self.env.now
            self.user_of[r.index] = user
            if self.path is not None:  # (the engine receives it later: request_path)
                e = r.arrival_time = self.path.issue(r, self.env.now)
                if e > self.env.now:
                    self.env.timeout(e - self.env.now).callbacks.append(
                        partial(self._enter, user, r))
                    return
                if not self.submit(r):
                    self._seen_rejected(user, r)
                return
            if self.submit(r):
                return
            del self.user_of[r.index]
            self._drop_children(r)
            self._abandon(turns, r)
            if self.think > 0:
                self.env.timeout(self.think).callbacks.append(partial(self._issue, user))
                return

    def _enter(self, user, r, _event=None):
        """``r`` (issued by ``user``) reaches the engine now, through the request path."""
        if not self.submit(r):
            self._seen_rejected(user, r)

    def _seen_rejected(self, user, r):
        """The engine rejected ``r`` now: its client sees it ``out_s`` later."""
        if self.out:
            self.env.timeout(self.out).callbacks.append(partial(self._rejected, user, r))
        else:
            self._rejected(user, r)

    def _rejected(self, user, r, _event=None):
        """The client of ``user`` sees ``r`` rejected (a request path's): as in _issue."""
        del self.user_of[r.index]
        self._drop_children(r)
        self._abandon(self.turns.get(user, ()), r)
        self._resume(user)

    def _abandon(self, turns, rejected):
        """Reject now the turns left in ``turns``, the conversation whose turn ``rejected``
        was just rejected (exhausting the iterator: the user's next is a new conversation)."""
        now = self.env.now
        for r in turns:
            r.arrival_time = now
            if self.path is not None:
                self.path.gave_up(r, now)
            self.reject(r, f"{CONVERSATION_ABANDONED}: an earlier turn of its conversation "
                           f"(request {rejected.request_id}) was rejected")
            self._drop_children(r)

    def _drop_children(self, r):
        """Reject now the sub-agent sessions ``r`` (rejected or abandoned) would have
        spawned, and theirs: never started, as a turn never answered starts none."""
        for conversation in self.children.pop(r.index, ()):
            for t in conversation:
                t.arrival_time = self.env.now
                if self.path is not None:
                    self.path.gave_up(t, self.env.now)
                self.reject(t, f"{CONVERSATION_ABANDONED}: its parent turn (request "
                               f"{r.request_id}) was never answered")
                self._drop_children(t)

    def _joined(self, sub):
        """Sub-agent user ``sub``'s session is over: its parent resumes once it waits for
        no other."""
        user = self.parent_of.pop(sub, None)
        if user is None:
            return
        self.waiting[user] -= 1
        if not self.waiting[user]:
            del self.waiting[user]
            self._resume(user)

    def _done(self, r, _now):
        if self.out:  # (a request path's: the client sees the finish out_s later)
            self.env.timeout(self.out).callbacks.append(partial(self._finished, r))
        else:
            self._finished(r)

    def _finished(self, r, _event=None):
        """The client of ``r`` sees it finish: its sub-agents start, its user moves on."""
        user = self.user_of.pop(r.index)
        subs = []
        for conversation in self.children.pop(r.index, ()):  # its sub-agents start now
            subs.append(next(self.subs))
            self.turns[subs[-1]] = iter(conversation)
            if self.joins[id(conversation)]:
                self.parent_of[subs[-1]] = user
                self.waiting[user] = self.waiting.get(user, 0) + 1
        joined = user in self.waiting  # (then _joined resumes it, once, after the last one)
        for sub in subs:
            self._issue(sub)
        if not joined:
            self._resume(user)

    def _resume(self, user):
        """``user`` issues its next turn ``think_time`` from now."""
        if self.think > 0:
            self.env.timeout(self.think).callbacks.append(partial(self._issue, user))
        else:
            self._issue(user)


def chain(first, then):
    """One ``on_finish`` callback calling ``first`` (if any) then ``then``."""
    if first is None:
        return then

    def both(r, now):
        first(r, now)
        then(r, now)
    return both
