"""The waiting queue and the running set as policies see them: read-only views.

A policy reads a replica's ``waiting`` (a deque, FCFS) and ``running`` (``index -> Request`` in
admission order, oldest first) at C speed; every mutation through their own methods raises
``TypeError`` (tests/test_replica.py). The replica - and only it - mutates them through the base
classes' functions bound here (``_enqueue(q, r)`` is ``deque.append(q, r)``).
"""

from __future__ import annotations

from collections import deque

def _refuse(self, *args, **kwargs):
    raise TypeError("a replica's queue and running set are read-only to policies: act through "
                    "replica.admit / schedule_chunk / preempt")


class WaitingQueue(deque):
    """The waiting queue as policies see it: a deque (reads at C speed), mutations refused.
    The replica mutates it through the base class (``deque.append(q, r)``)."""

    append = appendleft = extend = extendleft = pop = popleft = remove = clear = _refuse
    rotate = insert = __setitem__ = __delitem__ = __iadd__ = _refuse


class RunningSet(dict):
    """The running set as policies see it: ``index -> Request`` in admission order (oldest
    first); mutations refused. The replica mutates it through ``dict``."""

    __setitem__ = __delitem__ = pop = popitem = clear = update = setdefault = _refuse
    __ior__ = _refuse


_enqueue, _enqueue_head, _dequeue_head, _dequeue = (deque.append, deque.appendleft,
                                                    deque.popleft, deque.remove)
_set_running, _del_running = dict.__setitem__, dict.__delitem__
