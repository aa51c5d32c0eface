"""sim/engine/kv/key_ops.py: each pass over a request's keys returns, and leaves the pool's
state and stale set as, a plain per-key loop over Python lists does (compiled: the C loops;
interpreted: the NumPy expressions) - on random states, keys and arguments."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sim.engine.kv import key_ops

NUM_IDS = 40


@st.composite
def cases(draw):
    """A state of NUM_IDS ids (counts, free serials, uncached) and distinct keys."""
    state = draw(st.lists(st.integers(-5, 4), min_size=NUM_IDS, max_size=NUM_IDS))
    keys = draw(st.lists(st.integers(0, NUM_IDS - 1), unique=True, max_size=NUM_IDS))
    return np.array(state, dtype=np.int32), np.array(keys, dtype=np.int64)


def _ref_hits(state, keys, start, limit):
    stop = min(limit, len(keys))
    for i in range(start, stop):
        if state[keys[i]] == 0:
            return i
    return max(start, stop)


@settings(max_examples=150, deadline=None)
@given(cases(), st.integers(0, NUM_IDS + 2), st.integers(0, NUM_IDS + 2))
def test_the_reading_passes(case, start, limit):
    state, keys = case
    s, k = state.tolist(), keys.tolist()
    start = min(start, _ref_hits(s, k, 0, limit))  # (the first ``start`` are cached)
    assert key_ops.hits(state, keys, start, limit) == _ref_hits(s, k, start, limit)
    assert key_ops.count_free(state, keys, limit) == sum(s[x] < 0 for x in k[:limit])
    assert key_ops.top(keys) == (max(k) + 1 if k else 0)
    assert state.tolist() == s  # (read only)


@settings(max_examples=150, deadline=None)
@given(cases())
def test_acquire_and_register(case):
    state, keys = case
    s, k = state.tolist(), keys.tolist()
    stale, ref_stale = {99}, {99}
    a, ref_a = state.copy(), list(s)
    taken = key_ops.acquire(a, keys, stale)
    ref_taken = 0
    for x in k:
        if ref_a[x] < 0:
            ref_taken += 1
            ref_stale.add(-ref_a[x])
            ref_a[x] = 0
        ref_a[x] += 1
    assert (taken, a.tolist(), stale) == (ref_taken, ref_a, ref_stale)
    r = state.copy()
    new = key_ops.register(r, keys)
    assert new.tolist() == [x for x in k if s[x] == 0]
    assert r.tolist() == [1 if v == 0 and i in k else v for i, v in enumerate(s)]


@settings(max_examples=150, deadline=None)
@given(cases(), st.integers(6, 9))
def test_release(case, serial):
    state, keys = case
    state = np.abs(state) + 1  # (a request releases keys it holds: counts >= 1)
    s, k = state.tolist(), keys.tolist()
    unused = key_ops.release(state, keys, serial)
    left = [x for x in k if s[x] == 1]
    assert unused.tolist() == left[::-1]  # a sequence's last blocks first
    ref = [(v - 1 if v > 1 else -serial) if i in k else v for i, v in enumerate(s)]
    assert state.tolist() == ref


@settings(max_examples=200, deadline=None)
@given(cases(), st.integers(0, NUM_IDS), st.integers(1, 12), st.sampled_from([3, 4]),
       st.booleans(), st.integers(0, 3))
def test_take_evicts_the_next_live_entries_until_enough(case, pos, n, serial, stale, anon):
    """From the queue's head: ``anon`` anonymous blocks, then the run's entries from ``pos``
    whose state is ``-serial`` (the others stale, skipped), then more anonymous blocks."""
    from collections import deque
    state, keys = case
    assume(len(keys))  # (a release queues a run only of the keys it freed)
    if not stale:  # a run not marked stale holds only live entries
        state[keys] = -serial
    pos = min(pos, len(keys))
    s, k = state.tolist(), keys.tolist()
    live = [x for x in k[pos:] if s[x] == -serial]
    queue = deque(([[anon]] if anon else []) + [[serial, keys, pos], [50]])
    stales = {serial, 7} if stale else {7}
    entries, evicted = key_ops.take(queue, state, stales, n)
    want = live[:max(0, n - anon)]
    assert [int(x) for part in evicted for x in part] == want
    assert all(len(part) for part in evicted)
    # a few keys as a list, more as an array (no array to make and free for a decode's block)
    assert all(isinstance(part, list) == (n - anon <= key_ops.FEW) for part in evicted)
    assert state.tolist() == [0 if i in want else v for i, v in enumerate(s)]
    blocks = anon + len(live) + 50  # what the queue held
    assert sum(len(q[1]) - q[2] if len(q) == 3 else q[0] for q in queue) <= blocks - n
    gone = len(queue) == 1  # (the run consumed: its serial is no longer stale)
    assert (serial in stales) == (stale and not gone)
    if n - anon > len(live):  # more wanted than the run has: it is consumed to its end
        assert gone and entries == len(k) - pos


def test_keys_not_int64_take_the_numpy_path():
    """A list or an int32 array of keys (no typed view) gives the same answers."""
    state = np.array([0, 2, -3, 1], dtype=np.int32)
    for keys in (np.array([1, 3, 0], dtype=np.int32), np.array([1, 3, 0])):
        assert key_ops.hits(state, keys, 0, 3) == 2
        assert key_ops.count_free(state, keys[::-1], 3) == 0
    assert key_ops.top(np.zeros(0, dtype=np.int64)) == 0


def test_the_engines_keys_take_the_c_loops_when_compiled():
    """The ids the engine makes (workloads.prefix.block_key_ids: views of one int64 array)
    pass the check for the typed loops whenever the module is compiled."""
    from workloads.prefix import block_key_ids
    ids = block_key_ids([[1, 2, 3], [1, 2, 4, 5]], 16, np.array([48, 64]), 16)
    assert [len(k) for k in ids] == [3, 4]  # (a key per full block)
    compiled = not key_ops.__file__.endswith(".py")  # (its extension module loaded)
    assert all(key_ops._typed(k) is compiled for k in ids)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, NUM_IDS - 1), unique=True, min_size=1, max_size=NUM_IDS),
       st.lists(st.lists(st.integers(0, NUM_IDS - 1), max_size=20), min_size=1, max_size=4),
       st.integers(0, 40), st.data())
def test_cut_finds_the_first_position_of_a_key_evicted_last(keys, parts, n, data):
    """The log's last ``n`` keys (parts of any size, arrays or lists: per key below 9,
    vectorised above) against the placed keys: the first position below ``hit`` holding one
    of them."""
    keys = np.array(keys, dtype=np.int64)
    hit = data.draw(st.integers(0, len(keys)))
    pos = np.array(data.draw(st.lists(st.integers(0, len(keys)), min_size=NUM_IDS,
                                      max_size=NUM_IDS)), dtype=np.int32)  # other prompts'
    pos[keys] = np.arange(1, len(keys) + 1)  # placed (a chained key has one position)
    # (take logs a few keys as a list of ints, more as an int64 array: either, any size)
    log = [np.array(p, dtype=np.int64) if data.draw(st.booleans()) else list(p) for p in parts]
    n = min(n, sum(map(len, log)))
    last = [int(x) for part in log for x in part][::-1][:n]  # the last n evicted
    ref = min([i for i in range(hit) if int(keys[i]) in last], default=hit)
    assert key_ops.cut(log, pos, keys, n, hit) == ref


@settings(max_examples=150, deadline=None)
@given(cases(), st.integers(0, NUM_IDS), st.integers(0, NUM_IDS), st.booleans())
def test_place(case, start, upto, fresh):
    """Positions recorded (position + 1 per key) unless a key sits elsewhere already: then
    False and ``pos`` unchanged."""
    state, keys = case
    upto = min(upto, len(keys))
    start = min(start, upto)
    pos = np.zeros(NUM_IDS, dtype=np.int32) if fresh else (np.abs(state) % 3).astype(np.int32)
    p, k = pos.tolist(), keys.tolist()
    ok = all(p[x] in (0, i + 1) for i, x in enumerate(k[start:upto], start))
    if ok:
        for i in range(start, upto):
            p[k[i]] = i + 1
    assert key_ops.place(pos, keys, start, upto) == ok and pos.tolist() == p


def test_views_kept_between_calls_follow_the_arrays_and_are_let_go():
    """Compiled, the last state and keys viewed keep their typed views: a change in place is
    seen, another array gets its own view, and ``forget`` (a run's end) lets them go."""
    import gc
    import weakref
    state, keys = np.zeros(8, dtype=np.int32), np.array([1, 2, 3], dtype=np.int64)
    assert key_ops.hits(state, keys, 0, 3) == 0
    state[[1, 2]] = 1  # in place: the kept view reads it
    assert key_ops.hits(state, keys, 0, 3) == 2
    assert key_ops.hits(np.ones(8, dtype=np.int32), keys, 0, 3) == 3  # its own view
    assert key_ops.hits(state, keys[::-1].copy(), 0, 3) == 0  # (keys 3, 2, 1)
    assert key_ops.hits(state, keys, 0, 3) == 2
    kept = weakref.ref(keys)
    del keys
    key_ops.forget()
    gc.collect()
    assert kept() is None


def test_a_negative_id_is_an_index_error_when_compiled():
    """Compiled without wraparound (ids are never negative), a negative id still raises
    rather than reading another id's state: the bounds checks stay on."""
    if key_ops.__file__.endswith(".py"):
        pytest.skip("the interpreted pass indexes as NumPy does")
    state = np.zeros(4, dtype=np.int32)
    for call in (lambda: key_ops.hits(state, np.array([-1, 2]), 0, 2),
                 lambda: key_ops.release(state + 1, np.array([1, -2]), 5)):
        with pytest.raises(IndexError):
            call()
