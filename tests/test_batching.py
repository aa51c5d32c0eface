import pytest
from hypothesis import given, strategies as st

from sim import simulate_continuous_batching, simulate_static_batching


def test_cheat_sheet_example():
    s = simulate_static_batching([10, 1, 1, 1], 2)
    c = simulate_continuous_batching([10, 1, 1, 1], 2)
    assert (s.steps, c.steps) == (11, 10)
    assert s.finish_steps == [10, 1, 11, 11]
    assert c.finish_steps == [10, 1, 2, 3]
    assert s.utilization == pytest.approx(13 / 22)
    assert c.utilization == pytest.approx(13 / 20)


def _brute_force_continuous(lengths, b):
    queue, slots, step, finish = list(enumerate(lengths)), {}, 0, {}
    while queue or slots:
        step += 1
        while len(slots) < b and queue:
            i, n = queue.pop(0)
            slots[i] = n
        for i in list(slots):
            slots[i] -= 1
            if slots[i] == 0:
                finish[i] = step
                del slots[i]
    return step, [finish[i] for i in range(len(lengths))]


@given(st.lists(st.integers(1, 30), min_size=1, max_size=40), st.integers(1, 8))
def test_continuous_matches_brute_force_and_never_worse_than_static(lengths, b):
    c = simulate_continuous_batching(lengths, b)
    assert (c.steps, c.finish_steps) == _brute_force_continuous(lengths, b)
    s = simulate_static_batching(lengths, b)
    assert c.steps <= s.steps
    assert 0 < s.utilization <= c.utilization <= 1
    assert s.busy_slot_steps == c.busy_slot_steps == sum(lengths)


def test_bad_input():
    with pytest.raises(ValueError, match="batch_size"):
        simulate_static_batching([1, 2], 0)
    with pytest.raises(ValueError, match=r"requests\[1\]"):
        simulate_continuous_batching([1, 0], 2)
    assert simulate_continuous_batching([], 3).steps == 0
