"""The replica's verbs and invariants, driven the way a policy drives them."""

import pytest

from sim.engine.core.replica import Replica
from sim.engine.core.request import DECODE, PREFILL, WAITING, Request


def _held_total(replica):
    return sum(replica.held_blocks(r) for r in replica.running.values())


def _begin(rep, now):
    """Start an iteration as the engine does, with no policy: the test acts as the policy."""
    return rep.form_batch(lambda replica, now: None, now)


def _replica(kv_blocks, block_size=4, max_batch_size=8, requests=(), select_victim=None):
    rep = Replica(kv_blocks, block_size, max_batch_size, select_victim)
    for r in requests:
        rep.enqueue(r)
    return rep


def test_preempting_a_decode_after_its_boundary_block_was_taken_frees_that_block():
    p = Request(0, 0, 0.0, 40, 5)
    d = Request(1, 1, 0.0, 4, 10)
    rep = _replica(4, requests=(p, d))
    _begin(rep, 0.0)
    assert rep.admit(p, 8) and rep.admit(d, 4)  # p: 2 blocks, d: its whole 4-token prompt
    rep.postprocess(0.1)
    assert p.status == PREFILL and d.status == DECODE and rep.blocks.num_free == 1
    _begin(rep, 0.1)  # d writes position 4: takes its 2nd block now
    assert rep.blocks.num_free == 0 and rep.held_blocks(d) == 2
    assert _held_total(rep) + rep.blocks.num_free == 4
    # p needs 2 more blocks: d (admitted later) is preempted, returning both its blocks
    assert rep.schedule_chunk(p, 8)
    assert d.status == WAITING and rep.waiting[0] is d and d.num_preemptions == 1
    assert p.status == PREFILL and rep.num_preempted_now == 1
    assert rep.blocks.num_free == 0 and _held_total(rep) == 4  # p: 16 tokens scheduled
    assert d.prefill_target == 4 + 1  # prompt + the token it had generated
    assert d.segments == [(0, 0)]  # its first token came from the prefill iteration


def test_schedule_chunk_preempts_the_requester_itself_when_it_is_newest():
    a = Request(0, 0, 0.0, 12, 2)
    rep = _replica(2, requests=(a,))
    _begin(rep, 0.0)
    assert rep.admit(a, 8) and rep.blocks.num_free == 0
    rep.postprocess(1.0)
    _begin(rep, 1.0)
    assert not rep.schedule_chunk(a, 4)
    assert a.status == WAITING and rep.blocks.num_free == 2 and not rep.running
    assert rep.batch().prefills == ()


def test_admit_takes_any_waiting_request_and_refuses_without_slot_or_blocks():
    reqs = [Request(i, i, 0.0, n, 3) for i, n in enumerate((30, 5, 9))]
    rep = _replica(4, max_batch_size=2, requests=reqs)
    _begin(rep, 0.0)
    assert rep.admit(reqs[1], 5)  # from the middle of the queue
    assert list(rep.waiting) == [reqs[0], reqs[2]]
    assert not rep.admit(reqs[0], 30)  # 8 blocks > 2 free: nothing changes
    assert list(rep.waiting) == [reqs[0], reqs[2]] and rep.blocks.num_free == 2
    assert rep.admit(reqs[2], 4)
    assert not rep.admit(reqs[0], 1)  # max_batch_size 2 reached
    batch = rep.batch(detail=True)
    assert batch.prefills == ((5, 0), (4, 0)) and batch.prefill_ids == (1, 2)
    assert batch.num_prefill_tokens == 9 and rep.is_scheduled(reqs[2])


def test_verbs_refuse_misuse_with_clear_errors():
    a, b = Request(0, "a", 0.0, 10, 2), Request(1, "b", 0.0, 10, 2)
    rep = _replica(10, requests=(a,))
    _begin(rep, 0.0)
    with pytest.raises(ValueError, match="num_tokens must be in 1..10"):
        rep.admit(a, 11)
    with pytest.raises(ValueError, match="not in this replica's queue"):
        rep.admit(b, 5)
    with pytest.raises(ValueError, match="not prefilling"):
        rep.schedule_chunk(a, 2)
    assert rep.admit(a, 4)
    with pytest.raises(ValueError, match="not waiting"):
        rep.admit(a, 4)
    with pytest.raises(ValueError, match="already has work"):
        rep.schedule_chunk(a, 2)
    with pytest.raises(ValueError, match="not running"):
        rep.preempt(b)


def test_queue_and_running_set_are_read_only_to_policies():
    a = Request(0, 0, 0.0, 10, 2)
    rep = _replica(10, requests=(a,))
    for mutate in (lambda: rep.waiting.popleft(), lambda: rep.waiting.append(a),
                   lambda: rep.waiting.remove(a), lambda: rep.running.pop(0, None),
                   lambda: rep.running.__setitem__(0, a), lambda: rep.running.clear()):
        with pytest.raises(TypeError, match="read-only"):
            mutate()
    assert len(rep.waiting) == 1 and rep.waiting[0] is a and isinstance(rep.prefilling, tuple)


def test_preempting_a_request_that_already_has_work_drops_it_from_the_batch():
    a, b = Request(0, 0, 0.0, 16, 4), Request(1, 1, 0.0, 8, 4)
    rep = _replica(6, requests=(a, b))
    _begin(rep, 0.0)
    assert rep.admit(a, 16) and rep.admit(b, 8)  # 4 + 2 blocks: pool full
    rep.preempt(a)  # a policy may preempt anyone, even work it scheduled this iteration
    batch = rep.batch(detail=True)
    assert batch.prefills == ((8, 0),) and batch.prefill_ids == (1,)
    assert batch.num_prefill_tokens == 8 and rep.blocks.num_free == 4
    assert a.status == WAITING and rep.waiting[0] is a and _held_total(rep) == 2
    rep.postprocess(1.0)
    assert b.status == DECODE and a.first_token_time is None


def test_custom_victim_rule_is_used_for_decode_blocks():
    oldest = lambda replica: next(iter(replica.running.values()))  # noqa: E731
    reqs = [Request(i, i, 0.0, 4, 20) for i in range(3)]
    rep = _replica(3, requests=reqs, select_victim=oldest)
    _begin(rep, 0.0)
    for r in reqs:
        assert rep.admit(r, 4)
    rep.postprocess(1.0)
    _begin(rep, 1.0)  # all three cross into a 2nd block with the pool empty: evict oldest first
    # evicting #0 frees 1 block and needs 1 fewer: still 1 short, so #1 goes too
    assert reqs[0].status == reqs[1].status == WAITING and reqs[2].status == DECODE
    assert list(rep.waiting) == [reqs[1], reqs[0]]  # each victim goes to the head
    assert rep.blocks.num_free == 1 and _held_total(rep) == 2


def test_batch_is_a_snapshot_that_outlives_the_iteration():
    a = Request(0, 0, 0.0, 8, 3)
    rep = _replica(10, requests=(a,))
    _begin(rep, 0.0)
    rep.admit(a, 8)
    b0 = rep.batch()
    rep.postprocess(1.0)
    _begin(rep, 1.0)
    b1 = rep.batch(detail=True)
    rep.postprocess(2.0)
    assert (b0.iteration, b0.prefills, b0.num_decode_tokens) == (0, ((8, 0),), 0)
    assert (b1.iteration, b1.num_decode_tokens, b1.decode_context_tokens) == (1, 1, 9)
    assert b1.decode_ids == (0,) and b1.decode_context_lengths().tolist() == [9]
    with pytest.raises(AttributeError, match="immutable"):
        b1.num_decode_tokens = 5
    with pytest.raises(ValueError):
        b1.decode_lengths[0] = 3  # the array is read-only too
    with pytest.raises(AttributeError, match="needs_decode_lengths"):
        _begin(rep, 2.0).decode_context_lengths()
