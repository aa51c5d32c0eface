# The compiled types of sim/engine/kv/key_ops.py (sim/native.py): the pool's state an int32
# view, a request's keys a read-only int64 view, the loops' indices C integers.
cimport cython
from libc.stdint cimport int32_t, int64_t

cdef object _last_state, _last_pos, _last_keys, _last_run
cdef int32_t[:] _state_v, _pos_v
cdef const int64_t[:] _keys_v, _run_v
cpdef forget()
cdef int32_t[:] _state_view(object state)
cdef int32_t[:] _pos_view(object pos)
cdef const int64_t[:] _keys_view(object keys)
cdef const int64_t[:] _run_view(object keys)

cpdef bint _typed(object keys) except -1

@cython.locals(kv="const int64_t[:]", m=int64_t, i=cython.Py_ssize_t)
cpdef top(object keys)

@cython.locals(st=int32_t[:], kv="const int64_t[:]", i=cython.Py_ssize_t,
               stop=cython.Py_ssize_t)
cpdef hits(object state, object keys, Py_ssize_t start, Py_ssize_t limit)

@cython.locals(st=int32_t[:], kv="const int64_t[:]", i=cython.Py_ssize_t, n=cython.Py_ssize_t)
cpdef count_free(object state, object keys, Py_ssize_t hit)

@cython.locals(st=int32_t[:], kv="const int64_t[:]", i=cython.Py_ssize_t,
               taken=cython.Py_ssize_t, k=int64_t, c=int32_t, last=int32_t)
cpdef acquire(object state, object keys, set stale)

@cython.locals(st=int32_t[:], kv="const int64_t[:]", nv=int64_t[:], i=cython.Py_ssize_t,
               j=cython.Py_ssize_t, n=cython.Py_ssize_t, k=int64_t)
cpdef register(object state, object keys)

@cython.locals(st=int32_t[:], kv="const int64_t[:]", uv=int64_t[:], i=cython.Py_ssize_t,
               j=cython.Py_ssize_t, n=cython.Py_ssize_t, k=int64_t, c=int32_t)
cpdef release(object state, object keys, int32_t serial)

@cython.locals(entries=cython.Py_ssize_t, count=cython.Py_ssize_t, pos=cython.Py_ssize_t,
               end=cython.Py_ssize_t, j=cython.Py_ssize_t, m=cython.Py_ssize_t,
               item=list, evicted=list, st=int32_t[:], kv="const int64_t[:]",
               ov=int64_t[:], k=int64_t, free=int32_t, serial=int32_t, live=object)
cpdef take(object queue, object state, set stale, Py_ssize_t n)

@cython.locals(pv=int32_t[:], kv="const int64_t[:]", i=cython.Py_ssize_t, s=int32_t)
cpdef bint place(object pos, object keys, Py_ssize_t start, Py_ssize_t upto) except -1

@cython.locals(i=cython.Py_ssize_t, j=cython.Py_ssize_t, pv=int32_t[:], kv="const int64_t[:]",
               ev="const int64_t[:]", e=int64_t,
               q=cython.Py_ssize_t)
cpdef cut(list log, object pos, object keys, Py_ssize_t n, Py_ssize_t hit)
