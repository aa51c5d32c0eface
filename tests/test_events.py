"""sim.engine.core.events: pre-made events in SimPy's queue run in SimPy's order, ties included."""

import pytest
import simpy
from hypothesis import given, settings, strategies as st

from sim.engine.core.events import NORMAL, URGENT, Environment, Wakeup

# few delays, so that ties (same instant, same priority) are common; 0.1 + 0.2 != 0.3
DELAYS = st.sampled_from([0.0, 0.1, 0.2, 0.3, 0.25])
STEP = st.tuples(st.sampled_from(["sleep", "wake"]), DELAYS, st.sampled_from([URGENT, NORMAL]))
PROGRAM = st.lists(st.lists(STEP, max_size=6), min_size=1, max_size=5)


def _with_wakeups(program, others):
    """Each actor's steps as Wakeups: ``sleep`` (Environment.sleep: a Timeout, or the clock
    set when alone), ``wake`` (Environment.wake at a priority); each started as the engine's
    replica loop is (primed, then woken URGENT); ``others``: a plain SimPy process in the same
    environment."""
    env, log, wakeups = Environment(), [], {}

    def actor(k, steps):
        yield
        wakeup = wakeups[k]
        log.append((k, -1, env.now))
        for j, (kind, delay, priority) in enumerate(steps):
            if kind == "sleep":
                if not env.sleep(delay, wakeup):
                    yield
            else:
                env.wake(wakeup, delay, priority=priority)
                yield
            log.append((k, j, env.now))
        yield  # done: parked, as a replica loop waits for work (never woken here)

    for k, steps in enumerate(program):
        gen = actor(k, steps)
        next(gen)
        wakeups[k] = Wakeup(gen.send)
        env.wake(wakeups[k], priority=URGENT)
    _others(env, others, log)
    env.run()
    return log


def _with_simpy(program, others):
    """The same steps with SimPy's own events: Timeout(delay), an Event scheduled at the
    priority, processes started by env.process."""
    env, log = simpy.Environment(), []

    def actor(k, steps):
        log.append((k, -1, env.now))
        for j, (kind, delay, priority) in enumerate(steps):
            if kind == "sleep":
                yield env.timeout(delay)
            else:
                ev = simpy.Event(env)
                ev._ok, ev._value = True, None
                env.schedule(ev, priority, delay)
                yield ev
            log.append((k, j, env.now))

    for k, steps in enumerate(program):
        env.process(actor(k, steps))
    _others(env, others, log)
    env.run()
    return log


def _others(env, delays, log):
    def other():
        for j, d in enumerate(delays):
            yield env.timeout(d)
            log.append(("simpy", j, env.now))
    if delays:
        env.process(other())


@settings(max_examples=300, deadline=None)
@given(PROGRAM, st.lists(DELAYS, max_size=6))
def test_wakeups_run_in_simpys_order_at_simpys_times(program, others):
    assert _with_wakeups(program, others) == _with_simpy(program, others)


def test_alone_sleep_sets_the_clock_without_an_event():
    env, w = Environment(), Wakeup(lambda e: None)
    assert env.sleep(0.1, w) and env.sleep(0.2, w)
    assert env.now == 0.1 + 0.2 and not env._queue  # the float now + delay, twice
    env.timeout(1.0)
    assert not env.sleep(0.5, w)  # another event: scheduled, the caller yields
    assert [entry[0] for entry in sorted(env._queue)] == [0.1 + 0.2 + 0.5, 0.1 + 0.2 + 1.0]


def test_a_wakeup_carries_its_value_to_its_callback_and_runs_again_once_rescheduled():
    env, seen = Environment(), []
    w = Wakeup(lambda e: seen.append((e.value, env.now)), value="x")
    env.wake(w, 0.5)
    env.run()
    env.wake(w, 0.25, priority=URGENT)
    env.run()
    assert seen == [("x", 0.5), ("x", 0.75)]
    assert w.callbacks is None  # popped: step cleared it, as SimPy does


def test_run_raises_a_failed_event_as_simpy_does_and_not_a_defused_one():
    env = Environment()
    env.event().fail(ValueError("broken link"))
    with pytest.raises(ValueError, match="broken link") as info:
        env.run()
    assert isinstance(info.value.__cause__, ValueError)  # SimPy's copy, the original as cause
    env = Environment()
    ev = env.event()
    ev.fail(ValueError("handled"))
    ev.defused = True
    env.run()


def test_run_lets_a_callbacks_exception_through_and_keeps_simpys_until():
    env = Environment()

    def boom(_event):
        raise RuntimeError("lost request")

    env.timeout(1.0).callbacks.append(boom)
    with pytest.raises(RuntimeError, match="lost request"):
        env.run()
    env = Environment()
    later = env.timeout(5.0)
    env.run(until=2.0)  # SimPy's own run: stops at 2 with the timeout still queued
    assert env.now == 2.0 and not later.processed
