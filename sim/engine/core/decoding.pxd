# The compiled layout of sim/engine/core/decoding.py's Decodes (sim/native.py): its counters
cimport cython
# as C 64-bit integers; its methods C-callable from typed code (cpdef), with typed arguments.
from sim.engine.core.request cimport Request

cdef class Decodes:
    cdef public long long block_size, count, context_offset
    cdef public object by_phase
    cdef public dict finish_at

    @cython.locals(bs=cython.longlong)
    cpdef start(self, Request r, long long i)
    cpdef stop(self, Request r, long long last)
    cpdef long long blocks_needed(self, long long i) except? -1
    cpdef long long context_tokens(self, long long i) except? -1
    @cython.locals(held=cython.longlong)
    cpdef long long held_blocks(self, Request r, long long i, bint reserved) except? -1
    @cython.locals(held=cython.longlong)
    cpdef long long finish(self, Request r, long long i) except? -1

cpdef record_run(Request r, long long last)

cdef class ClippedDecodes(Decodes):
    cdef public long long clip, _serial, _num_a, _num_b, _fin_b
    cdef public list _moves
    cdef public dict _phase

    @cython.locals(fin=cython.longlong)
    cpdef stop(self, Request r, long long last)
    @cython.locals(fin=cython.longlong, moves=list, phase=dict)
    cpdef long long clipped_left(self, long long last) except? -1
