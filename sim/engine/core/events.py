"""The engine's SimPy environment and its pre-made events.

Every process of the engine (a replica's loop, a cluster's dispatcher, a disaggregated run's
retries and KV landings) waits on a :class:`Wakeup`: an object made once per waiter (or per
transfer) that SimPy's ``Environment.step`` pops and runs like any event, in place of a
``Timeout``, a succeeded ``Event`` or a ``Process`` object made per wait. Measured on the
disaggregated scenario (3 prefill + 1 decode replicas, 10k requests): SimPy's per-event
machinery (``Timeout.__init__``, ``schedule``, ``Process._resume``, ``step``) was ~13 % of
the event loop's samples.

Invariants (tests/test_events.py, tests/test_engine.py):
- **SimPy's order.** A wakeup goes into SimPy's own queue as ``(now + delay, priority,
  next event id, wakeup)``, the entry ``Timeout(delay)`` (NORMAL), ``Event.succeed()``
  (NORMAL, no delay) or the start of a ``Process`` (URGENT, no delay) would have made at that
  point, from the same event counter: every event runs in SimPy's order, ties included, and
  the clock reads the same floats. Results are bit-identical to yielding SimPy's events
  (tested on every engine path: one replica, a cluster, disaggregation, a closed loop).
- **Alone, no event at all** (:meth:`Environment.sleep`): with nothing else scheduled the
  clock is set to ``now + delay`` and the caller goes on, which is what ``step`` would do
  next with its timeout the only event.
- A wakeup is in the queue at most once: its owner waits on one thing at a time (a replica
  loop, the dispatcher, a decode replica's retry) or it is made for one event (a landing).
  ``step`` sets its ``callbacks`` to None when it pops it; scheduling sets them again.
"""

from __future__ import annotations

import math
from heapq import heappop, heappush

import simpy
from simpy.core import NORMAL, URGENT

__all__ = ["Environment", "Wakeup", "NORMAL", "URGENT", "delay_until"]

def delay_until(now: float, t: float) -> float:
    """The delay after which SimPy's clock (``now + delay``, rounded) reads ``t``, or the
    first float after it: ``t - now`` rounds, and ``now + (t - now)`` can land one ulp below
    ``t`` (arrivals 0.134 and 1.389: the second was routed, and scheduled, at
    1.3889999999999998) or above it."""
    if t <= now:  # due already (the loops below would never end for a time in the past)
        return 0.0
    delay = t - now  # exact, and now + delay == t, unless delay is as large as now
    while now + delay < t:  # then one ulp of delay is about one of the sum: a few steps
        delay = math.nextafter(delay, math.inf)
    while now + delay > t:
        smaller = math.nextafter(delay, 0.0)
        if now + smaller < t:
            break
        delay = smaller
    return delay


class Wakeup:
    """A waiter's event: when popped, ``resume[0](self)`` runs (a generator's ``send``, or
    any callback of one argument); ``value``: what it carries for that callback. What
    ``Environment.step`` reads of an event, no more: ``callbacks`` and ``_ok``."""

    __slots__ = ("callbacks", "resume", "value", "_ok")

    def __init__(self, resume, value=None):
        self.resume = [resume]
        self.value = value
        self.callbacks = None
        self._ok = True


class Environment(simpy.Environment):
    """SimPy's environment, with :meth:`sleep` and :meth:`wake` for :class:`Wakeup` events
    and :meth:`run` stepping without a method call per event (the same steps)."""

    def sleep(self, delay: float, wakeup: Wakeup) -> bool:
        """Wait ``delay``: True when nothing else is scheduled - the clock is set to
        ``now + delay`` and the caller goes on - else False, ``wakeup`` scheduled where
        ``Timeout(delay)`` would be (the caller then yields)."""
        queue = self._queue
        if not queue:
            self._now += delay
            return True
        wakeup.callbacks = wakeup.resume
        heappush(queue, (self._now + delay, NORMAL, next(self._eid), wakeup))
        return False

    def wake(self, wakeup: Wakeup, delay: float = 0.0, *, priority=NORMAL) -> None:
        """Schedule ``wakeup`` after ``delay``: where ``Timeout(delay)`` goes (NORMAL), where
        a succeeded event goes (NORMAL, no delay), or with ``URGENT`` before the NORMAL
        events of its instant (a process's start; the dispatcher's arrivals)."""
        wakeup.callbacks = wakeup.resume
        heappush(self._queue, (self._now + delay, priority, next(self._eid), wakeup))

    def run(self, until=None):
        """SimPy's ``run``: with ``until`` exactly that; without, ``step`` inlined (pop the
        next event, set the clock, run its callbacks, raise a failed event's exception
        unless defused) until the queue is empty."""
        if until is not None:
            return super().run(until)
        queue = self._queue
        while queue:
            self._now, _, _, event = heappop(queue)
            callbacks, event.callbacks = event.callbacks, None
            for callback in callbacks:
                callback(event)
            if not event._ok and not hasattr(event, "_defused"):
                exc = type(event._value)(*event._value.args)
                exc.__cause__ = event._value
                raise exc
        return None
