"""The simulated engine in real time: its replicas' SimPy loop paced by the wall clock.

:class:`LiveEngine` runs the engine's own replica processes (:class:`~sim.engine.core.process.
ReplicaProcess`, the policy, the cost model, the KV pool: what ``sim.run`` runs; ``replicas`` of
them behind ``router``, as :class:`~sim.engine.fleet.cluster.Cluster` builds them) in a thread
of its own, all on one simulated clock. Its environment (:class:`PacedEnvironment`) never
advances the clock without an event (``sleep`` always schedules), so every iteration's end is an
event the driver loop runs only once the wall clock has reached it: simulated time ``t`` is wall
time ``start + t * scale`` (``--time-scale``). HTTP handlers put requests in a thread-safe inbox
with the wall time they arrived; the driver submits each one at its simulated arrival time
(``arrival_time = env.now``, set before any later event runs) at the replica the router picks
then (the cluster's rule: routed before any replica forms its batch at that time, each replica
seen as it stands) through the engine's arrival verb (:func:`~sim.engine.core.process.submit`),
as closed-loop clients do. Fast-forward is off: a stretch of decodes in one event would skip
past requests arriving meanwhile.

After each event the requests that gained tokens have them handed to their listener
(``listener(kind, n, now)``, called in the engine's thread: ``"tokens"`` with the number of new
tokens, then ``"done"`` with ``(request, replica index)``; or ``"rejected"`` with the reason at
once). A finished request is dropped (each replica's ``finished`` list is emptied, the iteration
records are not kept): memory is bounded by the requests in flight.

Invariants (tests/test_serve.py, tests/test_serve_replicas.py): every submitted request's
listener ends with exactly one ``"done"`` or ``"rejected"``, and each request is routed once,
to one replica, where it stays; tokens arrive in order and sum to its output tokens; the clock
never goes backwards; :meth:`stop` ends every request still in flight with ``"aborted"``, and
so does :meth:`abort` one request (its client left): taken out of the queue or the batch in
flight (the engine's preemption: its KV blocks freed), counted in ``counts["aborted"]``.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from heapq import heappush

from ..engine.config import as_config
from ..engine.core.events import NORMAL, Environment
from ..engine.core.process import ReplicaProcess, submit
from ..engine.core.request import DECODE, FINISHED, PREFILL, REJECTED, WAITING, Request
from ..engine.fleet.cluster import Cluster, new_replica, replica_policy
from ..engine.fleet.routers import ReplicaView, make_router
from ..engine.schedulers import resolve

__all__ = ["LiveEngine", "PacedEnvironment"]


class PacedEnvironment(Environment):
    """The engine's environment, never alone: ``sleep`` always schedules its wake-up, so the
    driver loop sees (and paces) every step of the clock."""

    def sleep(self, delay, wakeup):
        wakeup.callbacks = wakeup.resume
        heappush(self._queue, (self._now + delay, NORMAL, next(self._eid), wakeup))
        return False


class _Discard:
    """Where the iteration records go: nowhere (a long-running server keeps none)."""

    @staticmethod
    def frombytes(_row):
        return None


class LiveEngine:
    """``config.replicas`` simulated replicas behind ``config.router``, served in real time;
    ``scale``: wall seconds per simulated one.

    :meth:`add` (any thread) queues a request; :meth:`start` / :meth:`stop` run and end the
    engine's thread. ``snapshot``: (running, waiting, KV usage fraction) of all replicas
    together, ``snapshots``: each replica's, refreshed after each event; ``counts``: requests
    finished and rejected so far, ``routed``: requests routed to each replica."""

    pick = Cluster.pick  # the router's choice, checked (reads route, views, env, replicas)

    def __init__(self, config=None, scale: float = 1.0, **overrides):
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise ValueError(f"time_scale must be a number > 0, got {scale!r}")
        config = as_config(config)
        if overrides:
            from ..engine.schedulers import override
            config = override(config, **overrides)
        if config.disaggregation is not None:
            raise ValueError("sim serve does not take disaggregation (prefill and decode "
                             "pools): give replicas and a router")
        if config.closed_loop is not None:
            raise ValueError("sim serve takes its requests from its clients: no closed_loop")
        if config.engine_overheads != "none":  # (its clients' own time is real, not priced)
            raise ValueError(f"sim serve does not take engine_overheads "
                             f"({config.engine_overheads!r}): leave it none")
        self.config, policy = resolve(config)
        self.scale = float(scale)
        self.env = PacedEnvironment()
        kv_blocks, cost = self.config.resolved_kv_blocks(), self.config.resolved_cost_model()
        self.replicas, self.processes = [], []
        for k in range(self.config.replicas):  # (as the cluster builds them)
            pol = policy if k == 0 else replica_policy(self.config, policy)
            rep = new_replica(self.config, pol, kv_blocks, stream=k,
                              max_model_len=self.config.resolved_max_model_len())
            proc = ReplicaProcess(self.env, rep, pol, cost, _Discard(), False, 0)
            proc.fast_forward = False  # (the module docstring)
            self.replicas.append(rep)
            self.processes.append(proc)
        self.replica, self.process = self.replicas[0], self.processes[0]
        self.views = tuple(ReplicaView(rep, k) for k, rep in enumerate(self.replicas))
        self.route = make_router(self.config.router, self.config.seed)
        self.routed = [0] * len(self.replicas)
        self.inbox = queue.SimpleQueue()
        self.active = {}  # request index -> [request, tokens sent, listener]
        self.snapshot = (0, 0, 0.0)
        self.snapshots = ((0, 0, 0.0),) * len(self.replicas)
        self.counts = {"finished": 0, "rejected": 0, "aborted": 0}
        self._next = 0
        self._thread = None
        self._start = None
        self._stopping = False

    def now_wall(self) -> float:
        """The simulated time the wall clock reads now."""
        return (time.monotonic() - self._start) / self.scale

    def add(self, num_prompt_tokens: int, num_output_tokens: int, listener) -> None:
        """Queue a request arriving now (thread-safe); ``listener`` hears of its tokens."""
        self.inbox.put((time.monotonic(), int(num_prompt_tokens), int(num_output_tokens),
                        listener))

    def abort(self, listener) -> None:
        """Abort the request ``listener`` listens to (thread-safe; a client that left): it
        leaves the queue or the batch, its KV blocks are freed, it is counted ``aborted`` and
        its listener hears ``"aborted"``. Nothing for a request already ended."""
        self.inbox.put(("abort", listener))

    def start(self):
        self._start = time.monotonic()
        for proc in self.processes:
            proc.start()
        self._thread = threading.Thread(target=self._drive, name="sim-serve-engine",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0):
        """End the engine's thread; requests still in flight hear ``"aborted"``."""
        self._stopping = True
        self.inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
        for _r, _sent, listener, _k in self.active.values():
            listener("aborted", 0, self.env.now)
        self.active.clear()

    # -- the engine's thread --------------------------------------------------------------
    def _drive(self):
        env, pending = self.env, []
        while not self._stopping:
            t_next = env.peek()
            wait = None if t_next == math.inf else max(0.0, t_next * self.scale
                                                       + self._start - time.monotonic())
            if not pending or wait:
                try:
                    item = self.inbox.get(timeout=wait) if wait != 0.0 else \
                        self.inbox.get_nowait()
                except queue.Empty:
                    item = False
                while item is not False:
                    if item is None:
                        return
                    if item[0] == "abort":
                        self._abort(item[1], pending)
                    else:
                        pending.append(item)
                    try:
                        item = self.inbox.get_nowait()
                    except queue.Empty:
                        item = False
            t_next = env.peek()
            while pending:  # arrivals due before the next event, in the order they came
                at = (pending[0][0] - self._start) / self.scale
                if at > t_next:
                    break
                self._arrive(max(env.now, at), *pending.pop(0)[1:])
                t_next = env.peek()
            if t_next <= self.now_wall():
                env.step()
                self._emit()

    def _arrive(self, t, num_prompt, num_output, listener):
        self.env._now = t  # (between events: no event is due before t)
        r = Request(self._next, self._next, t, num_prompt, num_output)
        self._next += 1
        k = self.pick(r)
        self.routed[k] += 1
        if submit(self.replicas[k], self.processes[k], r):
            self.active[r.index] = [r, 0, listener, k]
        else:
            self.counts["rejected"] += 1
            self.replicas[k].finished.clear()
            listener("rejected", r.reason, t)
        self._refresh()

    def _abort(self, listener, pending):
        reason = "aborted: the client disconnected"
        for k, item in enumerate(pending):  # not arrived yet
            if item[3] is listener:
                del pending[k]
                self.counts["aborted"] += 1
                listener("aborted", reason, self.env.now)
                return
        key = next((k for k, e in self.active.items() if e[2] is listener), None)
        if key is None:  # ended already
            return
        r, _sent, _listener, k = self.active.pop(key)
        replica = self.replicas[k]
        if r.status in (PREFILL, DECODE):
            # between events the batch in flight is formed, as when a scheduler preempts
            # while forming one: preemption frees the blocks and takes r out of the batch
            replica.preempt(r)
        if r.status == WAITING:
            replica._dequeue(r)
        r.status, r.reason = REJECTED, reason
        self.counts["aborted"] += 1
        listener("aborted", reason, self.env.now)
        self._refresh()

    def _emit(self):
        now, done = self.env.now, []
        for key, entry in self.active.items():
            r, sent, listener, k = entry
            replica = self.replicas[k]
            if r.status == FINISHED:
                n = r.num_output_tokens
            elif r.status == REJECTED:  # (never after arrival today; said if it happens)
                done.append(key)
                listener("rejected", r.reason, now)
                continue
            else:
                n = replica.num_generated(r)
            if n > sent:
                entry[1] = n
                listener("tokens", n - sent, now)
            if r.status == FINISHED:
                done.append(key)
                self.counts["finished"] += 1
                listener("done", (r, k), now)
        for key in done:
            del self.active[key]
        for replica in self.replicas:
            replica.finished.clear()
        self._refresh()

    def _refresh(self):
        shots, used, total = [], 0, 0
        for rep in self.replicas:
            n, free = rep.blocks.num_blocks, rep.blocks.num_free
            shots.append((len(rep.running), len(rep.waiting), (n - free) / n if n else 0.0))
            used, total = used + n - free, total + n
        self.snapshots = tuple(shots)
        self.snapshot = (sum(s[0] for s in shots), sum(s[1] for s in shots),
                         used / total if total else 0.0)
