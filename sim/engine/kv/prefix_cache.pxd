# The compiled layout of sim/engine/kv/prefix_cache.py (sim/native.py): the pool's counters C
# integers, a lookup's fields too; the methods the pool calls on itself C-callable (cpdef),
# a Python subclass's override (OffloadingBlockManager's _logged, a test's) still taking
# precedence.
cimport cython
from sim.engine.kv.blocks cimport BlockManager
from sim.engine.kv cimport key_ops  # (its passes called in C, not through the module)


cdef class PrefixLookup:
    cdef public object keys, pin_state
    cdef public long long evictions, additions, hit, limit, pinned, placed


cdef class PrefixCachingBlockManager(BlockManager):
    cdef public object _queue, _state, _pos
    cdef public list _log
    cdef public set _stale
    cdef public long long _serial, _entries, _log_size, num_evictions, ref_changes, additions

    cpdef PrefixLookup lookup(self, keys)
    cpdef _make_room(self, keys)
    cpdef long long hits(self, keys, long long start, long long limit) except? -1
    cpdef long long pinned(self, keys, long long hit) except? -1

    @cython.locals(evictions="long long", additions="long long", hit="long long",
                   start="long long", cut="long long")
    cpdef long long refresh(self, PrefixLookup look, long long limit) except? -1

    @cython.locals(hit="long long", placed="long long")
    cpdef long long _cut(self, PrefixLookup look, long long n) except? -2

    cpdef bint _place(self, PrefixLookup look, long long upto) except -1
    cpdef long long refresh_pinned(self, PrefixLookup look) except? -1
    cpdef acquire(self, keys)
    cpdef register(self, keys)

    @cython.locals(entries="long long", evicted=list)
    cpdef allocate(self, long long n)

    @cython.locals(keep="long long", i=cython.Py_ssize_t, log=list)
    cpdef _logged(self, evicted)

    cpdef free(self, long long n)

    @cython.locals(serial="long long")
    cpdef release(self, keys, long long num_anonymous)
