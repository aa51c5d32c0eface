# The compiled layout of sim/costs/roofline_price.py's RooflinePrice (sim/native.py): the
# roofline's terms as C doubles, its memo and cost model as Python objects.
cdef class RooflinePrice:
    cdef public object cost
    cdef public dict cache
    cdef public double fixed_s, per_seq_s, eager_s, decode_s_per_ctx, decode_flops_s_per_ctx
    cdef public double decode_bytes_s_per_ctx, attn_floor, attn_half, pa, pb, pc
    cdef public double per_iter_cpu_s, per_seq_cpu_s, prefill_iter_s, prefill_host_s
    cdef public long long graph_max
    cdef public bint overheads, overlap
    cpdef double price(self, object prefills, long long num_prefill_tokens, long long n_dec,
                       long long ctx, long long spec)

cdef class DraftPrice(RooflinePrice):
    cdef public RooflinePrice target, draft
    cdef public long long k
    cdef public double ratio

cdef class DecodePrice:
    cdef public double base, per_ctx, floor
