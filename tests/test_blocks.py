"""The KV block pool: counts never leave [0, num_blocks], errors name the numbers."""

import pytest
from hypothesis import given, strategies as st

from sim.engine.kv.blocks import BlockManager, blocks_for


def test_blocks_for_is_ceiling_division():
    assert [blocks_for(t, 16) for t in (0, 1, 15, 16, 17, 32, 33)] == [0, 1, 1, 1, 2, 2, 3]


@given(st.integers(1, 200), st.integers(1, 64),
       st.lists(st.tuples(st.booleans(), st.integers(0, 80)), max_size=60))
def test_allocate_and_free_keep_the_count_in_range(num_blocks, block_size, ops):
    pool = BlockManager(num_blocks, block_size)
    held = 0
    for take, n in ops:
        if take:
            if pool.can_allocate(n):
                pool.allocate(n)
                held += n
            else:
                with pytest.raises(RuntimeError, match=f"allocating {n} KV blocks"):
                    pool.allocate(n)
        else:
            n = min(n, held)
            pool.free(n)
            held -= n
        assert pool.num_free + held == num_blocks and pool.num_used == held
        assert 0 <= pool.num_free <= num_blocks
    assert pool.capacity_tokens == num_blocks * block_size


def test_freeing_more_than_was_taken_is_a_bug_and_raises():
    pool = BlockManager(10, 16)
    pool.allocate(3)
    with pytest.raises(RuntimeError, match="freeing 4 KV blocks with 7 of 10 free"):
        pool.free(4)
    with pytest.raises(RuntimeError):
        pool.allocate(-1)


def test_bad_sizes_name_the_field():
    with pytest.raises(ValueError, match="kv_blocks"):
        BlockManager(0, 16)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(10, 0)
    assert "3 of 3" in repr(BlockManager(3, 16))
