# The compiled layout of sim/engine/core/iteration.py's Iteration, the base class holding a
# replica's state (sim/native.py): the counters as C 64-bit integers, the flags as C ints,
# the clock as a C double, the KV pool a BlockManager (every pool derives from it), the decode
# tracker a Decodes (every tracker derives from it); Replica (its compiled subclass,
# replica.pxd) keeps its other attributes in its dict.
from sim.engine.core.decoding cimport Decodes
from sim.engine.core.request cimport Request
from sim.engine.kv.blocks cimport BlockManager

cdef class Iteration:
    cdef public long long iteration, clock, block_size, max_batch_size, num_spec_tokens
    cdef public long long num_preempted_now, _prefill_tokens, _decodes_reserved
    cdef public long long num_loading, num_in_transit, num_incoming
    cdef public long long batch_decodes, batch_context
    cdef public bint caching, radix, on_demand_decodes, decoding
    cdef public double now
    cdef public BlockManager blocks
    cdef public Decodes decodes
    cdef public object layers, tier, lora, waiting, running, prefilling
    cdef public object select_victim, enqueue, capacity_tokens, finished, paused
    cdef public object on_finish, on_prefilled, on_load, _hits, _pins
    cdef public list _prefill_reqs, _prefills

    cpdef form(self, object schedule, object now)
    cpdef form_batch(self, object schedule, object now, bint detail=*)
    cpdef postprocess(self, object now)
    cpdef finish_decodes(self, long long c, object now)
    cpdef _reserve_decode_blocks(self, long long i)
    cpdef _finish(self, Request r, object now)
    cdef _run(self, Request r)
    cdef _unrun(self, object index)
