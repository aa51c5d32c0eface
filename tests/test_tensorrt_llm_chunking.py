"""TensorRT-LLM's chunk rules (sim/engine/presets/tensorrt_llm_chunking.py): hand cases from
microBatchScheduler.cpp's loops, and the invariants under hypothesis."""

from hypothesis import given, strategies as st

from sim.engine.presets.tensorrt_llm_chunking import equal_progress_chunks, fcfs_chunk


def _fcfs(rests, capacity, unit):
    """FIRST_COME_FIRST_SERVED over a list, as TensorRT-LLM's loop walks it."""
    chunks = []
    for rest in rests:
        chunks.append(fcfs_chunk(rest, capacity, unit))
        capacity -= chunks[-1]
    return chunks


def test_hand_cases():
    # FCFS: 100 of A's 250 rounded down to 96 (blocks of 16), B's 10 not in the 4 left
    assert _fcfs([250, 10], 100, 16) == [96, 0]
    assert _fcfs([120, 3], 100, 16) == [96, 3]  # a later, shorter prompt fits the remainder
    assert _fcfs([40, 50], 100, 16) == [40, 50]
    assert fcfs_chunk(10, 0, 16) == 0 and fcfs_chunk(10, -3, 16) == 0
    # EQUAL_PROGRESS: 16 to A, 10 to B, then A alone 16 at a time to 80 (96 would overflow)
    assert equal_progress_chunks([250, 10], 100, 16) == [80, 10]
    assert equal_progress_chunks([40, 40, 40], 100, 16) == [32, 32, 32]  # 4 left unused
    assert equal_progress_chunks([40, 50], 100, 16) == [40, 50]  # all fit: whole
    assert equal_progress_chunks([250], 100, 32) == [96]  # alone: as FCFS


@given(rests=st.lists(st.integers(1, 5000), min_size=1, max_size=12),
       capacity=st.integers(1, 9000), unit=st.sampled_from([1, 16, 32, 64]),
       equal=st.booleans())
def test_chunks_fit_and_cut_at_whole_units(rests, capacity, unit, equal):
    chunks = (equal_progress_chunks if equal else _fcfs)(rests, capacity, unit)
    assert len(chunks) == len(rests) and sum(chunks) <= capacity
    assert all(0 <= c <= r for c, r in zip(chunks, rests))
    assert all(c == r or c % unit == 0 for c, r in zip(chunks, rests))
    if sum(rests) <= capacity:
        assert chunks == rests
    if capacity >= unit and not equal:  # the first context always makes progress
        assert chunks[0] > 0
