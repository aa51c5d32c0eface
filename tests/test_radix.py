"""SGLang's radix prefix cache (``prefix_caching="radix"``): token-granular hits capped at
prompt - 1, pages, LRU eviction of unreferenced leaves, insertion after each chunk, duplicates
freed, the pool's accounting every iteration of random runs, and the ideal rate on real traces."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import sim
import workloads
from sim.engine.kv.radix import RadixBlockManager
from sim.engine.core.replica import Replica
from sim.engine.core.request import Request
from test_prefix_caching import _df, _ids


def _run(df, **kw):
    kw.setdefault("cost_model", sim.ConstantCost(0.01))
    kw.setdefault("scheduler", "continuous")
    kw.setdefault("kv_blocks", 100_000)
    return sim.run(df, prefix_caching="radix", **kw)


@pytest.mark.parametrize("prompt", [64, 70, 17, 16, 1, 200])
@pytest.mark.parametrize("page", [1, 4, 16])
def test_identical_prompts_hit_prompt_minus_one_rounded_to_pages(prompt, page):
    ids = _ids("p", -(-prompt // 16))
    res = _run(_df([(0.0, prompt, 4, ids), (10.0, prompt, 4, ids)]), block_size=page)
    hit = (prompt - 1) // page * page
    assert res.requests["num_cached_tokens"].tolist() == [0, hit]
    assert res.requests["num_prefill_computed"].tolist() == [prompt, prompt - hit]


def test_the_sglang_preset_caches_by_default_and_serves_prompt_minus_one():
    ids = _ids("p", 5)
    res = sim.run(_df([(0.0, 70, 4, ids), (10.0, 70, 4, ids)]), scheduler="sglang",
                  cost_model=sim.ConstantCost(0.01), kv_blocks=10_000)
    assert res.config.prefix_caching == "radix" and res.config.block_size == 1
    assert res.requests["num_cached_tokens"].tolist() == [0, 69]


def test_a_partial_match_ends_where_the_prompts_diverge():
    a, b = _ids("a", 4), _ids("b", 4)
    # request 1 shares 2 ids (32 tokens), request 2 shares 1 id and is shorter than it (10 tokens)
    df = _df([(0.0, 64, 1, a), (1.0, 64, 1, a[:2] + b[:2]), (2.0, 10, 1, a[:1])])
    res = _run(df, block_size=1)
    assert res.requests["num_cached_tokens"].tolist() == [0, 32, 9]
    assert workloads.ideal_prefix_hit_rate(df, 1, mode="radix") == pytest.approx(
        41 / (64 + 64 + 10))


def test_requests_without_hash_ids_or_with_a_different_first_id_never_hit():
    ids = _ids("p", 4)
    other = [ids[0] + 1] + ids[1:]
    res = _run(_df([(0.0, 64, 1, ids), (1.0, 64, 1, None), (2.0, 64, 1, other)]))
    assert res.requests["num_cached_tokens"].tolist() == [0, 0, 0]


def test_lru_evicts_unreferenced_leaves_least_recently_used_first():
    pool = RadixBlockManager(10, 1, 2)
    a, b = ["a0", "a1", "a2"], ["a0", "b1"]  # b shares a's first node
    pool.allocate(6)
    held_a = []
    assert pool.insert(a, held_a, 0, 6) == 6 and held_a == a
    assert pool.match(b, 3) == (2, 1) and pool.pinned(b, 1) == 0  # a0 is a's: none free
    held_b = ["a0"]
    pool.acquire(held_b)
    pool.allocate(2)  # b computes its own 2 tokens after the hit of 2
    assert pool.insert(b, held_b, 2, 4) == 4 and pool.num_free == 2
    pool.release(held_a, 0)  # a done: a1, a2 unreferenced (a2 a leaf), a0 still b's
    assert pool.num_free == 6 and pool.evictable == 4
    pool.release(held_b, 0)  # b done later: b1 newer than a2
    assert pool.num_free == 10 and pool.evictable == 8
    pool.allocate(4)  # 2 truly free, then a2 (the oldest leaf)
    assert "a2" not in pool._len and pool.num_evictions == 2
    pool.allocate(2)  # a1 became a leaf, older than b1
    assert "a1" not in pool._len and "b1" in pool._len
    assert pool.match(a, 6) == (2, 1) and pool.pinned(a, 1) == 2  # a0 left: 2 free pages
    pool.allocate(2)  # b1, then a0 would go; a0 is b1's parent: b1 first
    assert "b1" not in pool._len and "a0" in pool._len
    with pytest.raises(RuntimeError):
        pool.allocate(3)


def test_the_tree_refuses_a_page_that_does_not_divide_the_hash_span():
    with pytest.raises(ValueError, match="block_size 3 does not divide the workload.s 16 tokens per hash id"):
        _run(_df([(0.0, 64, 1, _ids("p", 4))]), block_size=3)


def test_requests_in_the_same_batch_do_not_share_and_the_second_copy_is_freed():
    """SGLang inserts after the forward pass: two identical prompts prefilled together both
    compute everything; then one copy becomes the tree's and the other's pages are freed."""
    a, b = Request(0, 0, 0.0, 32, 4), Request(1, 1, 0.0, 32, 4)
    keys = workloads.unit_keys_all([_ids("p", 2)])[0]
    a.block_keys = b.block_keys = keys
    rep = Replica(100, 1, 8, prefix_caching="radix", cache_unit=16)
    rep.enqueue(a)
    rep.enqueue(b)
    rep.form_batch(lambda r, now: (r.admit(a, 32), r.admit(b, 32)), 0.0)
    assert rep.blocks.num_free == 36 and b.num_cached_tokens == 0
    rep.postprocess(1.0)
    assert a.tree_tokens == b.tree_tokens == 32 and a.kv_keys == b.kv_keys == keys
    assert rep.blocks.num_free == 68  # b's copy of the 32 shared tokens went back
    assert rep.blocks.referenced_pages() == 32


def test_a_chunked_prefill_enters_the_tree_chunk_by_chunk():
    """SGLang's cache_unfinished_req: a request arriving while another prefills the same
    prompt hits the chunks already computed."""
    ids = _ids("p", 7)
    df = _df([(0.0, 100, 2, ids), (0.015, 100, 2, ids)])
    res = sim.run(df, scheduler="sglang", chunk_size=32, kv_blocks=10_000,
                  cost_model=sim.ConstantCost(0.01))
    # chunks of 32, 32, 32, 4: the second joins the last chunk's batch (one chunked request at
    # a time) and hits the 96 tokens the first three chunks put in the tree, not 99
    assert res.requests["num_cached_tokens"].tolist() == [0, 96]


def test_a_preempted_request_hits_its_own_prefix_when_it_comes_back():
    a, b = Request(0, 0, 0.0, 64, 50), Request(1, 1, 0.0, 32, 50)
    a.block_keys = workloads.unit_keys_all([_ids("a", 4)])[0]
    rep = Replica(128, 1, 8, prefix_caching="radix", cache_unit=16)
    rep.enqueue(a)
    rep.enqueue(b)
    rep.form_batch(lambda r, now: (r.admit(a, 64), r.admit(b, 32)), 0.0)
    rep.postprocess(1.0)
    assert a.tree_tokens == 64 and rep.blocks.num_free == 32
    rep.preempt(a)  # its 64 cached tokens stay in the tree, evictable
    assert rep.blocks.num_free == 96 and rep.blocks.evictable == 64
    assert rep.prefix_hit(a) == 64  # prompt 64 + 1 generated: capped at 65 - 1
    rep.form_batch(lambda r, now: r.admit(a, a.prefill_target - 64), 1.0)
    assert a.num_computed == 64 and rep.blocks.num_evictions == 0


def test_a_bounded_pool_lowers_the_hit_rate_and_the_shared_prompt_wins_ttft(unshared):
    df = workloads.shared_prefix(300, n_groups=30, system_prompt_tokens=512, user_tokens=64,
                                 output=16, rate=5.0, seed=2)
    big = _run(df, block_size=16).summary()["prefix_hit_rate"]
    small = _run(df, block_size=16, kv_blocks=120).summary()["prefix_hit_rate"]
    assert big == pytest.approx(workloads.ideal_prefix_hit_rate(df, 16, mode="radix"), rel=0.02)
    assert small < big
    same = workloads.shared_prefix(40, n_groups=1, system_prompt_tokens=1024, user_tokens=64,
                                   output=8, rate=2.0, seed=1)
    kw = dict(scheduler="sglang", model="llama-3.1-8b", gpu="h100")
    hit = sim.run(same, **kw).summary()
    miss = sim.run(unshared(same), **kw).summary()
    assert miss["prefix_hit_rate"] == 0 and hit["prefix_hit_rate"] > 0.8
    assert hit["ttft_mean"] < 0.5 * miss["ttft_mean"]


class _TreeCheck:
    """Wraps a policy; after each schedule checks the radix pool's accounting."""

    def __init__(self, policy):
        self.policy, self.name, self.checks = policy, policy.name, 0
        self.pauses_decodes = getattr(policy, "pauses_decodes", False)
        if hasattr(policy, "select_victim"):
            self.select_victim = policy.select_victim

    def schedule(self, replica, now):
        self.policy.schedule(replica, now)
        pool = replica.blocks
        bs = pool.block_size
        own = sum(replica.held_blocks(r) - r.tree_tokens // bs for r in replica.running.values())
        assert all(replica.held_blocks(r) >= r.tree_tokens // bs for r in replica.running.values())
        assert pool.num_free + pool.referenced_pages() + own == pool.num_blocks
        unreferenced = sum(v for c, v in pool._len.items() if not pool._ref[c]) // bs
        assert pool.evictable == unreferenced <= pool.num_free
        assert all(0 < v <= pool.unit and v % bs == 0 for v in pool._len.values())
        refs = {}
        for r in replica.running.values():
            for c in r.kv_keys:
                refs[c] = refs.get(c, 0) + 1
        assert refs == {c: n for c, n in pool._ref.items() if n}
        self.checks += 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 3), st.integers(1, 90), st.integers(1, 20),
                          st.integers(0, 3)), min_size=1, max_size=30),
       st.integers(30, 160), st.sampled_from([1, 4]),
       st.sampled_from(["continuous", "chunked", "vllm", "sglang", "sarathi"]))
def test_everything_finishes_and_the_pool_never_leaks(rows, kv_blocks, page, sched):
    from sim.engine import VLLM, ChunkedPrefill, ContinuousBatching, SGLang, Sarathi
    rows.sort()
    df = _df([(t, p, o, _ids(("g", g), -(-p // 8))) for t, p, o, g in rows], hash_bs=8)
    policy = {"continuous": ContinuousBatching(), "chunked": ChunkedPrefill(16),
              "vllm": VLLM(16), "sglang": SGLang(16), "sarathi": Sarathi(16)}[sched]
    check = _TreeCheck(policy)
    res = sim.run(df, scheduler=check, prefix_caching="radix", block_size=page,
                  kv_blocks=kv_blocks // page, max_batch_size=4,
                  cost_model=sim.ConstantCost(0.01))
    req = res.requests
    fits = -(-(df.num_prompt_tokens + df.num_output_tokens) // page) <= kv_blocks // page
    assert (req["status"] == "finished").tolist() == fits.tolist()
    assert check.checks == len(res.iterations)
    assert (res.iterations["kv_blocks_used"] <= kv_blocks // page).all()
    assert (req["num_cached_tokens"] <= (req["num_prompt_tokens"] - 1).clip(lower=0)).all()


def test_ideal_radix_rate_on_hand_cases():
    ids = _ids("x", 4)
    df = _df([(0.0, 64, 1, ids), (1.0, 64, 1, ids), (2.0, 40, 1, ids[:3]), (3.0, 10, 1, None)])
    total = 64 + 64 + 40 + 10
    assert workloads.ideal_prefix_hit_rate(df, 1, mode="radix") == pytest.approx((63 + 39) / total)
    assert workloads.ideal_prefix_hit_rate(df, 16, mode="radix") == pytest.approx((48 + 32) / total)
    with pytest.raises(ValueError, match="mode"):
        workloads.ideal_prefix_hit_rate(df, 1, mode="tree")
    with pytest.raises(ValueError, match="multiple of block_size"):
        workloads.ideal_prefix_hit_rate(df, 5, mode="radix")


@pytest.mark.parametrize("trace, raw", [("mooncake-conversation", 0.366),
                                        ("mooncake-synthetic", 0.640)])
def test_engine_reaches_the_ideal_radix_rate_on_mooncake_traces(trace, raw):
    # (within the default model's context, Llama-3.1-8B's 131,072 tokens: one request of the
    # synthetic trace's first 1,500 is longer, and would be rejected)
    df = workloads.load(trace, n=1500, max_context=131072)
    df = df.assign(arrival_time=np.arange(len(df)) * 1000.0)  # no two requests overlap
    ideal = workloads.ideal_prefix_hit_rate(df, 1, mode="radix")
    block = workloads.ideal_prefix_hit_rate(df, 512)
    res = sim.run(df, scheduler="sglang", kv_blocks=10**8, cost_model=sim.ConstantCost(0.01))
    assert res.summary()["prefix_hit_rate"] == pytest.approx(ideal, abs=1e-12)
    assert ideal >= block > 0.2  # token granular: at least the block rate


@pytest.mark.parametrize("tokens", [-16, 16.5, "16", True, 0])
@pytest.mark.parametrize("mode", ["block", "radix"])
def test_the_workloads_tokens_per_hash_id_must_be_a_positive_integer(tokens, mode):
    """A negative span gave a hit rate of -1.0, True one of 1 token per id, 16.5 was cut to 16."""
    df = _df([(0.0, 64, 1, _ids("p", 4)), (1.0, 64, 1, _ids("p", 4))], hash_bs=tokens)
    msg = r"attrs\['block_size'\] \(tokens per hash id\) must be a positive integer"
    with pytest.raises(ValueError, match=msg):
        sim.run(df, prefix_caching=mode, cost_model=sim.ConstantCost(0.01))
    with pytest.raises(ValueError, match=msg):
        workloads.ideal_prefix_hit_rate(df, 16, mode=mode)
    df.attrs["block_size"] = 16.0  # a whole number: 16
    assert workloads.ideal_prefix_hit_rate(df, 16, mode=mode) == pytest.approx(48 / 128)
    del df.attrs["block_size"]
    with pytest.raises(ValueError, match="no attrs.*save the workload as parquet"):
        sim.run(df, prefix_caching=mode, cost_model=sim.ConstantCost(0.01))


@pytest.mark.parametrize("page", [0, -16, 1.5, None])
def test_the_ideal_rates_page_must_be_a_positive_integer(page):
    """block_size=0 was a ZeroDivisionError, -16 a hit rate of 0.5."""
    df = _df([(0.0, 64, 1, _ids("p", 4)), (1.0, 64, 1, _ids("p", 4))])
    for mode in ("block", "radix"):
        with pytest.raises(ValueError, match=f"block_size must be a positive integer, got "
                                             f"{page}"):
            workloads.ideal_prefix_hit_rate(df, page, mode=mode)


REPRO = [(0.0, 107, 87, 1), (0.12, 96, 1454, 2), (0.3, 177, 104, 3), (0.82, 363, 528, 3),
         (0.99, 92, 1, 1), (1.09, 330, 1, 3), (1.33, 189, 210, 3), (1.52, 26, 1, 3),
         (2.53, 172, 1, 2), (2.56, 333, 2, 0)]


def repro_workload():
    """REPRO as a workload: 16 tokens per hash id, group ``g``'s ids ``100 g, 100 g + 1, ...``
    (a shared prefix within a group)."""
    import pandas as pd
    df = pd.DataFrame([(t, p, o, [g * 100 + j for j in range(-(-p // 16))])
                       for t, p, o, g in REPRO],
                      columns=["arrival_time", "num_prompt_tokens", "num_output_tokens",
                               "hash_ids"])
    df.attrs["block_size"] = 16
    return df


@pytest.mark.parametrize("scheduler", ["continuous", "chunked", "sglang", "vllm"])
def test_a_request_the_pool_holds_is_never_kept_out_by_a_partly_matched_node(scheduler):
    """A preempted request coming back with nothing running: its hit ends inside a 16-token
    node, and referencing that node pins all of it (189 tokens hit, 192 pinned, 209 to compute:
    401 > the 400-token pool), so it was refused forever and the run stopped with "formed an
    empty batch". With nothing running that node is left unreferenced (its matched tokens
    computed again; the node is now left unreferenced from the first admission, as pinned
    it would take more than the pool over the request's run: see the next test). Every
    request comes out, the pool exact throughout (check=True)."""
    res = sim.run(repro_workload(), scheduler=scheduler, prefix_caching="radix", block_size=1, kv_blocks=400,
                  max_batch_size=1, check=True, model="llama-3.1-8b", gpu="h100")
    req = res.requests
    assert len(req) == len(REPRO)
    assert set(req["status"]) <= {"finished", "rejected"}
    over = [p + o > 400 for _t, p, o, _g in REPRO]  # could never fit the pool
    assert (req["status"] == "rejected").tolist() == over


class _Capped:
    """10 ms per iteration, and an error instead of a run that never ends."""

    def __init__(self):
        self.calls = 0

    def __call__(self, batch):
        self.calls += 1
        assert self.calls < 20_000, "the run does not end"
        return 0.01


@pytest.mark.parametrize("scheduler", ["continuous", "chunked", "sarathi", "sglang", "vllm"])
@pytest.mark.parametrize("order", ["longer_first", "shorter_first"])
def test_a_prompt_ending_inside_a_longer_cached_node_does_not_pin_it_past_the_pool(scheduler,
                                                                                  order):
    """A 192-token prompt named by one 512-token hash id whose node the tree holds whole (a
    longer prompt with the same first id ran before) would reference all 512 tokens (SGLang
    splits the node at 192): 192 + 1300 tokens (94 pages of 16) plus 20 pages it does not use
    exceed the 100-page pool, so it preempted itself at the same chunk forever (chunked,
    sarathi: the run never ended). Such a node is neither referenced at admission nor by
    the request's insertion: its tokens there stay its own. The other order (the short prompt
    first, the node filled by the long one while referenced) preempts once and recovers."""
    import pandas as pd
    rows = [(0.0, 520, 1, [1000, 1001]), (1.0, 192, 1300, [1000])]
    if order == "shorter_first":
        rows = [(0.0, 192, 1300, [1000]), (0.5, 520, 1, [1000, 1001])]
    df = pd.DataFrame(rows, columns=["arrival_time", "num_prompt_tokens", "num_output_tokens",
                                     "hash_ids"])
    df.attrs["block_size"] = 512
    cost = _Capped()
    res = sim.run(df, scheduler=scheduler, prefix_caching="radix", block_size=16,
                  kv_blocks=100, cost_model=cost, check=True, model="llama-3.1-8b", gpu="h100")
    req = res.requests
    assert (req["status"] == "finished").all()
    assert req["num_preemptions"].sum() == (order == "shorter_first")
    assert cost.calls < 1400
