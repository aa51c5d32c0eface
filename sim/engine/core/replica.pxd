# The compiled layout of sim/engine/core/replica.py's Replica (sim/native.py): the state of its
# base Iteration, its other attributes in a dict; the verbs a policy calls C-callable (cpdef)
# from typed code, a Python override (an instance's, a subclass's) still taking precedence.
from sim.engine.core.iteration cimport Iteration
from sim.engine.core.request cimport Request

cdef class Replica(Iteration):
    cdef dict __dict__
    cdef object __weakref__
    cpdef admit(self, Request r, long long num_tokens)
    cpdef schedule_chunk(self, Request r, long long num_tokens)
    cpdef preempt(self, Request r)
    cpdef _start(self, Request r, long long new, long long cached)
    cpdef _dequeue(self, Request r)
    cpdef _free_blocks(self, Request r, object n)
    cpdef num_generated(self, Request r)
