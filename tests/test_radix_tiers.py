"""Offload tiers under SGLang's radix prefix cache (sim.engine.kv.radix_tiers: HiCache)."""

import math

import pytest

import sim
from sim.engine.core.request import Request
from sim.engine.kv.radix_tiers import RadixTierChain, TieredRadixBlockManager
from test_offload import _df, _one as offload_one

INF = math.inf
RADIX = dict(scheduler="sglang", model="llama-3.1-8b", gpu="h100", kv_blocks=32_000,
             check=True)
NODE = sim.kv_cache_bytes(16, model="llama-3.1-8b")  # one node: a hash id's 16 tokens


def _chain(*tiers, **kw):
    return sim.KVTierChain(tuple(tiers), **kw)


@pytest.mark.parametrize("kw", [dict(), dict(write_policy="write_through")])
@pytest.mark.parametrize("eviction", ["lru", "arc"])
def test_an_unlimited_free_tier_hits_as_an_equally_larger_gpu_pool(kw, eviction):
    """Everything is kept and loads take no time: each request hits what a tree that never
    evicts would, token for token (also behind a first tier demoting to it, larger than the
    GPU pool by a prompt, as HiCache requires: an L3 hit needs host room for the prompt's
    rest, and the host keeps its copies of the GPU's nodes)."""
    df = _df()
    small = sim.run(df, **RADIX).summary()["prefix_hit_rate"]
    big = sim.run(df, **{**RADIX, "kv_blocks": 500_000}).summary()["prefix_hit_rate"]
    assert small < big
    for tiers in ((sim.KVTier(INF, INF, INF, eviction=eviction),),
                  (sim.KVTier(2500 * NODE / 1e9, INF, INF, eviction=eviction),
                   sim.KVTier(INF, INF, INF))):
        res = sim.run(df, kv_offload=_chain(*tiers, **kw), **RADIX)
        assert res.summary()["prefix_hit_rate"] == big
        assert res.summary()["offload_hit_rate"] > 0
        assert (res.requests["load_time"] == 0).all()
    assert res.summary()["offload_tier1_hit_rate"] > 0  # the unlimited second tier served


def _one(tier, gpu_hit):
    """test_offload's pair of requests (a 4,000-token prefix, 250 nodes, asked again 60 s
    later: in the tree, else evicted) on SGLang with a pool of the same 4,800 tokens."""
    return offload_one(tier, gpu_hit, **{**RADIX, "kv_blocks": 4800})


@pytest.mark.parametrize("policy", ["write_back", "write_through"])
def test_a_lower_tier_hit_lies_between_a_gpu_hit_and_a_recompute(policy):
    hit, _ = _one(None, gpu_hit=True)
    recompute, _ = _one(None, gpu_hit=False)
    loaded, res = _one(_chain(sim.KVTier(10, read_gbps=25), write_policy=policy),
                       gpu_hit=False)
    assert res.requests["num_offload_tokens"].iloc[-1] == 4000
    assert res.requests["num_cached_tokens"].iloc[-1] == 4000
    assert hit < loaded < recompute
    assert res.requests["load_time"].iloc[-1] == pytest.approx(250 * NODE / 25e9)
    # a second tier behind a first of 600 nodes: the oldest nodes were demoted and are read
    # from it over the link (link-bound, then the disk's; its latency)
    chain = _chain(sim.KVTier(600 * NODE / 1e9, read_gbps=50),
                   sim.KVTier(100, read_gbps=10, latency=1e-3), link_gbps=25)
    two, res = _one(chain, gpu_hit=False)
    s = res.summary()
    n0, n1 = (round(s[f"offload_tier{k}_bytes_read"] / NODE) for k in (0, 1))
    assert n0 + n1 == 250 and n0 > 0 and n1 > 0
    assert res.requests["load_time"].iloc[-1] == pytest.approx(
        n0 * NODE / 25e9 + n1 * NODE / 10e9 + 1e-3)
    assert hit < two < recompute
    slow, _ = _one(_chain(sim.KVTier(10, read_gbps=0.05, latency=0.01)), gpu_hit=False)
    assert slow > recompute  # a slow enough tier loses to recomputing


def test_ttft_split_sums_to_the_mean_ttft():
    res = sim.run(_df(rate=8.0), kv_offload=sim.offload_preset("hicache", 8, 10), **RADIX)
    s = res.summary()
    assert s["ttft_load_mean"] > 0 and s["offload_hit_rate"] > 0
    assert s["ttft_queue_mean"] + s["ttft_load_mean"] + s["ttft_prefill_mean"] == \
        pytest.approx(s["ttft_mean"])


def test_write_policies_store_when_they_say():
    """A tree that never evicts: write-back stores nothing; write-through every node it
    computes; selective (threshold 2) only the nodes used twice (the system prompts')."""
    df = _df()
    kw = {**RADIX, "kv_blocks": 500_000}
    stored = {p: sim.run(df, kv_offload=_chain(sim.KVTier(INF), write_policy=p), **kw)
              .summary()["offload_bytes_stored"]
              for p in ("write_back", "write_through", "write_through_selective")}
    assert stored["write_back"] == 0
    assert stored["write_through"] > stored["write_through_selective"] > 0
    computed = sim.run(df, **kw).summary()["prefill_tokens_computed"]
    # write-through: each node once, a partly filled one as a whole node (its deviation)
    assert computed * NODE / 16 <= stored["write_through"] <= \
        (computed + float(df["num_output_tokens"].sum())) * NODE / 16 + 16 * len(df) * NODE


def test_a_hit_below_the_load_threshold_is_recomputed():
    df = _df()
    off = sim.run(df, **RADIX).summary()
    far = sim.run(df, kv_offload=_chain(sim.KVTier(8), load_threshold=10**6), **RADIX)
    assert far.summary()["offload_hit_rate"] == 0
    assert far.summary()["prefix_hit_rate"] == off["prefix_hit_rate"]
    # the tree's own: a node held by the tier continues a match from a node boundary only
    chain = RadixTierChain(_chain(sim.KVTier(INF), load_threshold=40), 16.0, 16, 1)
    pool = chain.manager(1000, 1)
    assert isinstance(pool, TieredRadixBlockManager)
    chain.tokens.update({1: 16, 2: 16, 3: 9})
    chain.store([1, 2, 3])
    keys = [1, 2, 3, 4]
    assert chain.radix_hits(keys, 0, 0, 100) == (41, 3)  # 16 + 16 + 9 (partly filled)
    assert chain.radix_hits(keys, 0, 0, 30) == (0, 0)  # 30 tokens < the threshold 40
    assert chain.radix_hits(keys, 16, 1, 100) == (0, 0)  # 25 tokens < 40
    assert chain.radix_hits(keys, 10, 1, 100) == (0, 0)  # the GPU's node is partly filled


def test_nothing_lost_in_a_cluster_and_in_disaggregated_pools():
    df = _df(rate=8.0, n=200)
    chain = sim.offload_preset("hicache", 4, 8)  # (an L2 over the 2.1 GB pool: L3 hits)
    for kw in (dict(replicas=2), dict(disaggregation=sim.Disaggregation(1, 1))):
        res = sim.run(df, kv_offload=chain, **{**RADIX, "kv_blocks": 16_000}, **kw)
        s = res.summary()
        assert s["num_finished"] + s.get("num_rejected", 0) == len(df)
        assert res.requests["request_id"].is_unique
        assert s["offload_bytes_stored"] > 0
    assert sim.run(df, kv_offload=chain, **{**RADIX, "kv_blocks": 16_000},
                   replicas=2).summary()["offload_hit_rate"] > 0


def test_a_landed_request_holds_its_loaded_tokens_in_the_tree():
    """A real Request through the replica's verbs: loaded at admission, inserted at landing."""
    from sim.engine.core.replica import Replica
    chain = RadixTierChain(_chain(sim.KVTier(INF, INF, INF)), 16.0, 16, 1)
    rep = Replica(1000, 1, 8, prefix_caching="radix", cache_unit=16, offload=chain)
    landed = []
    rep.on_load = lambda r, seconds, start: landed.append((r, seconds, start))
    chain.tokens.update({10: 16, 11: 16})
    chain.store([10, 11])
    r = Request(0, 0, 0.0, 40, 4)
    r.block_keys = [10, 11, 12]
    rep.enqueue(r)
    assert rep._tier_hit(r, 0, 0) == 32
    assert rep.admit(r, 8)
    assert landed == [(r, 0.0, 0)] and rep.num_loading == 1 and r.num_computed == 32
    assert rep.blocks.num_free == 1000 - 32
    rep.land(r, 0)
    assert rep.num_loading == 0 and r.tree_tokens == 32 and r.kv_keys == [10, 11]
    assert rep.blocks.match([10, 11, 12], 39) == (32, 2)


def test_layer_wise_overlap_hides_the_load_under_the_prefill():
    """HiCache's layer-wise overlap: the request waits only the load its prefill's compute
    cannot hide. Here that compute is the GPU-hit request's TTFT (the same 96 tokens after
    4,000 cached, alone): a slow load shrinks by exactly it, a fast one disappears."""
    hit, _ = _one(None, gpu_hit=True)
    for bw in (2.0, 1000.0):
        plain, a = _one(_chain(sim.KVTier(10, read_gbps=bw)), gpu_hit=False)
        over, b = _one(_chain(sim.KVTier(10, read_gbps=bw), layer_overlap=True), gpu_hit=False)
        load = a.requests["load_time"].iloc[-1]
        assert load == pytest.approx(250 * NODE / (bw * 1e9))
        assert b.requests["load_time"].iloc[-1] == pytest.approx(max(0.0, load - hit))
        assert over == pytest.approx(max(load, hit)) and over < plain
    with pytest.raises(TypeError, match="kv_offload.layer_overlap must be True or False"):
        _chain(sim.KVTier(1), layer_overlap=1)


@pytest.mark.parametrize("bw", [2.0, 1000.0])
def test_layer_wise_overlap_in_block_mode_has_the_radix_modes_semantics(bw):
    """The same pair under vLLM's block cache (16-token blocks, a 300-block pool): the
    request waits max(latency, load - prefill of the rest alone), its TTFT then
    max(load, GPU-hit TTFT); without the flag it waits the whole load."""
    block = dict(RADIX, scheduler="vllm", prefix_caching="block", kv_blocks=300)
    hit, _ = offload_one(None, True, **block)
    plain, a = offload_one(_chain(sim.KVTier(10, read_gbps=bw)), False, **block)
    over, b = offload_one(_chain(sim.KVTier(10, read_gbps=bw), layer_overlap=True), False,
                          **block)
    load = a.requests["load_time"].iloc[-1]
    assert load == pytest.approx(250 * NODE / (bw * 1e9))
    assert b.requests["load_time"].iloc[-1] == pytest.approx(max(0.0, load - hit))
    assert over == pytest.approx(max(load, hit)) and over <= plain
    assert b.requests["num_offload_tokens"].iloc[-1] == 4000


def test_cli_runs_hicache_under_sglang(tmp_path, monkeypatch):
    from sim.cli.main import main
    monkeypatch.chdir(tmp_path)
    assert main(["run", "-w", "mooncake-conversation", "-n", "40", "--rate", "0.5", "-s",
                 "sglang", "--kv-blocks", "32000", "--offload-gb", "2", "--offload-preset",
                 "hicache", "--offload-lower-gb", "20", "--offload-layer-overlap", "-q"]) == 0
    assert "offload_tier1_hit_rate" in (tmp_path / "sim-out" / "summary.json").read_text()


@pytest.mark.parametrize("eviction", ["lru", "arc"])
def test_the_first_tier_keeps_the_copy_of_a_node_the_gpu_holds(eviction):
    """HiCache's host pool evicts only nodes the device has evicted (``evict_host``: ``if not
    x.evicted: continue``). Write-through, a first tier of 2 nodes: request 0's 3 nodes enter
    it as they are computed, all still on the GPU; the third is refused (before: the first
    was dropped for it, and write-through never stores it again, so the prefix was lost to
    the tier). Request 1 (no hash ids: it never touches the tree or the tier) evicts them
    from the 100-token GPU pool; request 2 asks again and loads the first 2 nodes."""
    import pandas as pd
    df = pd.DataFrame([(0.0, 48, 1, [1, 2, 3]), (5.0, 90, 1, None), (10.0, 48, 1, [1, 2, 3])],
                      columns=["arrival_time", "num_prompt_tokens", "num_output_tokens",
                               "hash_ids"])
    df.attrs["block_size"] = 16
    chain = _chain(sim.KVTier(2 * NODE / 1e9, INF, INF, eviction=eviction),
                   write_policy="write_through")
    res = sim.run(df, kv_offload=chain, **{**RADIX, "kv_blocks": 100})
    req = res.requests
    assert req["num_offload_tokens"].tolist() == [0, 0, 32]
    assert req["num_cached_tokens"].tolist() == [0, 0, 32]
    assert res.summary()["offload_bytes_stored"] == pytest.approx(2 * NODE)  # 3rd: refused


def test_a_full_first_tier_of_gpu_copies_refuses_the_node_and_l3_never_gets_it():
    """The store's side: a kept key is never evicted; when all are kept the insert is refused
    (nothing written, and it reaches no lower tier: SGLang writes to storage only what a
    host write backed up, ``writing_check`` -> ``write_backup_storage``; before, it passed
    on to L3), and a selective chain tries it again at its next use."""
    from sim.engine.kv.tier_stores import ARCStore, LRUStore
    for store in (LRUStore(2), ARCStore(2)):
        gpu = {1, 2, 3}
        store.keep = gpu.__contains__
        assert store.insert([1, 2])[0] == 2
        new, out = store.insert([3])
        assert (new, list(out)) == (0, []) and 3 not in store and len(store) == 2
        gpu.discard(1)  # the GPU evicted node 1: its copy may go now
        new, out = store.insert([3])
        assert (new, list(out)) == (1, [1]) and 3 in store and 2 in store
    chain = RadixTierChain(_chain(sim.KVTier(1 * NODE / 1e9), sim.KVTier(INF),
                                  write_policy="write_through_selective"), NODE, 16, 1)
    pool = chain.manager(1000, 1)
    pool._len.update({7: 16, 8: 16})  # (both on the GPU)
    chain.used([7, 8])
    chain.used([7, 8])  # used twice: due; 7 stored, 8 refused (not passed on)
    assert 7 in chain.stores[0] and 8 not in chain.stores[0] and 8 not in chain.stores[1]
    assert chain.bytes_written == [NODE, 0.0]
    del pool._len[7]  # the GPU evicted 7 (as _evict_one does: a departure counted)
    pool.departures.n += 1
    chain.used([8])  # 8's count kept: stored at once
    assert 8 in chain.stores[0] and 7 not in chain.stores[0]


def test_a_node_the_host_refused_is_not_an_l3_hit_later():
    """Write-through into an L2 of 2 nodes over an L3: request 0's 3 nodes are computed
    while all are on the GPU, so the L2 keeps 2 and refuses the third (SGLang: no host
    room, not backed up, never written to storage). Request 1 (no hash ids) evicts them
    from the GPU; request 2 asks again: 2 nodes load from L2, and the third is recomputed
    - it was never in L3 (before the fix it was: 48 tokens loaded, 16 of them from L3)."""
    import pandas as pd
    df = pd.DataFrame([(0.0, 48, 1, [1, 2, 3]), (5.0, 90, 1, None), (10.0, 49, 1, [1, 2, 3])],
                      columns=["arrival_time", "num_prompt_tokens", "num_output_tokens",
                               "hash_ids"])
    df.attrs["block_size"] = 16
    chain = _chain(sim.KVTier(2 * NODE / 1e9, INF, INF), sim.KVTier(INF, INF, INF),
                   write_policy="write_through")
    res = sim.run(df, kv_offload=chain, **{**RADIX, "kv_blocks": 100})
    s = res.summary()
    assert res.requests["num_offload_tokens"].tolist() == [0, 0, 32]
    assert s["offload_tier1_hit_rate"] == 0 and s["offload_tier1_bytes_written"] == 0


def test_an_l3_hit_needs_room_in_the_host_tier_for_the_prompts_rest():
    """SGLang's ``prefetch_from_storage`` allocates host memory for the prompt's rest past
    the GPU and host match (``evict_host`` first: only copies of nodes the GPU evicted, the
    host match protected) and prefetches nothing without it. Node 0 on the GPU, 1 in an L2
    of 4 nodes, 2-4 in L3, a prompt matchable to 80 tokens (3 nodes past the L2 match):
    with one free entry and 2 free copies the L3 part is a hit (64 tokens); with those
    copies the GPU's (kept), or one of them, it is not, and the L2 part alone is (16
    tokens); the request's own L2 hit is no room (before: 64 tokens in every case)."""
    def hit(gpu, others):
        chain = RadixTierChain(_chain(sim.KVTier(4 * NODE / 1e9), sim.KVTier(100)),
                               NODE, 16, 1)
        pool = chain.manager(1000, 1)
        pool._len.update(dict.fromkeys(gpu, 16))
        chain.stores[0].insert([1, *others])
        chain.stores[1].insert([2, 3, 4])
        chain.tokens.update(dict.fromkeys(range(1, 5), 16))
        return chain.radix_hits([0, 1, 2, 3, 4], 16, 1, 80)

    assert hit({0}, [8, 9]) == (64, 4)  # 8, 9: copies of nodes the GPU evicted
    assert hit({0, 8, 9}, [8, 9]) == (16, 1)  # all the L2 holds are the GPU's (or this hit's)
    assert hit({0, 9}, [8, 9]) == (16, 1)  # room for 2 of the 3 nodes: none prefetched
    assert hit({0}, [8]) == (64, 4)  # 2 free entries and 8
    assert hit({0, 8}, [8]) == (16, 1)  # 2 free entries, 8 kept, 1 protected
