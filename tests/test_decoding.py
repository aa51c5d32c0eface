"""Token emission: the lazy decode tracker against brute force, and ITL from token runs."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from sim.engine.core.decoding import Decodes, inter_token_gaps
from sim.engine.core.request import DECODE, Request
from sim.engine.core.spec_decoding import SpecDecodes
from sim.engine.speculation.acceptance import EmissionSource
from sim.engine.speculation.settings import SpeculativeConfig


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([1, 2, 4, 16]),
       st.lists(st.tuples(st.integers(1, 60), st.integers(0, 5), st.integers(2, 30),
                          st.integers(0, 25)), min_size=1, max_size=20))
def test_lazy_tracker_matches_a_per_token_brute_force(bs, specs):
    """Requests start decoding at various iterations (with c tokens cached and g generated);
    at each iteration the O(1) aggregates equal the sums over the requests, and each request
    crosses into a new KV block exactly when its token count passes a block boundary."""
    d = Decodes(bs)
    reqs, start_at = [], {}
    for k, (cached, generated, n_out, start) in enumerate(specs):
        r = Request(k, k, 0.0, cached, max(n_out, generated + 1))
        r.num_computed, r.num_generated = cached, generated
        start_at[k] = start
        reqs.append(r)
    horizon = max(start_at.values()) + 40
    active = []
    for i in range(horizon + 1):
        for r in reqs:
            if start_at[r.index] == i:
                d.start(r, i)
                active.append(r)
        for r in list(active):
            if r.finish_iteration == i:
                assert d.finish(r, i) == -(-(r.decode_base_tokens + i - r.decode_start) // bs)
                assert r.num_generated == r.num_output_tokens
                active.remove(r)
        assert d.count == len(active) == sum(d.by_phase)
        nxt = i + 1  # the next iteration's decodes: tokens attended, blocks crossed into
        ctx = [r.decode_base_tokens + nxt - r.decode_start for r in active]
        assert d.context_tokens(nxt) == sum(ctx)
        assert [Decodes.context_length(r, nxt) for r in active] == ctx
        crossing = sum(1 for c in ctx if (c - 1) % bs == 0)  # its new token opens a block
        assert d.by_phase[nxt % bs] == crossing
        for r in active:
            assert (r.block_phase == nxt % bs) == ((Decodes.context_length(r, nxt) - 1) % bs == 0)
            assert d.held_blocks(r, nxt, False) == -(-(Decodes.context_length(r, nxt) - 1) // bs)
    assert not active and d.context_offset == 0


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([1, 4, 16]), st.integers(1, 5), st.sampled_from([None, 1, 7]),
       st.integers(0, 3),
       st.lists(st.tuples(st.integers(1, 60), st.integers(0, 5), st.integers(2, 90),
                          st.integers(0, 12), st.integers(0, 40), st.sampled_from([None, 0.5])),
                min_size=1, max_size=24))
def test_spec_rings_match_a_per_request_brute_force(bs, k, clip, seed, specs):
    """Speculative decodes start at a few iterations (several at once: one batched flush; one
    alone: the single path), some are preempted: at each iteration the rings' totals equal the
    sums over the running requests of their context slots, new blocks and clipped tokens left,
    computed from the emissions each one drew, and each request's scalars agree."""
    source = EmissionSource(SpeculativeConfig(num_speculative_tokens=k, acceptance_rate=0.7,
                                              method="ngram"), np.random.default_rng(seed))
    drawn = {}

    def draw(r, n):  # records each request's tokens after j verifications, e[j]
        run, base, over = source(n, r.acceptance_rate)
        drawn[r.index] = [int(x) - base for x in run[:-1]] + [n]
        return run, base, over

    d = SpecDecodes(bs, k, draw, clip)
    reqs, start_at, stop_at = [], {}, {}
    for j, (cached, generated, n_out, start, stop, rate) in enumerate(specs):
        r = Request(j, j, 0.0, cached, max(n_out, generated + 1))
        r.num_computed, r.num_generated, r.acceptance_rate = cached, generated, rate
        start_at[j], stop_at[j] = start, start + stop
        reqs.append(r)
    active = []
    for i in range(max(start_at.values()) + 100):
        for r in reqs:
            if start_at[r.index] == i:
                d.start(r, i)
                active.append(r)
        d.flush()
        for r in list(active):
            e, steps = drawn[r.index], i - r.decode_start
            if r.finish_iteration == i:
                held = d.finish(r, i)
                assert held == -(-(r.decode_base_tokens + k + 1 + e[-2]) // bs)
            elif stop_at[r.index] == i:
                d.stop(r, i)
            else:
                continue
            assert r.num_generated == r.decode_base_generated + e[steps]
            active.remove(r)
        nxt = i + 1
        slots, need, left = 0, 0, 0
        for r in active:
            e, c, j = drawn[r.index], r.decode_base_tokens, nxt - 1 - r.decode_start
            slots += c + k + 1 + e[j]
            before = -(-(c + k + 1 + e[j - 1]) // bs) if j else -(-c // bs)
            need += -(-(c + k + 1 + e[j]) // bs) - before
            assert d.context_length(r, nxt) == c + k + 1 + e[j]
            assert d.held_blocks(r, nxt, False) == before
            assert d.generated(r, i) == r.decode_base_generated + e[j]
            left += min(r.num_output_tokens - r.decode_base_generated - e[j], clip or 0)
        assert d.count == len(active)
        assert (d.context_tokens(nxt), d.blocks_needed(nxt)) == (slots, need)
        if clip:
            assert d.clipped_left(i) == left
            d.left[(i - 1) & d.mask] = 0
        d.ctx[i & d.mask] = d.need[i & d.mask] = 0  # (the replica clears the steps it used)
    assert not active and not d.ctx.any() and not d.need.any()


def test_stop_records_progress_and_the_run_of_tokens():
    d = Decodes(16)
    r = Request(0, 0, 0.0, 100, 50)
    r.num_computed, r.num_generated = 100, 1
    d.start(r, 7)
    assert r.status == DECODE and r.finish_iteration == 7 + 49
    d.stop(r, 12)  # preempted before iteration 13: emitted at 8..12
    assert r.num_generated == 1 + 5 and r.segments == [(7, 12)] and r.finish_iteration == -1
    assert d.count == 0 and sum(d.by_phase) == 0 and d.context_offset == 0


@given(st.lists(st.floats(0.001, 1.0), min_size=2, max_size=40), st.data())
def test_inter_token_gaps_equal_materialised_token_times(durations, data):
    end = np.cumsum(durations)
    n_it = len(end)
    reqs, expected_gaps, expected_max = [], [], []
    for k in range(data.draw(st.integers(1, 6))):
        r = Request(k, k, 0.0, 1, 1)
        cuts = sorted(set(data.draw(st.lists(st.integers(0, n_it - 1), min_size=1, max_size=6))))
        runs = [(a, b) for a, b in zip(cuts[::2], cuts[1::2] + [cuts[-1]]) if a <= b]
        r.segments = runs
        times = [end[j] for a, b in runs for j in range(a, b + 1)]
        gaps = list(np.diff(times))
        expected_gaps += gaps
        expected_max.append(max(gaps) if gaps else np.nan)
        reqs.append(r)
    (gap, weights, extra), max_itl = inter_token_gaps(reqs, end)
    pooled = np.concatenate([np.repeat(gap, weights), extra])
    np.testing.assert_allclose(np.sort(pooled), np.sort(expected_gaps), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(max_itl, expected_max, rtol=1e-12)


def test_no_iterations_no_gaps():
    (gap, weights, extra), max_itl = inter_token_gaps([Request(0, 0, 0.0, 1, 1)], np.array([]))
    assert gap.size == weights.size == extra.size == 0 and np.isnan(max_itl[0])
    with pytest.raises(AttributeError):
        Request(0, 0, 0.0, 1, 1).not_a_field = 1  # slots: a typo is an error


def test_inter_token_gaps_of_runs_far_apart_as_a_clusters_requests():
    """A cluster's requests alternate between replicas whose steps lie in separate blocks of
    ``end`` (runs by request index jump back and forth: the runs are taken by start then):
    each request's largest gap is still the largest of its own gaps."""
    rng = np.random.default_rng(5)
    end = np.cumsum(rng.uniform(0.001, 1.0, 2000))
    reqs, expected = [], []
    for k in range(60):
        base = 1000 * (k % 2) + 15 * (k // 2)  # replica k % 2's block of steps
        a = base + int(rng.integers(0, 5))
        runs = [(a, a + int(rng.integers(1, 30)))]
        if k % 3 == 0:  # preempted and resumed later: a second run
            runs.append((runs[0][1] + 3, runs[0][1] + 3 + int(rng.integers(0, 9))))
        r = Request(k, k, 0.0, 1, 1)
        r.segments = runs
        times = [end[j] for a, b in runs for j in range(a, b + 1)]
        expected.append(max(np.diff(times)))
        reqs.append(r)
    _, max_itl = inter_token_gaps(reqs, end)
    np.testing.assert_array_equal(max_itl, expected)
