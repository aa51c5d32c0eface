# The compiled layout of sim/engine/kv/blocks.py's BlockManager (sim/native.py).
cdef class BlockManager:
    cdef public long long num_blocks, block_size, num_free, watermark
