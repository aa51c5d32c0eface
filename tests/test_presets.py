"""Engine presets, one test per rule on a small hand-built scenario (sim/engine/presets/)."""

import pandas as pd
import pytest

import sim
from sim.engine import VLLM, SimConfig
from sim.engine.core.request import PREFILL


def _df(arrivals, prompts, outputs):
    return pd.DataFrame({"arrival_time": arrivals, "num_prompt_tokens": prompts,
                         "num_output_tokens": outputs})


COST = sim.ConstantCost(0.1)  # iteration k starts at 0.1 k


def _iteration_of(t):
    return round(t / 0.1)


# -- vLLM v1 ---------------------------------------------------------------------------------

@pytest.mark.parametrize("gpu, tokens, seqs", [("h100", 8192, 1024), ("h200", 8192, 1024),
                                               ("a100", 2048, 256), ("l40s", 2048, 256)])
def test_vllm_rule5_budget_and_max_seqs_by_gpu(gpu, tokens, seqs):
    cfg = SimConfig(scheduler="vllm", gpu=gpu)
    r = cfg.resolved()
    assert (r.max_batch_size, r.block_size, r.gpu_memory_utilization, r.prefix_caching) == (
        seqs, 16, 0.9, "block")
    assert cfg.policy().max_num_batched_tokens == tokens


def test_vllm_explicit_knobs_win_over_its_defaults():
    cfg = SimConfig(scheduler="vllm", gpu="h100", max_batch_size=64, chunk_size=4096,
                    block_size=32, prefix_caching=False)
    r = cfg.resolved()
    assert (r.max_batch_size, r.block_size, r.prefix_caching) == (64, 32, False)
    assert cfg.policy().max_num_batched_tokens == 4096
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SimConfig(scheduler="vllm", chunk_size=512)  # < 1024 sequences on an H100
    with pytest.raises(ValueError, match="token_budget"):
        SimConfig(scheduler="vllm", token_budget=100)


def test_vllm_rules1_2_running_prefills_first_then_waiting_chunked_to_the_budget():
    df = _df([0.0, 0.0, 0.0], [100, 10, 30], [2, 2, 2])
    res = sim.run(df, scheduler="vllm", chunk_size=64, max_batch_size=4, cost_model=COST)
    it = res.iterations
    # iteration 0: A's first 64 tokens; 1: A's last 36, then B (10) and 18 of C's 30
    assert it["num_prefill_tokens"].tolist()[:3] == [64, 64, 12]
    first = res.requests["first_scheduled_time"].map(_iteration_of).tolist()
    assert first == [0, 1, 1]
    # C finishes its prefill in iteration 2 beside the decodes of A and B
    assert _iteration_of(res.requests["first_token_time"].iloc[2]) == 3


class _NoRule4(VLLM):
    """vLLM's rules without rule 4 (a variant to show the rule is observable)."""

    def schedule(self, replica, now):
        budget = self.max_num_batched_tokens - replica.decodes.count
        for r in replica.prefilling:
            if budget > 0 and r.status == PREFILL:
                chunk = min(r.prefill_target - r.num_computed, budget)
                if replica.schedule_chunk(r, chunk):
                    budget -= chunk
        while budget > 0 and replica.waiting:
            r = replica.waiting[0]
            chunk = min(r.prefill_target - replica.prefix_hit(r), budget)
            if not replica.admit(r, chunk):
                break
            budget -= chunk


class _Watch:
    """Counts the iterations that preempted and those that also admitted a waiting request."""

    name = "watch"

    def __init__(self, policy):
        self.policy, self.preempting, self.admitting = policy, 0, 0

    def schedule(self, replica, now):
        w0, p0 = len(replica.waiting), replica.num_preempted_now
        self.policy.schedule(replica, now)
        w1, p1 = len(replica.waiting), replica.num_preempted_now
        if p1:
            self.preempting += 1
            self.admitting += (w0 + (p1 - p0) - w1) > 0


def test_vllm_rule4_no_admission_in_a_step_that_preempted():
    """With prefix caching a preempted request's blocks stay cached, so it (at the head of the
    queue) could come back in the very step that preempted it; vLLM waits a step."""
    import workloads
    df = workloads.shared_prefix(200, n_groups=4, system_prompt_tokens=256,
                                 user_tokens=workloads.Uniform(16, 200),
                                 output=workloads.Uniform(8, 120), rate=20.0, seed=2)
    seen = {}
    for policy in (VLLM(256), _NoRule4(256)):
        watch = _Watch(policy)
        res = sim.run(df, scheduler=watch, prefix_caching="block", kv_blocks=90,
                      max_batch_size=64, cost_model=sim.ConstantCost(0.01))
        assert (res.requests["status"] == "finished").all()
        seen[type(policy).__name__] = (watch.preempting, watch.admitting)
    assert seen["VLLM"][0] > 50 and seen["VLLM"][1] == 0
    assert seen["_NoRule4"][1] > 0  # without the rule it does happen


def test_vllm_rule3_preempts_the_newest_running_request_possibly_itself():
    # A decodes; B, admitted after it, prefills in chunks and runs out of blocks: the newest
    # running request is B itself, so B is preempted and A never is
    df = _df([0.0, 0.05], [4, 60], [40, 2])
    res = sim.run(df, scheduler="vllm", chunk_size=16, max_batch_size=4, kv_blocks=16,
                  block_size=4, cost_model=COST)
    pre = res.requests["num_preemptions"].tolist()
    assert pre[0] == 0 and pre[1] >= 1
    assert (res.requests["status"] == "finished").all()


def test_vllm_rule6_block_prefix_caching_is_on_by_default():
    ids = list(range(4))
    df = _df([0.0, 5.0], [64, 64], [2, 2]).assign(hash_ids=[ids, ids])
    df.attrs["block_size"] = 16
    res = sim.run(df, scheduler="vllm", cost_model=COST)
    assert res.requests["num_cached_tokens"].tolist() == [0, 48]
    assert res.config.prefix_caching == "block"


# -- Sarathi ---------------------------------------------------------------------------------

def test_sarathi_rule3_defaults():
    r = SimConfig(scheduler="sarathi").resolved()
    assert (r.max_batch_size, r.block_size, r.prefix_caching) == (128, 16, False)
    assert SimConfig(scheduler="sarathi").policy().chunk_size == sim.CHUNK_SIZE == 512


def test_sarathi_rule1_decodes_and_chunks_share_the_token_budget():
    df = _df([0.0] * 6 + [0.2], [8] * 6 + [2000], [50] * 6 + [2])
    res = sim.run(df, scheduler="sarathi", chunk_size=128, cost_model=COST, kv_blocks=10_000)
    it = res.iterations
    assert (it["num_prefill_tokens"] + it["num_decode_tokens"] <= 128).all()
    # while the long prompt is chunked, the six decodes keep going: 122 prefill tokens each
    assert 122 in it["num_prefill_tokens"].tolist()
    assert res.requests["max_itl"].iloc[:6].max() == pytest.approx(0.1)


def test_sarathi_rule2_admission_needs_the_whole_prompt_plus_a_watermark():
    # pool 100 blocks of 16 (watermark 1 block); A holds 11 once it decodes (160 + 1 tokens);
    # B's prompt needs 89 blocks: 89 free but not 89 + 1, so B waits for A to finish - vLLM
    # admits B's first chunk at once
    df = _df([0.0, 0.05], [160, 89 * 16], [30, 2])
    kw = dict(cost_model=COST, kv_blocks=100, max_batch_size=8)
    sar = sim.run(df, scheduler="sarathi", **kw)
    assert sar.requests["first_scheduled_time"].iloc[1] >= sar.requests["finish_time"].iloc[0]
    vl = sim.run(df, scheduler="vllm", chunk_size=512, prefix_caching=False, **kw)
    assert vl.requests["first_scheduled_time"].iloc[1] < vl.requests["finish_time"].iloc[0]


# -- Orca ------------------------------------------------------------------------------------

def test_orca_rule1_whole_prompts_mixed_with_decodes():
    df = _df([0.0, 0.15], [16, 5000], [10, 2])
    res = sim.run(df, scheduler="orca", cost_model=COST, kv_blocks=10_000)
    it = res.iterations
    row = it[it["num_prefill_tokens"] == 5000]
    assert len(row) == 1 and row["num_decode_tokens"].iloc[0] == 1


def test_orca_rule2_no_watermark_unlike_continuous():
    # B needs exactly the 89 free blocks (A holds 11): Orca admits it; our continuous keeps
    # 1 % of the pool free
    df = _df([0.0, 0.05], [160, 89 * 16], [30, 2])
    kw = dict(cost_model=COST, kv_blocks=100, max_batch_size=8)
    orca = sim.run(df, scheduler="orca", **kw)
    cont = sim.run(df, scheduler="continuous", **kw)
    assert orca.requests["first_scheduled_time"].iloc[1] < orca.requests["finish_time"].iloc[0]
    assert cont.requests["first_scheduled_time"].iloc[1] >= cont.requests["finish_time"].iloc[0]


def test_every_preset_is_in_the_table_and_documents_its_rules():
    for name in ("vllm", "sarathi", "orca"):
        cls = sim.POLICIES[name]
        assert cls.name == name and "Rules:" in cls.__doc__
    assert sim.POLICIES["vllm"] is VLLM


@pytest.mark.slow
@pytest.mark.parametrize("sched", ["chunked", "continuous", "sarathi", "vllm", "sglang"])
def test_no_thrash_under_kv_pressure(sched):
    """The thrash scenario (Azure conv, 3,000 requests at 10 req/s, Llama-3.1-8B on H100,
    2,000 blocks of 16): every request finishes; our own policies recompute at most 20 % more
    prefill than the prompts (before the fix, chunked recomputed 3.2x and preempted one request
    77 times)."""
    import workloads
    df = workloads.load("azure-conv", n=3000, rate=10.0)
    res = sim.run(df, scheduler=sched, model="llama-3.1-8b", gpu="h100", kv_blocks=2000,
                  block_size=16)
    s = res.summary()
    assert s["num_finished"] == 3000
    limit = 1.2 if sched in ("chunked", "continuous", "sarathi") else 1.5
    assert s["prefill_compute_ratio"] <= limit, s["prefill_compute_ratio"]
    assert s["max_preemptions"] <= 10


def test_resolved_config_records_the_policy_knobs_and_caching_spellings():
    assert SimConfig(scheduler="vllm", gpu="a100").resolved().chunk_size == 2048
    assert SimConfig().resolved().chunk_size == sim.CHUNK_SIZE
    assert SimConfig(scheduler="static").resolved().chunk_size is None
    assert SimConfig(prefix_caching="off").prefix_caching is False
    assert SimConfig(prefix_caching="radix").prefix_caching == "radix"
    assert SimConfig(prefix_caching=" Radix").prefix_caching == "radix"  # any case, as
    assert SimConfig(prefix_caching="OFF").prefix_caching is False  # scheduler="VLLM" works
    assert SimConfig(scheduler="VLLM", weight_dtype="FP8").resolved().prefix_caching == "block"
    with pytest.raises(ValueError, match="prefix_caching must be one of .* got 'LRU'"):
        SimConfig(prefix_caching="LRU")
    df = _df([0.0], [10], [2])
    assert sim.run(df, scheduler="vllm", cost_model=COST).config.chunk_size == 8192


def test_resolutions_kept_by_value_survive_eviction(monkeypatch):
    """Resolved configs are kept by value, keyed on the finished config: a key whose fields
    changed after it was stored (``engine_overheads`` None -> "none") could never be found or
    evicted (a KeyError once the memo filled)."""
    from sim.engine import schedulers
    monkeypatch.setattr(schedulers, "_RESOLVED", {})
    monkeypatch.setattr(schedulers, "RESOLVED_MAX", 3)
    configs = [SimConfig(scheduler=s, max_batch_size=b, engine_overheads=o)
               for s in ("vllm", "sglang", "orca") for b, o in ((8, None), (16, " None "))]
    assert len(schedulers._RESOLVED) <= 3
    assert all(key in schedulers._RESOLVED for key in list(schedulers._RESOLVED))
    assert configs[-1] in schedulers._RESOLVED  # the newest is kept under its final value
    assert configs[-1].resolved() == SimConfig(
        scheduler="orca", max_batch_size=16, engine_overheads="none").resolved()
