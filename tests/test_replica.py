"""Unit checks of the replica state that the built-in FCFS policies rarely reach."""

from sim.replica import ReplicaState
from sim.request import DECODE, PREFILL, WAITING, Request


def _held_total(state):
    return sum(state.held_blocks(r) for r in state.running.values())


def test_preempting_a_decode_after_its_boundary_block_was_taken_frees_that_block():
    state = ReplicaState(kv_blocks=4, block_size=4, max_batch_size=8)
    p = Request(0, 0, 0.0, 40, 5)
    d = Request(1, 1, 0.0, 4, 10)
    for r in (p, d):
        state.waiting.append(r)
        state.admit(r, 0.0)
    # p has 8 prompt tokens cached (2 blocks); d finished its 4-token prefill at iteration 0
    p.num_computed = 8
    state.free_blocks -= 2
    state.prefilling.remove(d)
    d.status, d.num_cached, d.gen_base, d.decode_start = DECODE, 4, 1, 0
    d.phase = (0 + (-4) % 4 + 1) % 4
    d.finish_iter = 9
    state.count_by_phase[d.phase] += 1
    state.context_offset += 4
    state.num_decoding += 1
    state.free_blocks -= 1
    state.iteration = 1  # d writes position 4: needs its 2nd block now
    assert state.free_blocks == 1
    state.prepare_decodes()
    assert state.free_blocks == 0 and state.held_blocks(d) == 2
    assert _held_total(state) + state.free_blocks == 4
    # p needs 2 more blocks: d (admitted later) is preempted, returning both its blocks
    assert state.ensure_blocks(p, 2)
    assert d.status == WAITING and state.waiting[0] is d and d.num_preemptions == 1
    assert p.status == PREFILL
    assert state.free_blocks == 0 and _held_total(state) == 2
    assert d.prefill_target == 4 + 1  # prompt + the token it had generated


def test_ensure_blocks_preempts_the_requester_itself_when_it_is_newest():
    state = ReplicaState(kv_blocks=2, block_size=4, max_batch_size=8)
    a = Request(0, 0, 0.0, 8, 2)
    state.waiting.append(a)
    state.admit(a, 0.0)
    state.free_blocks = 0
    a.num_computed = 8
    assert not state.ensure_blocks(a, 1)
    assert a.status == WAITING and state.free_blocks == 2 and not state.running
