# The compiled layout of sim/engine/core/spec_decoding.py's SpecDecodes (sim/native.py): a
# Decodes subclass; its rings stay NumPy arrays (the replica and fast-forward read them), read
# and written through typed views (int64_t: any 64-bit integer buffer, NumPy's int64) in the
# C loop that adds a request's vectors.
cimport cython
from libc.stdint cimport int64_t
from sim.engine.core.decoding cimport Decodes
from sim.engine.core.request cimport Request

cdef class SpecDecodes(Decodes):
    cdef public long long k, mask
    cdef public object draw, ctx, need, clip, left
    cdef public list pending

    @cython.locals(rv=int64_t[:], ctx=int64_t[:], need=int64_t[:], left=int64_t[:],
                   j=cython.Py_ssize_t, lo=cython.longlong, x=cython.longlong,
                   h=cython.longlong, prev=cython.longlong, at=cython.longlong,
                   off=cython.longlong, base=cython.longlong, bs=cython.longlong,
                   mask=cython.longlong, clip=cython.longlong, rem=cython.longlong)
    cpdef _add_plan(self, Request r, long long steps, long long sign)
    cpdef long long _held(self, Request r, long long j) except? -1
