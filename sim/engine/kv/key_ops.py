# cython: wraparound=False
# (no index here is negative: compiled, one would raise IndexError, the bounds checks stay on)
"""The per-key passes of the block prefix cache (:mod:`sim.engine.kv.prefix_cache`): a
request's key ids against the pool's per-key state.

``state`` is the pool's ``_state`` (an int32 array indexed by key id: a reference count when
positive, ``-serial`` for a cached key with no reference, 0 for a key not cached); ``keys`` a
request's ids (int64, distinct: a chained key names its whole prefix, so no prompt holds one
twice). Each function is one pass over ``keys`` with the same answer either way it runs:
compiled (sim/native.py), a C loop over typed views; interpreted, the NumPy expressions the
pool used before, a few vectorised passes (a Python loop per key would be ~50x slower there).
Keys of another dtype (a test's list, an empty tuple) take the NumPy path compiled too.

Invariant (tests/test_key_ops.py, against the NumPy expressions on random states): every
function returns, and leaves ``state`` and ``stale`` as, the interpreted pass does.
"""

from __future__ import annotations

import numpy as np

try:
    import cython
except ImportError:  # interpreted without Cython: its no-op names (sim/cython_shim.py)
    from sim import cython_shim as cython

INT64 = np.dtype(np.int64)
FEW = 6  # take's evictions of at most this many keys: a list (compiled and interpreted)
_empty = np.empty


# compiled: the last state, positions and keys viewed, with their typed views. A pool's calls
# come with the same state and positions every time and with a request's keys several times
# in a row, and a view costs ~1,350 instructions to make (its memoryview object; ~10 % of the
# Mooncake trace's loop when made per call). Each holds its array alive until the next one.
_last_state = _last_pos = _last_keys = _last_run = None
_state_v = _pos_v = _keys_v = _run_v = None


def forget():
    """Drop the kept arrays and views (at a run's end: the last request's keys view the run's
    whole id array, which they would otherwise keep alive)."""
    global _last_state, _last_pos, _last_keys, _last_run, _state_v, _pos_v, _keys_v, _run_v
    _last_state = _last_pos = _last_keys = _last_run = None
    _state_v = _pos_v = _keys_v = _run_v = None


def _state_view(state):
    """The typed view of ``state`` (compiled only), kept while the same array comes again."""
    global _last_state, _state_v
    if state is not _last_state:
        _state_v = state
        _last_state = state
    return _state_v


def _pos_view(pos):
    """The typed view of ``pos`` (compiled only), kept while the same array comes again."""
    global _last_pos, _pos_v
    if pos is not _last_pos:
        _pos_v = pos
        _last_pos = pos
    return _pos_v


def _keys_view(keys):
    """The typed view of ``keys`` (compiled only), kept while the same array comes again."""
    global _last_keys, _keys_v
    if keys is not _last_keys:
        _keys_v = keys
        _last_keys = keys
    return _keys_v


def _run_view(keys):
    """The typed view of the queue run ``keys`` :func:`take` reads (its own: the head run
    stays while its blocks are taken a few at a time, between a request's passes)."""
    global _last_run, _run_v
    if keys is not _last_run:
        _run_v = keys
        _last_run = keys
    return _run_v


def _typed(keys) -> bool:
    """Whether the C loops may read ``keys``: a NumPy array of the native int64 dtype
    (compiled only; NumPy's built-in dtypes are singletons, so ``is`` finds it at the cost
    of a pointer compare: another int64 descriptor only takes the NumPy path)."""
    return cython.compiled and type(keys) is np.ndarray and keys.dtype is INT64


def top(keys) -> int:
    """One more than the largest id of ``keys`` (0 when empty): the state's length needed."""
    if cython.compiled and _typed(keys):  # (interpreted: no call)
        kv = _keys_view(keys)
        m = -1
        for i in range(kv.shape[0]):
            if kv[i] > m:
                m = kv[i]
        return m + 1
    return int(keys.max()) + 1 if len(keys) else 0


def hits(state, keys, start: int, limit: int) -> int:
    """How many of ``keys[:limit]`` are cached from the first on, given that the first
    ``start`` are (``start`` itself when ``start >= limit``)."""
    if cython.compiled and _typed(keys):  # (interpreted: no call)
        st = _state_view(state)
        kv = _keys_view(keys)
        stop = min(limit, kv.shape[0])
        for i in range(start, stop):
            if st[kv[i]] == 0:
                return i
        return stop if stop > start else start
    missing = state[keys[start:limit]] == 0
    if not len(missing):
        return start
    i = int(missing.argmax())
    return start + (i if missing[i] else len(missing))


def count_free(state, keys, hit: int) -> int:
    """How many of ``keys[:hit]`` are cached with no reference (free blocks a hit takes)."""
    if not hit:
        return 0
    if cython.compiled and _typed(keys):  # (interpreted: no call)
        st = _state_view(state)
        kv = _keys_view(keys)
        n = 0
        for i in range(min(hit, kv.shape[0])):
            if st[kv[i]] < 0:
                n += 1
        return n
    return int(np.count_nonzero(state[keys[:hit]] < 0))


def acquire(state, keys, stale) -> int:
    """A reference on each cached key of ``keys``; the free ones taken (their runs' serials
    added to the set ``stale``) are counted and returned."""
    if cython.compiled and _typed(keys):  # (interpreted: no call)
        st = _state_view(state)
        kv = _keys_view(keys)
        taken = 0
        last = 0
        for i in range(kv.shape[0]):
            k = kv[i]
            c = st[k]
            if c < 0:
                taken += 1
                if c != last:  # (a run's keys come together: one set insert per run)
                    stale.add(-c)
                    last = c
                c = 0
            st[k] = c + 1
        return taken
    counts = state[keys]
    free = counts < 0
    taken = int(np.count_nonzero(free))
    if taken:
        stale.update((-counts[free]).tolist())  # their entries' runs
        counts[free] = 0
    counts += 1
    state[keys] = counts
    return taken


def register(state, keys):
    """The keys of ``keys`` not cached get reference 1; returns them (an int64 array, in
    order)."""
    if cython.compiled and _typed(keys):  # (interpreted: no call)
        st = _state_view(state)
        kv = _keys_view(keys)
        n = kv.shape[0]
        new = _empty(n, dtype=INT64)  # (room for all: one pass)
        nv = new
        j = 0
        for i in range(n):
            k = kv[i]
            if st[k] == 0:
                st[k] = 1
                nv[j] = k
                j += 1
        return new[:j] if 2 * j >= n else new[:j].copy()  # (a request may keep it)
    new = keys[state[keys] == 0]
    if len(new):
        state[new] = 1
    return new


def release(state, keys, serial: int):
    """A reference less on each of ``keys``; those left with none become ``-serial`` (free,
    in the queue run ``serial``). Returns them in reverse key order (the run's eviction
    order: a sequence's last blocks go first), empty when none."""
    if cython.compiled and _typed(keys):  # (interpreted: no call)
        st = _state_view(state)
        kv = _keys_view(keys)
        n = kv.shape[0]
        unused = _empty(n, dtype=INT64)  # (room for all: one pass, last key first)
        uv = unused
        j = 0
        for i in range(n - 1, -1, -1):
            k = kv[i]
            c = st[k] - 1
            if c == 0:
                c = -serial
                uv[j] = k
                j += 1
            st[k] = c
        return unused[:j] if 2 * j >= n else unused[:j].copy()  # (the queue keeps it)
    counts = state[keys]
    counts -= 1
    zero = counts == 0
    unused = keys[zero]
    if len(unused):
        counts[zero] = -serial
    state[keys] = counts
    return unused[::-1]


def take(queue, state, stale, n: int):
    """``(entries, evicted)``: ``n`` free blocks taken from the head of the pool's LRU
    ``queue`` (a deque of runs: ``[count]`` anonymous blocks, or ``[serial, keys, pos]`` the
    keyed entries one release freed, the first ``pos`` gone), its runs consumed or cut;
    ``entries`` the keyed entries consumed, ``evicted`` the keys evicted (an int64 array or
    a list per run reached, in order). In a keyed run the entries still free (state
    ``-serial``) are evicted (uncached, state 0) and a stale one, its key since taken by a
    hit, is skipped; a run whose serial is not in ``stale`` holds only live entries, and a
    consumed run's serial leaves ``stale``. The caller checked that ``n`` blocks are free."""
    entries = 0
    evicted = []
    while n:
        item = queue[0]
        if len(item) == 1:  # a run of anonymous blocks
            count = item[0]
            if count > n:
                item[0] = count - n
                return entries, evicted
            queue.popleft()
            n -= count
            continue
        serial, keys, pos = item  # cached blocks: the next n entries, the stale skipped
        end = len(keys)
        free = -serial
        if cython.compiled and _typed(keys):  # (interpreted: no call)
            st = _state_view(state)
            kv = _run_view(keys)
            j = pos
            m = 0
            if n <= FEW:  # a decode's few blocks: a list (no array to make, slice and free
                live = []  # per block: Mooncake's loop, first 3,000 requests, 2,046M -> 1,876M
                # instructions); the eviction log's reader (cut) takes either
                while m < n and j < end:
                    k = kv[j]
                    j += 1
                    if st[k] == free:
                        st[k] = 0
                        live.append(k)
                        m += 1
            else:
                out = _empty(min(n, end - pos), dtype=INT64)
                ov = out
                while m < n and j < end:
                    k = kv[j]
                    j += 1
                    if st[k] == free:
                        st[k] = 0
                        ov[m] = k
                        m += 1
                live = out[:m]
        elif n <= FEW:  # a decode's few blocks: per key (measured: 0.5 vs 1.5 us for two)
            live, j = [], pos
            while len(live) < n and j < end:
                k = keys[j]
                j += 1
                if state[k] == free:
                    state[k] = 0
                    live.append(k)
        else:
            j = min(pos + n, end)
            if serial not in stale:  # none of its entries went stale: all evicted
                live = keys[pos:j]  # (measured: 6.4 -> 5.1 us per allocate, scenario 2)
            else:
                chunk = keys[pos:j]
                live = chunk[state[chunk] == free]
            if len(live):
                state[live] = 0
        n -= len(live)
        item[2] = j
        if j == end:
            queue.popleft()
            stale.discard(serial)
        entries += j - pos
        if len(live):
            evicted.append(live)
    return entries, evicted


def place(pos, keys, start: int, upto: int) -> bool:
    """Record ``keys[start:upto]``'s block positions in ``pos`` (the pool's ``_pos``: position
    + 1, 0 unplaced), unless one of them was placed at another position: then False and
    ``pos`` is left as it was."""
    if cython.compiled and _typed(keys):  # (interpreted: no call)
        pv = _pos_view(pos)
        kv = _keys_view(keys)
        for i in range(start, upto):
            s = pv[kv[i]]
            if s != 0 and s != i + 1:
                return False
        for i in range(start, upto):
            pv[kv[i]] = i + 1
        return True
    ids = keys[start:upto]
    at = np.arange(start + 1, upto + 1, dtype=np.int32)
    seen = pos[ids]
    if not ((seen == 0) | (seen == at)).all():
        return False
    pos[ids] = at
    return True


def cut(log, pos, keys, n: int, hit: int) -> int:
    """The first block position below ``hit`` at which ``keys`` holds one of the last ``n``
    keys evicted (``hit`` if none): ``log`` the pool's eviction log (arrays or lists, oldest
    first, holding those ``n``), ``pos`` the pool's ``_pos`` (a placed key's block position
    + 1, 0 unplaced; ``keys`` placed up to ``hit``)."""
    i = len(log)
    while n > 0:
        i -= 1
        part = log[i]
        if len(part) > n:
            part = part[len(part) - n:]
        n -= len(part)
        if cython.compiled and type(part) is list and _typed(keys):  # (take's few keys)
            pv = _pos_view(pos)
            kv = _keys_view(keys)
            for e in part:
                q = pv[e] - 1
                if 0 <= q < hit and kv[q] == e:
                    hit = q
        elif cython.compiled and _typed(part) and _typed(keys):  # (interpreted: no call)
            pv = _pos_view(pos)
            kv = _keys_view(keys)
            ev = part
            for j in range(ev.shape[0]):
                e = ev[j]
                q = pv[e] - 1
                if 0 <= q < hit and kv[q] == e:
                    hit = q
        elif len(part) > 8:  # vectorised (a prefill chunk's evictions)
            part = np.asarray(part, dtype=INT64)  # (an array already: no copy)
            p = pos[part] - 1
            inside = (p >= 0) & (p < hit)
            if inside.any():
                p = p[inside]
                mine = p[keys[p] == part[inside]]
                if len(mine):
                    hit = int(mine.min())
        else:  # a few keys (a decode's blocks): per key (measured: 1.3 vs 5.8 us for 3)
            for e in part:
                p = pos[e] - 1
                if 0 <= p < hit and keys[p] == e:
                    hit = int(p)
    return hit
