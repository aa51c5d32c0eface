"""Chains of KV offload tiers (sim.engine.kv.tiers, kv.tier_stores, presets.offload)."""

import math
import random

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import sim
import workloads
from sim.engine.kv.tier_stores import ARCStore, LRUStore
from sim.engine.kv.tiers import KVTierChain, TierChain
from test_offload import BASE, _df, _hash, _one

INF = math.inf
BLOCK = sim.kv_cache_bytes(16, model="llama-3.1-8b")  # one 16-token block's bytes


def _chain(*tiers, **kw):
    return sim.KVTierChain(tuple(tiers), **kw)


@pytest.mark.parametrize("kw", [dict(), dict(write_policy="write_through"),
                                dict(write_policy="write_through_selective"),
                                dict(chunk_tokens=256), dict(link_gbps=1.0),
                                dict(load_threshold=10)])
@pytest.mark.parametrize("cache", ["block", "radix"])
def test_a_chain_of_empty_tiers_is_bit_identical_to_no_tier(kw, cache):
    """Under either prefix cache (radix: SGLang's, sim.engine.kv.radix_tiers)."""
    from test_radix_tiers import RADIX
    run = BASE if cache == "block" else RADIX
    df = _df()
    off = sim.run(df, **run)
    zero = sim.run(df, kv_offload=_chain(sim.KVTier(0), sim.KVTier(0, eviction="arc"), **kw),
                   **run)
    assert _hash(off) == _hash(zero)
    s = zero.summary()
    assert s["offload_hit_rate"] == 0 and s["offload_bytes_stored"] == 0
    assert s["offload_tier0_hit_rate"] == s["offload_tier1_hit_rate"] == 0


@pytest.mark.parametrize("kw", [dict(), dict(write_policy="write_through")])
@pytest.mark.parametrize("eviction", ["lru", "arc"])
def test_an_unlimited_free_tier_hits_as_an_unlimited_gpu_pool(kw, eviction):
    """Everything is kept and loads take no time: each request hits what a pool that never
    evicts would, token for token (behind a small first tier: it demotes to the unlimited)."""
    df = _df()
    big = sim.run(df, **{**BASE, "kv_blocks": 28_000}).summary()["prefix_hit_rate"]
    for tiers in ((sim.KVTier(INF, INF, INF, eviction=eviction),),
                  (sim.KVTier(0.2, INF, INF, eviction=eviction), sim.KVTier(INF, INF, INF))):
        res = sim.run(df, kv_offload=_chain(*tiers, **kw), **BASE)
        assert res.summary()["prefix_hit_rate"] == big
        assert (res.requests["load_time"] == 0).all()
    assert res.summary()["offload_tier1_hit_rate"] > 0  # the unlimited second tier served


def test_a_lower_tier_hit_lies_between_a_gpu_hit_and_a_recompute_and_loses_when_slow():
    """The 250 shared blocks were evicted to a first tier of 600 blocks, which demoted the
    oldest as three unrelated prompts' blocks followed: the load reads the rest from the
    first tier and the demoted from the second, over the link, closed form."""
    hit, _ = _one(None, gpu_hit=True)
    recompute, _ = _one(None, gpu_hit=False)
    first = 600 * BLOCK / 1e9
    chain = _chain(sim.KVTier(first, read_gbps=50), sim.KVTier(100, read_gbps=10, latency=1e-3),
                   link_gbps=25)
    loaded, res = _one(chain, gpu_hit=False)
    assert res.requests["num_offload_tokens"].iloc[-1] == 4000
    assert hit < loaded < recompute
    s = res.summary()
    n0 = round(s["offload_tier0_bytes_read"] / BLOCK)
    n1 = round(s["offload_tier1_bytes_read"] / BLOCK)
    assert n0 + n1 == 250 and n1 > 0 and n0 > 0
    assert s["offload_tier1_hit_rate"] > 0 and s["offload_tier0_hit_rate"] > 0
    assert res.requests["load_time"].iloc[-1] == pytest.approx(
        n0 * BLOCK / 25e9 + n1 * BLOCK / 10e9 + 1e-3)  # link-bound, then the disk's; latency
    slow = _chain(sim.KVTier(first, read_gbps=50), sim.KVTier(100, read_gbps=0.05))
    assert _one(slow, gpu_hit=False)[0] > recompute


def test_loads_queue_on_the_shared_link():
    """Two loads asked at once: the second lands after both transfers (FIFO), the first
    after its own; a later one after the link is free starts at once."""
    chain = TierChain(_chain(sim.KVTier(INF, read_gbps=10, latency=0.002), link_gbps=5),
                      block_bytes=1e6, block_size=16)
    chain.store(np.arange(30))
    a = chain.load(np.arange(10), now=0.0)
    b = chain.load(np.arange(10, 30), now=0.0)
    assert a == pytest.approx(10e6 / 5e9 + 0.002)
    assert b == pytest.approx(30e6 / 5e9 + 0.002)
    assert chain.load(np.arange(5), now=1.0) == pytest.approx(5e6 / 5e9 + 0.002)
    assert chain.bytes_read == [35e6] and chain.blocks_read == [35]


def test_write_policies_store_when_they_say():
    """A pool that never evicts: write-back stores nothing; write-through stores every
    computed block at once; selective (threshold 2) only the blocks used twice (a shared
    system prompt's), so strictly between."""
    df = _df()
    kw = {**BASE, "kv_blocks": 28_000}
    stored = {p: sim.run(df, kv_offload=_chain(sim.KVTier(INF), write_policy=p), **kw)
              .summary()["offload_bytes_stored"]
              for p in ("write_back", "write_through", "write_through_selective")}
    assert stored["write_back"] == 0
    computed = sim.run(df, **kw).summary()
    assert stored["write_through"] > stored["write_through_selective"] > 0
    # write-through: each distinct full block once (prompt and answer blocks), and no more
    assert stored["write_through"] <= computed["prefill_tokens_computed"] // 16 * BLOCK + \
        float(df["num_output_tokens"].sum()) / 16 * BLOCK
    chain = TierChain(_chain(sim.KVTier(INF), write_policy="write_through_selective",
                             write_threshold=3), 1.0, 16)
    chain.computed(np.array([1, 2]))
    chain.used(np.array([1, 2]))
    assert chain.bytes_stored == 0
    chain.used(np.array([1]))
    assert chain.bytes_stored == 1.0 and 1 in chain.stores[0] and 2 not in chain.stores[0]


def test_chunked_hits_are_whole_chunks_of_the_prompt():
    chain = TierChain(_chain(sim.KVTier(INF), chunk_tokens=64), 1.0, 16)  # 4 blocks a chunk
    chain.store(np.arange(11))
    keys = np.arange(20)
    assert chain.hits(keys, 0, 20) == 8  # 11 held: two whole chunks
    assert chain.hits(keys, 2, 20) == 6  # from block 2 to the chunk boundary at 8
    assert chain.hits(keys, 9, 20) == 0
    with pytest.raises(ValueError, match="chunk_tokens must be a multiple of the block size"):
        TierChain(_chain(sim.KVTier(1), chunk_tokens=24), 1.0, 16)


def test_arc_keeps_a_reused_set_through_a_scan_that_lru_loses():
    """ARC's point (Megiddo & Modha 2003): keys read twice survive a one-time scan."""
    for store, kept in ((LRUStore(10), 0), (ARCStore(10), 5)):
        store.insert(range(5))
        store.touch(range(5))  # the reused set
        store.insert(range(100, 130))  # a scan of 30 keys seen once
        assert sum(k in store for k in range(5)) == kept
        assert len(store) == 10


@settings(max_examples=60, deadline=None)
@given(cap=st.integers(0, 12), ops=st.lists(st.tuples(st.booleans(), st.integers(0, 30)),
                                             max_size=200))
def test_arc_invariants(cap, ops):
    store = ARCStore(cap)
    for insert, k in ops:
        if insert:
            new, out = store.insert([k])
            assert all(x not in store for x in out)
        elif k in store:
            store.touch([k])
            assert k in store.t2
        assert len(store) <= cap and len(store.t1) + len(store.b1) <= max(cap, 0) + 0
        assert len(store.t1) + len(store.t2) + len(store.b1) + len(store.b2) <= 2 * cap
        assert 0 <= store.p <= cap


def test_nothing_lost_with_a_chain_in_a_cluster_and_in_disaggregated_pools():
    df = _df(rate=8.0, n=200)
    chain = sim.offload_preset("lmcache", 0.5, 8)
    for kw in (dict(replicas=2), dict(disaggregation=sim.Disaggregation(1, 1))):
        res = sim.run(df, kv_offload=chain, **BASE, **kw)
        s = res.summary()
        assert s["num_finished"] + s.get("num_rejected", 0) == len(df)
        assert s["offload_bytes_stored"] > 0
    assert s["offload_hit_rate"] >= 0


def test_ttft_split_sums_to_the_mean_ttft():
    res = sim.run(_df(rate=8.0), kv_offload=sim.offload_preset("hicache", 1, 10), **BASE)
    s = res.summary()
    assert s["ttft_load_mean"] > 0
    assert s["ttft_queue_mean"] + s["ttft_load_mean"] + s["ttft_prefill_mean"] == \
        pytest.approx(s["ttft_mean"])


def test_presets_are_the_data_files_rows():
    from sim.engine.presets.offload import preset_rows
    rows = preset_rows()
    assert set(rows) == {"vllm", "lmcache", "hicache"}
    assert all(r["source"] for tiers in rows.values() for r in tiers)
    lm = sim.offload_preset("lmcache", 10, 100)
    assert lm.chunk_tokens == 256 and [t.capacity_gb for t in lm.tiers] == [10, 100]
    assert lm.tiers[1].read_gbps == 7.45 and lm.write_policy == "write_through"
    assert len(sim.offload_preset("lmcache", 10).tiers) == 1  # no disk given: none
    hi = sim.offload_preset("hicache", 10, write_policy="write_through_selective")
    assert hi.write_threshold == 2 and hi.write_policy == "write_through_selective"
    with pytest.raises(ValueError, match="kv_offload preset must be one of hicache, lmcache"):
        sim.offload_preset("mooncake", 1)
    with pytest.raises(ValueError, match="preset 'vllm' has one tier: lower_gb must be 0"):
        sim.offload_preset("vllm", 1, 2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(tiers=()), "kv_offload.tiers must be a non-empty tuple of sim.KVTier"),
    (dict(write_policy="lazy"), "kv_offload.write_policy must be one of write_back"),
    (dict(write_threshold=0), "kv_offload.write_threshold must be an integer >= 1, got 0"),
    (dict(chunk_tokens=-16), "kv_offload.chunk_tokens must be an integer >= 0, got -16"),
    (dict(link_gbps=0), r"kv_offload.link_gbps must be > 0, got 0")])
def test_bad_chain_settings_name_the_field(kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        KVTierChain(**{"tiers": (sim.KVTier(1),), **kwargs})
    with pytest.raises(ValueError, match="kv_offload.eviction must be 'lru' or 'arc'"):
        sim.KVTier(1, eviction="fifo")
    with pytest.raises(ValueError, match=r"kv_offload.capacity_gb must be >= 0, got -1"):
        sim.KVTier(-1)


def test_chain_under_random_evictions_keeps_each_tier_within_capacity():
    rnd = random.Random(0)
    chain = TierChain(_chain(sim.KVTier(5e-9), sim.KVTier(8e-9, eviction="arc")), 1.0, 16)
    for _ in range(300):
        chain.store(np.array([rnd.randrange(40) for _ in range(rnd.randrange(1, 6))]))
        assert len(chain.stores[0]) <= 5 and len(chain.stores[1]) <= 8
    assert chain.bytes_written[1] > 0  # demotions reached the second tier
    pd.Series(chain.bytes_written)  # (plain floats)


@pytest.mark.parametrize("scheduler", ["continuous", "static", "orca", "tensorrt-llm"])
def test_needs_a_scheduler_that_continues_partial_prefills(scheduler):
    """A landed request continues as a running partial prefill: these never schedule one (it
    raised 'formed an empty batch' before, found by tests/test_invariants.py; tensorrt-llm
    continues them only with enable_chunked_context, off by default)."""
    with pytest.raises(ValueError, match="kv_offload needs a scheduler that continues partial "
                                         f"prefills .*, got scheduler='{scheduler}'"):
        sim.run(_df(n=5), kv_offload=sim.offload_preset("vllm", 1),
                **{**BASE, "scheduler": scheduler, "prefix_caching": "block"})


def test_cli_builds_a_chain_and_refuses_bad_values(capsys, tmp_path, monkeypatch):
    from sim.cli import table_offload
    from sim.cli.main import main
    from sim.engine.kv.tiers import WRITE_POLICIES
    from sim.engine.presets.offload import OFFLOAD_PRESETS
    assert table_offload.OFFLOAD_PRESETS == OFFLOAD_PRESETS
    assert table_offload.WRITE_POLICIES == WRITE_POLICIES
    monkeypatch.chdir(tmp_path)
    assert main(["run", "-w", "mooncake-conversation", "-n", "40", "--rate", "0.5", "-s", "vllm",
                 "--kv-blocks", "2000", "--offload-gb", "2", "--offload-preset", "lmcache",
                 "--offload-lower-gb", "50", "--offload-read-bandwidth", "20", "-q"]) == 0
    assert "offload_tier1_hit_rate" in (tmp_path / "sim-out" / "summary.json").read_text()
    for flags, message in (
            (["--offload-preset", "hicache"], "--offload-preset needs offload_gb"),
            (["--offload-gb", "1", "--offload-write-threshold", "0"],
             "--offload-write-threshold must be > 0, got 0"),
            (["--offload-gb", "1", "--offload-write-policy", "lazy"], "invalid choice: 'lazy'")):
        try:
            assert main(["run", "-w", "mooncake-conversation", "-n", "5"] + flags) != 0
        except SystemExit as e:  # argparse's choices
            assert e.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0]


def _gain(n, tier):
    """TTFT of an ``n``-token prompt asked again after an unrelated prompt evicted it from a
    pool that holds one, without a tier over with ``tier`` (its KV loaded back)."""
    b = n // 16
    rows = [dict(arrival_time=t, num_prompt_tokens=p, num_output_tokens=1, hash_ids=ids)
            for t, p, ids in ((0.0, n, list(range(b))),
                              (30.0, n + 16, list(range(10**6, 10**6 + b + 1))),
                              (60.0, n, list(range(b))))]
    df = pd.DataFrame(rows)
    df.attrs["block_size"] = 16
    kw = dict(scheduler="vllm", model="llama-3.1-8b", gpu="h100", kv_blocks=b + 2)
    ttft = [sim.run(df, kv_offload=t, **kw).requests["ttft"].iloc[-1] for t in (None, tier)]
    return ttft[0] / ttft[1]


def test_vllm_cpu_hit_ttft_gain_spans_the_published_range():
    """vLLM's native CPU offload on an H100: 2-22x faster TTFT on a CPU hit (the anchor row in
    sim/data/offload_anchors.csv, its caveat there: the range's ends, not the curve)."""
    import csv
    from importlib import resources
    row = next(csv.DictReader(resources.files("sim").joinpath(
        "data/offload_anchors.csv").read_text().splitlines()))
    tier = sim.offload_preset(row["preset"], 100)
    low = _gain(int(row["prompt_tokens_low"]), tier)
    high = _gain(int(row["prompt_tokens_high"]), tier)
    assert low == pytest.approx(float(row["published_low"]), rel=0.25)  # 2.3x
    assert high == pytest.approx(float(row["published_high"]), rel=0.25)  # 23.4x


def test_offload_experiment_rows(load_script):
    exp = load_script("experiments/offload_tiers.py")
    t = exp.offload_sweep(sizes=(0, 2000), bandwidths=(50, 1))  # the defaults: 300 requests
    assert list(t.columns) == exp.COLUMNS and len(t) == 3
    none, fast, slow = t.to_dict("records")
    assert fast["offload_hit_rate"] == slow["offload_hit_rate"] > 0 == none["offload_hit_rate"]
    assert fast["prefix_hit_rate"] > none["prefix_hit_rate"]
    assert fast["ttft_mean"] < none["ttft_mean"] < slow["ttft_mean"]  # a slow tier loses


@pytest.mark.parametrize("flags, check", [
    (["--offload-preset", "lmcache", "--offload-lower-gb", "100"],
     lambda c: c.name == "lmcache" and [t.capacity_gb for t in c.tiers] == [1.0, 100.0]),
    (["--offload-preset", "hicache", "--offload-read-bandwidth", "20"],
     lambda c: c.tiers[0].read_gbps == 20 and c.write_threshold == 2),
    (["--offload-lower-gb", "5", "--offload-write-policy", "write_through_selective",
      "--offload-write-threshold", "3", "--offload-link-bandwidth", "16"],
     lambda c: (c.write_policy, c.write_threshold, c.link_gbps, len(c.tiers))
     == ("write_through_selective", 3, 16.0, 2)),
    (["--offload-eviction", "arc"], lambda c: c.eviction == "arc"),
    (["--offload-preset", "hicache", "--offload-layer-overlap"],
     lambda c: c.layer_overlap is True and c.load_threshold == 10)])
def test_cli_chain_flags_reach_the_chain(flags, check):
    from sim.cli.build import config_from
    from sim.cli.main import build_parser
    from sim.cli.settings import settings_from
    args = build_parser().parse_args(["run", "--offload-gb", "1", *flags])
    assert check(config_from(settings_from(args)).kv_offload)


def test_a_hit_below_the_load_threshold_is_recomputed():
    chain = TierChain(_chain(sim.KVTier(INF), load_threshold=40), 1.0, 16)  # 3 blocks at least
    chain.store(np.arange(5))
    keys = np.arange(10)
    assert chain.hits(keys, 0, 10) == 5
    assert chain.hits(keys, 2, 10) == 3
    assert chain.hits(keys, 3, 10) == 0  # 2 blocks, 32 tokens < 40
    with pytest.raises(ValueError, match="kv_offload.load_threshold must be an integer >= 0"):
        _chain(sim.KVTier(1), load_threshold=-1)
    # in a run: the threshold above every hit turns the tier's hits into recomputes
    df = _df()
    off = sim.run(df, **BASE)
    far = sim.run(df, kv_offload=_chain(sim.KVTier(8), load_threshold=10**6), **BASE)
    assert far.summary()["offload_hit_rate"] == 0
    assert far.summary()["prefix_hit_rate"] == off.summary()["prefix_hit_rate"]


@pytest.mark.parametrize("kind", ["lru", "arc"])
def test_a_store_with_kept_keys_stays_within_capacity(kind):
    """Random batches into a store whose ``keep`` set changes (the GPU's nodes): it never
    holds more than its capacity, evicts distinct keys, never a kept one it held, and a key
    it refuses is one just inserted, not one it held (the LRU store evicted its oldest free
    key once per batch before, reporting it ``extra`` times, and grew without bound)."""
    from sim.engine.kv.tier_stores import STORES
    rnd = random.Random(1)
    store = STORES[kind](8)
    gpu, version = set(), [0]
    store.keep = gpu.__contains__
    store.keep_version = lambda: version[0]
    for _ in range(400):
        if gpu and rnd.random() < 0.5:  # the GPU evicts some nodes
            for k in rnd.sample(sorted(gpu), rnd.randrange(1, len(gpu) + 1)):
                gpu.discard(k)
            version[0] += 1
        batch = rnd.sample(range(60), rnd.randrange(1, 6))
        gpu.update(k for k in batch if rnd.random() < 0.8)
        before = {k for k in range(60) if k in store}
        _new, out = store.insert(batch)
        out = list(out)
        assert len(store) <= 8 and len(out) == len(set(out))
        assert all(k not in store or k in batch for k in out)  # (ARC: out, then in again)
        for k in out:
            if k in before:
                assert k not in gpu  # only a free key it held is evicted
            else:
                assert k in batch  # refused: one just inserted


def test_agentic_offload_experiment_rows(load_script):
    """Offload on an agentic workload: a tier that holds the sessions' evicted contexts
    doubles the hit rate and cuts TTFT at PCIe bandwidth; at 0.5 GB/s the same hits make
    TTFT worse than no tier."""
    exp = load_script("experiments/offload_tiers.py")
    t = exp.agentic_sweep(sessions=48, sizes=(0, 80), bandwidths=(50, 0.5))
    assert list(t.columns) == exp.COLUMNS and len(t) == 3
    none, fast, slow = t.to_dict("records")
    assert fast["offload_hit_rate"] > 0.2 and none["offload_hit_rate"] == 0
    assert fast["prefix_hit_rate"] > 1.5 * none["prefix_hit_rate"]
    assert fast["ttft_mean"] < none["ttft_mean"] < slow["ttft_mean"]
    assert fast["request_throughput"] > none["request_throughput"]
