"""SGLang HiCache's L3 prefetch policies (``KVTierChain.prefetch_policy``, radix mode:
sim.engine.kv.radix_tiers.RadixTierChain.prefetch): best_effort starts with what arrived,
wait_complete waits for all, timeout waits at most base + 0.25 s per 1,024 tokens."""

import math

import pytest

import sim
from test_offload import _hash
from test_radix_tiers import NODE, RADIX, _chain, _one

L2 = dict(read_gbps=50)  # the host tier: 600 nodes; the L3 below it holds the rest


def _two(policy, l3_gbps, **kw):
    chain = _chain(sim.KVTier(600 * NODE / 1e9, **L2),
                   sim.KVTier(100, read_gbps=l3_gbps, latency=0.01), link_gbps=25,
                   prefetch_policy=policy, **kw)
    ttft, res = _one(chain, gpu_hit=False)
    return ttft, res.requests.iloc[-1], res.summary()


def test_best_effort_starts_with_what_arrived_and_wait_complete_waits_for_all():
    """The 250-node prefix asked again: 131 nodes in the host tier, 119 in a slow L3 (0.1
    GB/s: 2.4 s to prefetch). Admitted at once, best_effort has none of the L3's yet: it
    loads the 131 host nodes (2,096 tokens) and recomputes the rest, not waiting for the L3;
    wait_complete waits the whole prefetch (10 ms + 119 nodes at 0.1 GB/s), then loads all
    250 nodes at the host's speed: TTFT wait_complete >= best_effort."""
    best_t, best, s = _two("best_effort", 0.1)
    wait_t, wait, _ = _two("wait_complete", 0.1)
    assert best["num_offload_tokens"] == 131 * 16 and s["offload_tier1_bytes_read"] == 0
    assert best["load_time"] == pytest.approx(131 * NODE / 25e9)  # host nodes over the link
    assert wait["num_offload_tokens"] == 4000
    assert wait["load_time"] == pytest.approx(0.01 + 119 * NODE / 0.1e9 + 250 * NODE / 25e9)
    assert wait_t >= best_t
    recompute, _ = _one(None, gpu_hit=False)
    assert best_t < recompute  # the host part still loads rather than recomputes
    # a fast L3 (10 GB/s) under best_effort: still nothing of it by admission, the same run
    assert _two("best_effort", 10)[1]["num_offload_tokens"] == 131 * 16


def test_timeout_waits_at_most_its_bound_and_uses_what_arrived_by_then():
    """timeout with base 0.05 s: the bound is 0.05 + 0.25 * 1,904 / 1,024 s for the L3's
    1,904 tokens; the slow prefetch is not done by then, so the request starts with the
    nodes that arrived (each 21 ms at 0.1 GB/s after 10 ms), having waited exactly the bound;
    with a fast L3 the prefetch completes first and all 4,000 tokens load."""
    bound = 0.05 + 0.25 * 119 * 16 / 1024
    t, r, _ = _two("timeout", 0.1, prefetch_timeout_base=0.05)
    arrived = math.floor((bound - 0.01) / (NODE / 0.1e9))
    assert r["num_offload_tokens"] == (131 + arrived) * 16
    assert r["load_time"] == pytest.approx(bound + (131 + arrived) * NODE / 25e9)
    wait_t, _, _ = _two("wait_complete", 0.1)
    best_t, _, _ = _two("best_effort", 0.1)
    assert best_t < t < wait_t
    fast = _two("timeout", 10, prefetch_timeout_base=0.05)[1]
    assert fast["num_offload_tokens"] == 4000
    assert fast["load_time"] == pytest.approx(0.01 + 119 * NODE / 10e9 + 250 * NODE / 25e9)


@pytest.mark.parametrize("policy", ["best_effort", "wait_complete", "timeout"])
def test_a_chain_of_capacity_zero_with_a_policy_is_bit_identical_to_no_tier(policy):
    from test_offload import _df
    df = _df(n=80)
    none = sim.run(df, **RADIX)
    zero = sim.run(df, kv_offload=_chain(sim.KVTier(0.0), sim.KVTier(0.0),
                                         prefetch_policy=policy), **RADIX)
    assert _hash(zero) == _hash(none)


def test_bad_prefetch_settings_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match="kv_offload.prefetch_policy must be one of "
                                         "best_effort, wait_complete, timeout"):
        _chain(sim.KVTier(1), prefetch_policy="eager")
    with pytest.raises(ValueError, match="kv_offload.prefetch_timeout_base must be >= 0"):
        _chain(sim.KVTier(1), prefetch_policy="timeout", prefetch_timeout_base=-1)
    with pytest.raises(TypeError, match="kv_offload.prefetch_timeout_per_ki_token must be a "
                                        "number"):
        _chain(sim.KVTier(1), prefetch_timeout_per_ki_token="x")
    with pytest.raises(ValueError, match="prefetch_policy needs prefix_caching='radix'"):
        from test_offload import _df
        sim.run(_df(n=5), kv_offload=_chain(sim.KVTier(1), prefetch_policy="timeout"),
                **{**RADIX, "scheduler": "vllm", "prefix_caching": "block"})
    from sim.cli.main import main
    for argv, needle in (
            (["--offload-prefetch-policy", "eager"], "--offload-prefetch-policy"),
            (["--offload-prefetch-timeout", "-2"], "--offload-prefetch-timeout"),
            (["--offload-prefetch-threshold", "-1"], "--offload-prefetch-threshold"),
            (["--offload-prefetch-threshold", "1.5"], "--offload-prefetch-threshold"),
            (["--offload-prefetch-threshold", "x"], "--offload-prefetch-threshold")):
        try:
            code = main(["run", "-w", "mooncake-conversation", "-n", "5", "-s", "sglang",
                         "--offload-gb", "1", "--offload-preset", "hicache", *argv, "-q"])
        except SystemExit as e:
            code = e.code
        assert code not in (0, None)
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_the_cli_and_toml_set_the_policy(tmp_path, monkeypatch):
    from sim.cli.main import main
    monkeypatch.chdir(tmp_path)
    assert main(["run", "-w", "mooncake-conversation", "-n", "30", "--rate", "0.5", "-s",
                 "sglang", "--kv-blocks", "32000", "--offload-gb", "2", "--offload-preset",
                 "hicache", "--offload-lower-gb", "20", "--offload-prefetch-policy",
                 "timeout", "--offload-prefetch-timeout", "0.5", "-q"]) == 0
    from sim.cli.build_tiers import tier_chain
    chain = tier_chain({"preset": "hicache", "lower_gb": 20.0, "prefetch_policy": "timeout",
                        "prefetch_timeout_base": 0.5}, sim.KVTier(2.0), {})
    assert chain.prefetch_policy == "timeout" and chain.prefetch_timeout_base == 0.5


def test_no_l3_prefetch_when_too_little_of_the_prompt_is_left():
    """SGLang's ``prefetch_threshold`` (256 tokens, hiradix_cache.py; the hicache preset's):
    the scheduler asks L3 for the tokens past the GPU and host match, and nothing is
    prefetched when they are fewer. Node 0 on the GPU, 1-2 in the host tier, 3-5 in L3, a
    prompt matchable to 96 tokens: 48 lie past the host match, so a threshold of 48 keeps
    the L3 nodes (80 tokens in all), 49 stops the hit at the host's 32, and the host part
    is loaded whatever the threshold."""
    from sim.engine.kv.radix_tiers import RadixTierChain

    def hit(threshold):
        chain = RadixTierChain(_chain(sim.KVTier(10 * NODE / 1e9), sim.KVTier(100),
                                      prefetch_threshold=threshold), NODE, 16, 1)
        chain.manager(1000, 1)
        chain.stores[0].insert([1, 2])
        chain.stores[1].insert([3, 4, 5])
        chain.tokens.update(dict.fromkeys(range(1, 6), 16))
        return chain.radix_hits([0, 1, 2, 3, 4, 5], 16, 1, 96)

    assert hit(0) == hit(48) == (80, 5)
    assert hit(49) == hit(10**6) == (32, 2)
    assert sim.offload_preset("hicache", 1, 10).prefetch_threshold == 256
    assert sim.offload_preset("vllm", 1).prefetch_threshold == 0
    with pytest.raises(ValueError, match="kv_offload.prefetch_threshold must be an integer "
                                         ">= 0, got -1"):
        _chain(sim.KVTier(1), prefetch_threshold=-1)


L2_NODES = 1600  # (over the GPU pool's 1,250 nodes: room to prefetch L3 into)


def _threshold_run(threshold, tmp_path=None):
    """test_offload's shared-prefix workload (120 requests, 40 system prompts of 3,000 tokens)
    on SGLang with a 20,000-token pool, the hicache preset's L2 of 1,600 nodes over an L3 of
    50 GB: most tier hits come from L3. ``tmp_path``: through the CLI (the workload from a
    parquet file), else the API."""
    import pandas as pd

    from test_offload import _df
    if tmp_path is None:
        chain = sim.offload_preset("hicache", L2_NODES * NODE / 1e9, 50.0,
                                   prefetch_threshold=threshold)
        return sim.run(_df(n=120), **{**RADIX, "kv_blocks": 20_000, "check": False},
                       kv_offload=chain)
    _df(n=120).to_parquet(tmp_path / "w.parquet")
    from sim.cli.main import main
    assert main(["run", "-w", str(tmp_path / "w.parquet"), "-s", "sglang", "--model",
                 "llama-3.1-8b", "--gpu", "h100", "--kv-blocks", "20000", "--offload-preset",
                 "hicache", "--offload-gb", repr(L2_NODES * NODE / 1e9),
                 "--offload-lower-gb", "50",
                 "--offload-prefetch-threshold", str(threshold), "-o", str(tmp_path / "o"),
                 "-q"]) == 0
    return pd.read_parquet(tmp_path / "o" / "requests.parquet")


def test_the_prefetch_threshold_cuts_lower_tier_hits_in_a_run_and_the_cli_sets_it(tmp_path):
    """``--offload-prefetch-threshold`` (``KVTierChain.prefetch_threshold``) in a whole run:
    at 0 the L3 serves most hits (the system prompts, evicted from the GPU and L2); at
    3,200 a request with fewer tokens past its GPU and L2 match (a 3,000-token system
    prompt and a short user part) loses its L3 part (0.45 of the prompt tokens from L3 ->
    0.12); above every prompt's length no hit reaches L3. The CLI's run is the API's, bit
    for bit."""
    runs = {t: _threshold_run(t) for t in (0, 3200, 10**6)}
    l3 = {t: r.summary()["offload_tier1_hit_rate"] for t, r in runs.items()}
    assert l3[10**6] == 0 < l3[3200] < l3[0]
    assert runs[10**6].summary()["prefix_hit_rate"] < runs[0].summary()["prefix_hit_rate"]
    by_cli = _threshold_run(3200, tmp_path)
    api = runs[3200].requests.reset_index(drop=True)
    import pandas as pd
    assert len(api) == 120
    pd.testing.assert_frame_equal(by_cli[list(api.columns)].reset_index(drop=True), api,
                                  check_exact=True, check_dtype=False)
