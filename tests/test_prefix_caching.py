"""Prefix caching in the engine (vLLM v1's block mode): hits, the prompt - 1 cap, LRU eviction,
preempted requests hitting their own blocks, and the ideal hit rate on real traces."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import sim
import workloads
from sim.engine.kv.prefix_cache import PrefixCachingBlockManager
from sim.engine.core.replica import Replica
from sim.engine.core.request import Request
from sim.engine.core import replica as replica_module


class _Watched(PrefixCachingBlockManager):
    """The pool with methods a test can patch (the compiled pool's class is a C type, whose
    methods cannot be set: its calls to them still reach a Python subclass's)."""


def _watch(monkeypatch):
    """The engine's block pools are :class:`_Watched` from here on (replica.py builds them)."""
    monkeypatch.setattr(replica_module, "PrefixCachingBlockManager", _Watched)


def _lookup(pool, keys, limit) -> tuple:
    """``(hit, free_hits)``: how many of ``keys[:limit]`` are cached from the first on, and how
    many of those are free (what a fresh walk of the pool answers)."""
    hit = pool.hits(keys, 0, limit)
    return hit, pool.pinned(keys, hit)

def _df(rows, hash_bs=16):
    """rows: (arrival, prompt, output, hash_ids)."""
    df = pd.DataFrame(rows, columns=["arrival_time", "num_prompt_tokens", "num_output_tokens",
                                     "hash_ids"])
    df.attrs["block_size"] = hash_bs
    return df


def _ids(prefix, n):
    return [hash((prefix, k)) & 0xFFFFFFF for k in range(n)]


def _run(df, **kw):
    kw.setdefault("cost_model", sim.ConstantCost(0.01))
    kw.setdefault("scheduler", "continuous")
    return sim.run(df, prefix_caching="block", **kw)


@pytest.mark.parametrize("prompt", [64, 70, 17, 16, 200])
def test_identical_prompts_hit_all_full_blocks_but_the_last_token(prompt):
    ids = _ids("p", -(-prompt // 16))
    res = _run(_df([(0.0, prompt, 4, ids), (10.0, prompt, 4, ids)]))
    cached = res.requests["num_cached_tokens"].tolist()
    assert cached == [0, (prompt - 1) // 16 * 16]
    # the second prefill computes only the rest, over the cached prefix
    assert res.requests["num_prefill_computed"].tolist() == [prompt, prompt - cached[1]]
    s = res.summary()
    assert s["prefix_hit_rate"] == pytest.approx(cached[1] / (2 * prompt))


def test_caching_off_and_requests_without_hash_ids_never_hit():
    ids = _ids("p", 4)
    df = _df([(0.0, 64, 4, ids), (10.0, 64, 4, ids), (20.0, 64, 4, None)])
    off = sim.run(df, cost_model=sim.ConstantCost(0.01), scheduler="continuous")
    assert off.requests["num_cached_tokens"].sum() == 0 and off.summary()["prefix_hit_rate"] == 0
    on = _run(df)
    assert on.requests["num_cached_tokens"].tolist() == [0, 48, 0]


def test_a_prompt_differing_from_the_first_token_gets_no_hits(unshared):
    """The cheat sheet: no prefix hits? Is the system prompt identical from the first token?"""
    same = workloads.shared_prefix(40, n_groups=1, system_prompt_tokens=1024, user_tokens=64,
                                   output=8, rate=2.0, seed=1)
    shifted = unshared(same)
    hit = _run(same, model="llama-3.1-8b", gpu="h100", cost_model=None)
    miss = _run(shifted, model="llama-3.1-8b", gpu="h100", cost_model=None)
    assert miss.summary()["prefix_hit_rate"] == 0
    assert hit.summary()["prefix_hit_rate"] > 0.8
    # the shared system prompt is the TTFT win
    assert hit.summary()["ttft_mean"] < 0.5 * miss.summary()["ttft_mean"]


def test_lru_evicts_the_least_recently_freed_blocks_tail_first():
    pool = PrefixCachingBlockManager(6, 16, num_keys=6)
    a, b = np.arange(0, 3), np.arange(3, 6)  # two prompts' key ids
    pool.allocate(3)
    assert pool.register(a).tolist() == a.tolist()
    pool.allocate(3)
    assert pool.register(b).tolist() == b.tolist() and not len(pool.register(b[:1]))  # cached
    assert pool.num_free == 0
    pool.release(a, 0)  # a freed first, tail first: a2, a1, a0
    pool.release(b, 0)
    assert pool.num_free == 6 and _lookup(pool, a, 3) == (3, 3)
    pool.allocate(2)  # evicts from the head: a2 then a1
    assert _lookup(pool, a, 3) == (1, 1) and pool.num_evictions == 2
    pool.acquire(b[:2])  # a hit takes b0, b1 out of the free queue
    assert pool.num_free == 2
    pool.allocate(2)  # a0, then b2 (b0 and b1 are referenced)
    assert _lookup(pool, a, 3) == (0, 0) and _lookup(pool, b, 3) == (2, 0)
    with pytest.raises(RuntimeError):
        pool.allocate(1)


def test_bounded_pool_lowers_the_hit_rate_in_the_engine():
    df = workloads.shared_prefix(300, n_groups=30, system_prompt_tokens=512, user_tokens=64,
                                 output=16, rate=5.0, seed=2)
    big = _run(df, kv_blocks=100_000).summary()["prefix_hit_rate"]
    small = _run(df, kv_blocks=120).summary()["prefix_hit_rate"]
    assert big == pytest.approx(workloads.ideal_prefix_hit_rate(df, 16), rel=0.02)
    assert small < big


def test_a_preempted_request_hits_its_own_blocks_when_it_comes_back():
    a = Request(0, 0, 0.0, 64, 50)
    b = Request(1, 1, 0.0, 32, 50)
    a.block_keys = np.arange(4)
    rep = Replica(8, 16, 8, prefix_caching=True)
    rep.enqueue(a)
    rep.enqueue(b)
    rep.form_batch(lambda r, now: (r.admit(a, 64), r.admit(b, 32)), 0.0)
    assert rep.blocks.num_free == 2 and len(a.kv_keys) == 4
    rep.postprocess(1.0)
    rep.preempt(a)  # its 4 cached blocks keep their keys in the free queue
    assert rep.blocks.num_free == 6 and a.kv_keys == ()
    # back with its prompt + 1 generated token (65): all 4 prompt blocks hit (cap 65 - 1 = 64)
    assert rep.prefix_hit(a) == 64
    rep.form_batch(lambda r, now: r.admit(a, a.prefill_target - 64), 1.0)
    assert a.num_computed == 64 and a.num_cached_tokens == 0  # first admission had no hit
    assert rep.batch().prefills[-1] == (1, 64) and rep.blocks.num_free == 0
    assert rep.blocks.num_evictions == 0  # its own blocks came back, none was reused meanwhile


def _check_stale_marks(pool):
    """Each queued run of cached entries whose serial the pool does not mark stale holds only
    live entries from its position on (allocate evicts them without looking)."""
    for item in pool._queue:
        if len(item) == 3 and item[0] not in pool._stale:
            serial, keys, pos = item
            assert (pool._state[keys[pos:]] == -serial).all()


class _PoolCheck:
    """Wraps a policy; after each schedule checks that free + distinct blocks held == pool."""

    def __init__(self, policy):
        self.policy, self.name, self.checks = policy, policy.name, 0

    def schedule(self, replica, now):
        self.policy.schedule(replica, now)
        pool = replica.blocks
        keyed = set()
        anonymous = 0
        for r in replica.running.values():
            keyed.update(r.kv_keys)
            anonymous += replica.held_blocks(r) - len(r.kv_keys)
        queued = sum(item[0] if len(item) == 1 else  # anonymous runs and live cached entries
                     int((pool._state[item[1][item[2]:]] == -item[0]).sum())
                     for item in pool._queue)
        assert queued == pool.num_free
        assert pool.num_free + anonymous + len(keyed) == pool.num_blocks
        free_cached = int(np.count_nonzero(pool._state < 0))  # each with one live entry:
        assert free_cached == queued - sum(item[0] for item in pool._queue if len(item) == 1)
        _check_stale_marks(pool)
        self.checks += 1


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 3), st.integers(1, 90), st.integers(1, 20),
                          st.integers(0, 3)), min_size=1, max_size=30),
       st.integers(8, 40),
       st.sampled_from(["continuous", "chunked", "static", "vllm", "sarathi", "orca"]))
def test_everything_finishes_and_the_pool_never_leaks(rows, kv_blocks, sched):
    from sim.engine import (VLLM, ChunkedPrefill, ContinuousBatching, Orca, Sarathi,
                            StaticBatching)
    rows.sort()
    df = _df([(t, p, o, _ids(("g", g), -(-p // 4))) for t, p, o, g in rows], hash_bs=4)
    policy = {"continuous": ContinuousBatching(), "chunked": ChunkedPrefill(16),
              "static": StaticBatching(), "vllm": VLLM(16), "sarathi": Sarathi(16),
              "orca": Orca()}[sched]
    check = _PoolCheck(policy)
    res = sim.run(df, scheduler=check, prefix_caching="block", block_size=4, kv_blocks=kv_blocks,
                  max_batch_size=4, cost_model=sim.ConstantCost(0.01))
    req = res.requests
    fits = -(-(df.num_prompt_tokens + df.num_output_tokens) // 4) <= kv_blocks
    assert (req["status"] == "finished").tolist() == fits.tolist()
    assert check.checks == len(res.iterations)
    assert (res.iterations["kv_blocks_used"] <= kv_blocks).all()
    assert (req["num_cached_tokens"] <= (req["num_prompt_tokens"] - 1).clip(lower=0)).all()


def test_ideal_hit_rate_on_hand_cases():
    ids = _ids("x", 4)
    df = _df([(0.0, 64, 1, ids), (1.0, 64, 1, ids), (2.0, 40, 1, ids[:3]), (3.0, 10, 1, None)])
    # request 2: 48 of 64 (cap); request 3: its 2 full blocks (cap (40-1)//16 = 2): 32
    assert workloads.ideal_prefix_hit_rate(df, 16) == pytest.approx((48 + 32) / (64 + 64 + 40 + 10))
    assert workloads.ideal_prefix_hit_rate(df, 32) == pytest.approx((32 + 32) / 178)
    keys = workloads.prefix_block_keys(ids, 16, 64, 32)
    assert len(keys) == 2 and keys[0] != workloads.prefix_block_keys(ids[::-1], 16, 64, 32)[0]
    with pytest.raises(ValueError, match="hash_ids"):
        workloads.ideal_prefix_hit_rate(pd.DataFrame({"num_prompt_tokens": [1]}))


@pytest.mark.parametrize("trace, raw", [("mooncake-conversation", 0.366),
                                        ("mooncake-synthetic", 0.640)])
def test_engine_reaches_the_ideal_hit_rate_on_mooncake_traces(trace, raw):
    # (within the default model's context, Llama-3.1-8B's 131,072 tokens: one request of the
    # synthetic trace's first 1,500 is longer, and would be rejected)
    df = workloads.load(trace, n=1500, max_context=131072)
    assert workloads.ideal_prefix_hit_ratio(workloads.load(trace)) == pytest.approx(raw, abs=0.001)
    df = df.assign(arrival_time=np.arange(len(df)) * 1000.0)  # no two requests overlap
    ideal = workloads.ideal_prefix_hit_rate(df, 512)
    res = sim.run(df, scheduler="continuous", prefix_caching="block", block_size=512,
                  kv_blocks=10**6, cost_model=sim.ConstantCost(0.01), max_batch_size=1)
    assert res.summary()["prefix_hit_rate"] == pytest.approx(ideal, abs=1e-12)
    assert ideal > 0.2


@pytest.mark.parametrize("mode", ["block", "radix"])
def test_lookups_are_remembered_only_for_requests_queued_here(mode):
    """A blocked queue head is looked up every iteration: its answer is remembered until it is
    admitted; a router's look at every replica leaves nothing behind."""
    r = Request(0, 0, 0.0, 64, 4)
    r.block_keys = (workloads.unit_keys_all([_ids("a", 4)])[0] if mode == "radix"
                    else np.arange(4))
    rep = Replica(100, 16, 8, prefix_caching=mode, cache_unit=16)
    assert rep.prefix_hit(r, remember=False) == 0 and not rep._hits
    rep.enqueue(r)
    assert rep.prefix_hit(r) == 0 and list(rep._hits) == [r]
    rep.form_batch(lambda rep, now: rep.admit(r, 64), 0.0)
    assert not rep._hits and not rep._pins


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "finish", "ask", "fill", "churn"]),
                          st.integers(0, 5), st.integers(0, 3)), min_size=40, max_size=150),
       st.integers(4, 30), st.booleans())
def test_remembered_lookups_match_a_fresh_walk(ops, num_blocks, moved):
    """A PrefixLookup, kept, cut or resumed between asks, answers what a walk from the first key
    answers: the hit and the free blocks among it, and the queue's runs the pool does not mark
    stale hold only live entries (hypothesis: requests sharing prefixes
    admitted, finished and asked in any order, evicting one another, anonymous blocks taken and
    given back to force evictions, more evictions than the pool logs between two asks; with
    ``moved``, the last request's keys are the first one's in reverse order: ids at two
    positions, which no chained key gives)."""
    pool = PrefixCachingBlockManager(num_blocks, 16)
    # six requests over three shared prefixes: (prefix, j) keys, lengths 3..8 blocks, interned
    names = [[(("p", i % 3) if j < 2 + i % 3 else ("own", i), j) for j in range(3 + i)]
             for i in range(6)]
    ids = {}
    keys = [np.array([ids.setdefault(n, len(ids)) for n in k]) for k in names]
    if moved:
        keys[5] = np.concatenate((keys[0][::-1], keys[5][3:]))
    looks = [pool.lookup(k) for k in keys]
    held = {}
    churned = 0
    for op, i, extra in ops:
        k = keys[i]
        limit = max(0, len(k) - 1 - extra)
        if op == "ask" or (op == "admit" and i not in held):
            got = pool.refresh(looks[i], limit)
            assert got == pool.hits(k, 0, limit)
            assert pool.refresh_pinned(looks[i]) == pool.pinned(k, got)
        if op == "admit" and i not in held:
            hit = pool.hits(k, 0, limit)
            need = len(k) - hit
            if need + pool.pinned(k, hit) > pool.num_free:
                continue
            pool.acquire(k[:hit])
            pool.allocate(need)
            new = pool.register(k[hit:])
            held[i] = (np.concatenate((k[:hit], new)), need - len(new))
        elif op == "finish" and i in held:
            pool.release(*held.pop(i))
        elif op == "fill":  # anonymous blocks taken (evicting from the LRU head), some returned
            n = min(pool.num_free, 1 + i + extra)
            pool.allocate(n)
            pool.free(n // 2)
        elif op == "churn":  # a request with keys of its own, many times over the pool: more
            churned += 1  # evictions than the pool logs (the last 2 x num_blocks + 64 at most)
            fresh = np.arange(3 * num_blocks + 70) + 1000 * churned
            pool.lookup(fresh)
            for part in np.array_split(fresh, 4):
                n = min(pool.num_free, len(part))
                pool.allocate(n)
                pool.release(pool.register(part[:n]), 0)
        _check_stale_marks(pool)
    for look, k in zip(looks, keys):  # one more ask each, after everything
        assert pool.refresh(look, len(k) - 1) == pool.hits(k, 0, len(k) - 1)
        assert pool.refresh_pinned(look) == pool.pinned(k, look.hit)


def test_a_lookup_is_kept_while_nothing_changes_and_resumed_while_nothing_is_evicted(
        monkeypatch):
    """A blocked queue head is asked every iteration: no walk while nothing was cached and none
    of its hit's keys evicted, a walk from the old hit after additions, the hit cut at its
    first evicted key without a walk, and from there after additions."""
    pool = _Watched(4, 16)
    a = np.arange(4)
    look = pool.lookup(a)
    starts = []
    walk = PrefixCachingBlockManager.hits
    monkeypatch.setattr(_Watched, "hits",
                        lambda self, keys, start, limit: starts.append(start) or walk(
                            self, keys, start, limit))
    assert pool.refresh(look, 3) == 0 and starts == [0]
    assert pool.refresh(look, 3) == 0 and starts == [0]  # kept
    pool.allocate(2)
    pool.register(a[:2])
    assert pool.refresh(look, 3) == 2 and starts == [0, 0]  # resumed from the old hit, 0
    pool.allocate(2)
    pool.register(a[2:])
    assert pool.refresh(look, 3) == 3 and starts[-1] == 2  # resumed from 2
    assert pool.refresh(look, 1) == 1 and starts[-1] == 1  # a lower cap: no walk past it
    assert pool.refresh_pinned(look) == 0
    pool.release(a, 0)  # all four free, still cached (a3 first in the queue, a0 last)
    assert pool.refresh(look, 3) == 3 and pool.refresh_pinned(look) == 3
    pool.allocate(2)  # evicts a3, a2
    walks = len(starts)
    assert pool.refresh(look, 3) == 2 and len(starts) == walks  # cut at a2: no walk
    assert pool.refresh_pinned(look) == 2
    pool.allocate(1)  # evicts a1: cut again
    assert pool.refresh(look, 3) == 1 and len(starts) == walks
    assert pool.refresh_pinned(look) == 1
    pool.register(a[1:3])  # two of the blocks just taken hold a1 and a2 again: resumed
    assert pool.refresh(look, 3) == 3 and starts[-1] == 1
    assert pool.refresh_pinned(look) == 1  # a0 free, a1 and a2 held


def test_a_prefill_chunk_s_evictions_cut_a_lookup_at_its_first_evicted_key(monkeypatch):
    """Many keys evicted at once (a prefill chunk's blocks) are checked against a remembered
    hit in one pass: it is cut at the first position evicted, with no walk."""
    pool = _Watched(40, 16)
    a = np.arange(20)
    look = pool.lookup(a)
    pool.allocate(20)
    pool.register(a)
    pool.release(a, 0)  # queue: 20 anonymous blocks, then a19 ... a0
    assert pool.refresh(look, 19) == 19 and pool.refresh_pinned(look) == 19
    monkeypatch.setattr(_Watched, "hits", None)  # no walk from here on
    pool.allocate(35)  # the anonymous blocks, then a19 ... a5 evicted
    assert pool.num_evictions == 15
    assert pool.refresh(look, 19) == 5 and pool.refresh_pinned(look) == 5


def test_the_engine_s_remembered_lookups_match_a_fresh_walk_on_a_full_pool(monkeypatch):
    """On Mooncake's conversations with a full pool (a blocked queue head asked every
    iteration, evictions almost every iteration, answers cached, preemptions), every remembered
    lookup's hit and free blocks equal a walk from the first key; after evictions the hit is
    kept or cut by the eviction check, not walked again."""
    walk, refresh = PrefixCachingBlockManager.hits, PrefixCachingBlockManager.refresh
    pinned = PrefixCachingBlockManager.refresh_pinned
    asks = {"after evictions": 0, "cut": 0, "walked from the first key": 0}

    def checked_refresh(pool, look, limit):
        evicted, before = look.evictions not in (-1, pool.num_evictions), look.hit
        hit = refresh(pool, look, limit)
        assert hit == walk(pool, look.keys, 0, limit)
        if evicted:
            asks["after evictions"] += 1
            asks["cut"] += hit < before
        return hit

    def checked_pinned(pool, look):
        assert pinned(pool, look) == pool.pinned(look.keys, look.hit)
        return look.pinned

    def counted_walk(pool, keys, start, limit):
        asks["walked from the first key"] += start == 0 and pool.num_evictions > 0
        return walk(pool, keys, start, limit)

    _watch(monkeypatch)
    monkeypatch.setattr(_Watched, "hits", counted_walk)
    monkeypatch.setattr(_Watched, "refresh", checked_refresh)
    monkeypatch.setattr(_Watched, "refresh_pinned", checked_pinned)
    res = sim.run(workloads.load("mooncake-conversation", n=200), scheduler="vllm",
                  kv_blocks=2000)
    assert res.summary()["num_preemptions"] > 0 and res.summary()["prefix_hit_rate"] > 0
    assert asks["after evictions"] > 1000 and asks["cut"] > 10
    # (the walks from the first key are the lookups' first asks: each ask after evictions was
    # one before the eviction check)
    assert asks["walked from the first key"] < asks["after evictions"] / 4, asks


@pytest.mark.parametrize("hash_bs, bs", [(16, 16), (64, 16), (24, 16), (16, 32), (40, 24)])
def test_key_ids_are_equal_exactly_when_the_keys_are(hash_bs, bs):
    """The engine's key ids: one int64 array per prompt, equal ids exactly where
    :func:`block_keys_all`'s keys are equal (integer and non-integer hash ids alike), below
    ``ceil(H / block_size)`` x the distinct chains; prompts without ids or without a full block
    get none."""
    from workloads.prefix import block_key_ids, block_keys_all
    rng = np.random.default_rng(hash_bs + bs)
    ints = [None, []] + [rng.integers(0, 3, size=rng.integers(1, 7)).tolist() for _ in range(40)]
    for lists in (ints, [None if ids is None else [str(i) for i in ids] for ids in ints]):
        prompts = [int(rng.integers(1, 8 * hash_bs)) for _ in lists]
        keys = block_keys_all(lists, hash_bs, prompts, bs)
        ids = block_key_ids(lists, hash_bs, prompts, bs)
        assert [len(i) for i in ids] == [len(k) for k in keys]
        assert all(i.dtype == np.int64 for i in ids) and not len(ids[0]) and not len(ids[1])
        flat_keys = [k for ks in keys for k in ks]
        flat_ids = np.concatenate(ids).tolist()
        assert len(set(flat_ids)) == len(set(flat_keys))
        assert len(set(zip(flat_ids, flat_keys))) == len(set(flat_keys))  # a bijection
        # distinct chains: distinct prefixes hash_ids[0..k]
        distinct = len({tuple(ids[:n]) for ids in lists if ids for n in range(1, len(ids) + 1)})
        assert 0 <= min(flat_ids) and max(flat_ids) < -(-hash_bs // bs) * distinct
        assert max(flat_ids) < 2 * len(flat_ids)  # (renumbered where most would go unused)
    assert block_key_ids([], 16, [], 16) == []


@pytest.mark.parametrize("enabled", [True, False])
def test_key_lists_are_cut_without_collector_passes_and_leave_it_as_found(enabled):
    """Thousands of key lists at once: no cyclic collection runs while they are built (each
    would traverse the whole flat key list), and the collector is left as it was found."""
    import gc
    from workloads.prefix import block_keys_all
    ids = [[i % 7, i % 5, i] for i in range(3000)]
    inside = [False]
    passes = []
    callback = lambda phase, info: inside[0] and passes.append(phase)  # noqa: E731
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    gc.callbacks.append(callback)
    try:
        gc.collect()  # the generation counts start from 0
        inside[0] = True
        keys = block_keys_all(ids, 16, [48] * len(ids), 16)
        inside[0] = False  # (the next allocation may collect: the lists are counted)
        gc.collect()
        inside[0] = True
        units = workloads.unit_keys_all(ids)
        inside[0] = False
        assert gc.isenabled() is enabled
    finally:
        gc.callbacks.remove(callback)
        (gc.enable if was else gc.disable)()
    assert passes == []
    assert keys[5] == workloads.prefix_block_keys(ids[5], 16, 48, 16) and len(units[7]) == 3


def test_the_free_blocks_a_hit_pins_are_counted_only_when_they_can_decide(monkeypatch):
    """Block mode: a hit pins at most one free block per key, so with room for the request's
    new blocks plus its whole hit the admission does not count them; without that room it does
    (and refuses when they do not fit)."""
    keys = np.arange(4)
    _watch(monkeypatch)
    rep = Replica(12, 16, 8, prefix_caching=True)
    first = Request(0, 0, 0.0, 64, 4)
    first.block_keys = keys
    rep.enqueue(first)
    rep.form_batch(lambda r, now: r.admit(first, 64), 0.0)
    rep.postprocess(1.0)
    rep.preempt(first)  # its 4 cached blocks are free, keys kept
    counted = []
    pinned = PrefixCachingBlockManager.refresh_pinned
    monkeypatch.setattr(_Watched, "refresh_pinned",
                        lambda pool, look: counted.append(look) or pinned(pool, look))
    again = Request(1, 1, 0.0, 64, 4)
    again.block_keys = keys
    rep.enqueue(again)
    assert rep.prefix_hit(again) == 48  # 3 blocks hit (cap 63 tokens)
    rep.blocks.allocate(4)  # 8 free: room for its 1 new block and its 3 hit blocks
    assert rep.admit(again, 16) and counted == []
    rep.preempt(again)
    rep.blocks.allocate(5)  # 3 free, all cached: 1 new + 3 pinned do not fit, counted
    assert not rep.admit(again, 16) and len(counted) == 1


_ODD_IDS = [[-1], [-1, -1], [-1, 5], [5], [-1, -1, 5], [0, -1], [0], [-2, -1, 5], [2**62, -1]]


@pytest.mark.parametrize("kind", [list, tuple, np.array])
@pytest.mark.parametrize("hash_bs, bs", [(16, 16), (32, 16), (16, 32)])
def test_keys_are_equal_exactly_where_the_content_is_with_negative_ids(kind, hash_bs, bs):
    """Block keys, key ids and radix unit keys are equal exactly where the tokens they name are
    (the chain of ids up to the one covering the block's last token, and the block's index):
    the id -1 once added nothing to a chain, so [-1, 5] was named as [5] and [-1, -1] as [-1]."""
    from workloads.prefix import block_key_ids, block_keys_all
    lists = [kind(ids) for ids in _ODD_IDS]
    prompts = [len(ids) * hash_bs for ids in _ODD_IDS]
    content = [[(tuple(ids[:((j + 1) * bs - 1) // hash_bs + 1]), j)
                for j in range(len(ids) * hash_bs // bs)] for ids in _ODD_IDS]
    flat = [c for cs in content for c in cs]
    for keys in (block_keys_all(lists, hash_bs, prompts, bs),
                 [i.tolist() for i in block_key_ids(lists, hash_bs, prompts, bs)]):
        pairs = set(zip([k for ks in keys for k in ks], flat))
        assert len(pairs) == len({k for k, _ in pairs}) == len(set(flat))
    units = [k for ks in workloads.unit_keys_all(lists) for k in ks]
    chains = [tuple(ids[:k + 1]) for ids in _ODD_IDS for k in range(len(ids))]
    assert len(set(zip(units, chains))) == len(set(units)) == len(set(chains))


@pytest.mark.parametrize("mode", ["block", "radix"])
def test_a_prompt_after_id_minus_one_does_not_hit_the_same_id_at_the_start(mode):
    """[-1, 5, 8] shares its first block with [-1] only: 16 of 66 prompt tokens, in the ideal
    and in the engine (block and radix); both said 32 when -1 vanished from the chain."""
    df = _df([(0.0, 17, 2, [5, 7]), (1.0, 16, 2, [-1]), (2.0, 33, 2, [-1, 5, 8])])
    assert workloads.ideal_prefix_hit_rate(df, 16, mode=mode) == pytest.approx(16 / 66)
    res = sim.run(df, prefix_caching=mode, kv_blocks=100, cost_model=sim.ConstantCost(0.01))
    assert res.summary()["prefix_hit_rate"] == pytest.approx(16 / 66)
    assert res.requests["num_cached_tokens"].tolist() == [0, 0, 16]


@pytest.mark.parametrize("mode", ["block", "radix"])
def test_repeated_id_minus_one_keeps_the_pool_exact(mode):
    """Prompts of ids [-1, -1, ...] got one key for all their blocks (radix: one node): the pool
    counted a request's cached blocks once and check=True raised InvariantError (block: at
    iteration 0, 27 free + 2 held KV blocks != 30; radix: at iteration 397, 29 free + 0 held).
    Now every request finishes with the pool checked throughout."""
    rng = np.random.default_rng(3)
    n = 200
    df = _df([(float(t), int(p), int(o), [-1] * min(int(k), -(-int(p) // 16)))  # (<= its
              for t, p, o, k in zip(  # prompt's ids: more are an error, workloads.schema)
        np.sort(rng.uniform(0, 2, n)), rng.integers(17, 100, n), rng.integers(1, 40, n),
        rng.integers(1, 7, n))])
    res = sim.run(df, prefix_caching=mode, kv_blocks=30, check=True, scheduler="continuous",
                  cost_model=sim.ConstantCost(0.01))
    assert (res.requests["status"] == "finished").all()
    assert res.summary()["prefix_hit_rate"] > 0.5


@pytest.mark.parametrize("hash_bs, bs", [(16, 16), (64, 16), (48, 16), (16, 8)])
def test_key_ids_of_whole_block_ids_follow_the_closed_form(hash_bs, bs):
    """Where each hash id covers ``r = H / block_size`` whole blocks, block ``j`` of a prompt
    has the id ``chain · r + j % r`` (``chain``: its prefix ``hash_ids[0..j // r]`` numbered
    in order of first appearance), for prompts that use all their ids, stop inside one, or
    name fewer blocks than their ids; empty lists between them change nothing."""
    from workloads.prefix import block_key_ids
    r = hash_bs // bs
    rng = np.random.default_rng(hash_bs * bs)
    lists = [[], None] + [rng.integers(0, 3, size=rng.integers(1, 6)).tolist() for _ in range(60)]
    lists[5] = []
    prompts = [int(rng.integers(1, 7 * hash_bs)) for _ in lists]
    chain = {}
    for ids in lists:
        for k in range(len(ids or ())):
            chain.setdefault(tuple(ids[:k + 1]), len(chain))
    want = [[chain[tuple(ids[:j // r + 1])] * r + j % r
             for j in range(min(p, len(ids) * hash_bs) // bs)] if ids else []
            for ids, p in zip(lists, prompts)]
    got = block_key_ids(lists, hash_bs, prompts, bs)
    assert [g.tolist() for g in got] == want
    assert any(len(w) < len(ids or ()) * r for w, ids in zip(want, lists))  # (cut prompts)


def test_a_request_holding_all_its_keys_references_a_view_of_them():
    """A request whose prefill chunks register every key they complete holds its first keys as
    a view of its key array (chunks tile it), not a copy per chunk; one whose content another
    block already caches holds only the keys it registered."""
    keys = np.arange(6)
    rep = Replica(40, 16, 8, prefix_caching=True)
    first = Request(0, 0, 0.0, 96, 4)
    first.block_keys = keys
    rep.enqueue(first)
    rep.form_batch(lambda r, now: r.admit(first, 40), 0.0)  # blocks 0, 1 complete
    assert first.kv_keys.tolist() == [0, 1] and np.shares_memory(first.kv_keys, keys)
    rep.postprocess(1.0)
    rep.form_batch(lambda r, now: r.schedule_chunk(first, 56), 1.0)  # blocks 2..5
    assert first.kv_keys.tolist() == list(range(6)) and np.shares_memory(first.kv_keys, keys)
    rep.postprocess(2.0)
    other = Request(1, 1, 0.0, 40, 4)  # keys 4, 5 cached by the first, 7 not: holds only 7
    other.block_keys = np.array([7, 4, 5])
    rep.enqueue(other)
    rep.form_batch(lambda r, now: r.admit(other, 40), 2.0)
    assert other.kv_keys.tolist() == [7]


def test_chains_are_the_same_made_a_span_of_powers_at_a_time(monkeypatch):
    """The chain keys' powers of P are made a span at a time: spans of 4 ids (lists across
    their borders, a last span cut short, empty lists between) give the keys a single span
    gives, and ids of one block each are their chains' (views, no renumbering)."""
    from workloads import prefix
    rng = np.random.default_rng(7)
    lists = [rng.integers(-1, 4, size=n).tolist() for n in rng.integers(0, 9, 40)]
    prompts = [16 * len(ids) + int(rng.integers(0, 16)) for ids in lists]
    whole = prefix.block_keys_all(lists, 16, prompts, 16)
    ids = prefix.block_key_ids(lists, 16, prompts, 16)
    monkeypatch.setattr(prefix, "_SPAN", 4)
    assert prefix.block_keys_all(lists, 16, prompts, 16) == whole
    assert [i.tolist() for i in prefix.block_key_ids(lists, 16, prompts, 16)] == \
        [i.tolist() for i in ids]
    assert all(i.base is ids[0].base for i in ids)
