# The compiled types of sim/engine/kv/prefix_hits.py (sim/native.py): block mode's hit one C
# call into the pool (typed), the request's fields read from its C struct.
cimport cython
from sim.engine.core.request cimport Request
from sim.engine.kv.prefix_cache cimport PrefixCachingBlockManager, PrefixLookup

@cython.locals(look=PrefixLookup)
cpdef long long _block_hit(dict hits, PrefixCachingBlockManager pool, Request r, long long bs,
                           bint remember) except? -1
