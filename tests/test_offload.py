"""The KV offload tier under the block prefix cache (sim.engine.kv.offload)."""

import hashlib
import math

import pandas as pd
import pytest

import sim
import workloads

BASE = dict(scheduler="vllm", model="llama-3.1-8b", gpu="h100", kv_blocks=2000, check=True)


def _df(rate=4.0, n=300):
    return workloads.shared_prefix(n, n_groups=40, system_prompt_tokens=3000, rate=rate, seed=0,
                                   user_tokens=workloads.LogNormal(200, 1.0, max_tokens=2000),
                                   output=workloads.LogNormal(150, 1.0, max_tokens=1000))


def _hash(res):
    cols = [c for c in res.requests.columns if c not in ("num_offload_tokens", "load_time")]
    h = hashlib.sha256(pd.util.hash_pandas_object(res.requests[cols]).values.tobytes())
    h.update(pd.util.hash_pandas_object(res.iterations).values.tobytes())
    keep = {k: v for k, v in res.summary().items() if "wall" not in k and "sim_speed" not in k
            and "requests_per_wall" not in k and not k.startswith(("offload", "load_time", "ttft_queue", "ttft_load", "ttft_prefill"))}
    h.update(repr(sorted(keep.items())).encode())
    return h.hexdigest()


def test_capacity_zero_is_bit_identical_to_no_tier():
    df = _df()
    off = sim.run(df, **BASE)
    zero = sim.run(df, kv_offload=sim.KVTier(0), **BASE)
    assert _hash(off) == _hash(zero)
    assert zero.summary()["offload_hit_rate"] == 0
    assert zero.summary()["offload_bytes_stored"] == 0


def test_unlimited_free_tier_hits_as_a_pool_that_never_evicts():
    """Everything the GPU evicts is kept and loads take no time: each request hits what an
    unbounded pool would (kv_blocks large enough never to evict), token for token."""
    df = _df()
    tier = sim.run(df, kv_offload=sim.KVTier(math.inf, math.inf, math.inf), **BASE)
    big = sim.run(df, **{**BASE, "kv_blocks": 200_000})
    small = sim.run(df, **BASE)
    assert tier.summary()["prefix_hit_rate"] == big.summary()["prefix_hit_rate"]
    assert small.summary()["prefix_hit_rate"] < big.summary()["prefix_hit_rate"]
    assert tier.summary()["offload_hit_rate"] > 0
    assert (tier.requests["load_time"] == 0).all()


def _one(tier, gpu_hit, **run):
    """TTFT of a second request sharing a 4,000-token prefix with the first, 60 s later: its
    prefix on the GPU (gpu_hit), else evicted by 3 unrelated prompts in between (``run``: the
    run's settings over ``BASE`` with a pool of 300 blocks)."""
    rows = [dict(arrival_time=0.0, num_prompt_tokens=4096, num_output_tokens=4,
                 hash_ids=list(range(256)))]
    if not gpu_hit:
        rows += [dict(arrival_time=10.0 * (k + 1), num_prompt_tokens=4096, num_output_tokens=4,
                      hash_ids=list(range(1000 * (k + 1), 1000 * (k + 1) + 256)))
                 for k in range(3)]
    rows.append(dict(arrival_time=60.0, num_prompt_tokens=4096, num_output_tokens=4,
                     hash_ids=list(range(250)) + list(range(9000, 9006))))
    df = pd.DataFrame(rows)
    df.attrs["block_size"] = 16
    res = sim.run(df, **{**BASE, "kv_blocks": 300, **run}, kv_offload=tier)
    return res.requests["ttft"].iloc[-1], res


def test_ttft_of_a_tier_hit_lies_between_a_gpu_hit_and_a_recompute():
    hit, _ = _one(None, gpu_hit=True)
    recompute, _ = _one(None, gpu_hit=False)
    loaded, res = _one(sim.KVTier(10, read_gbps=25), gpu_hit=False)
    assert res.requests["num_offload_tokens"].iloc[-1] == 4000
    assert hit < loaded < recompute
    load = res.requests["load_time"].iloc[-1]
    block = sim.kv_cache_bytes(16, model="llama-3.1-8b")
    assert load == pytest.approx(250 * block / 25e9)  # bytes / read bandwidth
    slow, res = _one(sim.KVTier(10, read_gbps=0.05, latency=0.01), gpu_hit=False)
    assert slow > recompute  # a slow enough tier loses to recomputing
    assert res.requests["load_time"].iloc[-1] == pytest.approx(0.01 + 250 * block / 0.05e9)


def test_nothing_lost_under_check_in_a_cluster_and_a_slow_tier():
    df = _df(rate=8.0, n=200)
    res = sim.run(df, kv_offload=sim.KVTier(8, read_gbps=1.0), replicas=2, **BASE)
    s = res.summary()
    assert s["num_finished"] + s.get("num_rejected", 0) == len(df)
    assert s["offload_hit_rate"] > 0 and s["offload_bytes_loaded"] > 0


@pytest.mark.parametrize("kwargs, field", [
    (dict(capacity_gb=-1), "kv_offload.capacity_gb"), (dict(read_gbps=0), "kv_offload.read_gbps"),
    (dict(write_gbps=0), "kv_offload.write_gbps"), (dict(latency=-1), "kv_offload.latency")])
def test_bad_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        sim.KVTier(**kwargs)


def test_needs_a_prefix_cache():
    with pytest.raises(ValueError, match="kv_offload needs prefix_caching='block' or 'radix'"):
        sim.run(_df(n=5), kv_offload=sim.KVTier(1), **{**BASE, "prefix_caching": False})


def test_cli_flags_build_the_tier_and_refuse_bad_values(capsys, tmp_path, monkeypatch):
    from sim.cli.main import main
    monkeypatch.chdir(tmp_path)
    assert main(["run", "-w", "mooncake-conversation", "-n", "40", "--rate", "0.5", "-s", "vllm",
                 "--kv-blocks", "20000", "--offload-gb", "100", "-q"]) == 0
    assert main(["run", "-w", "mooncake-conversation", "-n", "5", "--offload-gb", "1",
                 "--offload-read-bandwidth", "0"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("--offload-read-bandwidth must be a finite number > 0, got 0.0")
