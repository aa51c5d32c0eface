"""Closed-loop clients: ``num_users`` users; each issues the next request (in workload order)
``think_time`` after its previous one finished or was rejected. One event per request.

Shared by one replica (:mod:`sim.engine.simulation`) and a cluster or disaggregated pools
(:mod:`sim.engine.cluster`): ``submit(r) -> bool`` queues (or routes) a request issued now,
False when it was rejected; each replica's ``on_finish`` hook reports a completion (chained
after a hook already there). Bound methods, not closures that refer to one another: no
reference cycle keeps the requests alive once the run is over.
"""

from __future__ import annotations


class ClosedLoopClients:
    """The users of ``loop`` (a ``workloads.ClosedLoop``) issuing ``requests`` in order."""

    def __init__(self, env, replicas, requests, submit, loop):
        self.env, self.submit = env, submit
        self.pending = iter(requests)
        self.think = float(loop.think_time)
        for rep in replicas:
            rep.on_finish = chain(rep.on_finish, self._done)
        for _ in range(int(loop.num_users)):
            self._issue()

    def _issue(self, _event=None):
        # A loop, not _issue -> _done -> _issue: with no think time a user moves straight on
        # after a rejection, and a run of rejections (a workload of prompts over max_model_len)
        # would otherwise recurse once per request, past Python's recursion limit.
        while (r := next(self.pending, None)) is not None:
            r.arrival_time = self.env.now
            if self.submit(r):
                return
            if self.think > 0:
                self.env.timeout(self.think).callbacks.append(self._issue)
                return

    def _done(self, _r, _now):
        if self.think > 0:
            self.env.timeout(self.think).callbacks.append(self._issue)
        else:
            self._issue()


def chain(first, then):
    """One ``on_finish`` callback calling ``first`` (if any) then ``then``."""
    if first is None:
        return then

    def both(r, now):
        first(r, now)
        then(r, now)
    return both
