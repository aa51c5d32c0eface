"""Each troubleshooting finding: a scenario that triggers it and one that does not."""

import numpy as np
import pandas as pd
import pytest

import sim
import workloads


def _codes(res):
    return {f.code for f in res.diagnose()}


def _df(n, rate, prompt, output, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"arrival_time": np.cumsum(rng.exponential(1 / rate, n)),
                         "num_prompt_tokens": prompt, "num_output_tokens": output})


COST = sim.LinearCost(0.005, 1e-5, 1e-4)


def test_overloaded_only_when_arrivals_outpace_service():
    over = sim.run(_df(400, 200.0, 100, 50), scheduler="continuous", cost_model=COST,
                   max_batch_size=8)
    fine = sim.run(_df(400, 2.0, 100, 50), scheduler="continuous", cost_model=COST,
                   max_batch_size=8)
    assert "overloaded" in _codes(over) and "overloaded" not in _codes(fine)
    f = next(f for f in over.diagnose() if f.code == "overloaded")
    assert f.value < 0.95 and "/s" in f.message and "rate" in f.action
    # a short healthy run whose last requests drain after the last arrival is not overloaded
    healthy = sim.run(workloads.load("sharegpt", n=500, rate=4.0, seed=3), scheduler="chunked",
                      model="llama-3.1-8b", gpu="h100")
    assert healthy.summary()["queueing_delay_p50"] < 0.1
    assert "overloaded" not in _codes(healthy)


def test_users_queue_when_a_closed_loop_has_more_users_than_the_batch_serves():
    """500 users on one replica waited a minute for their first token (P50 TTFT 60 s on
    ShareGPT) with no finding: a closed loop's queue never grows past its users."""
    df = _df(600, 2.0, 100, 50)
    many = sim.run(df, scheduler="continuous", cost_model=COST, max_batch_size=4,
                   closed_loop=workloads.ClosedLoop(64, 0.0))
    few = sim.run(df, scheduler="continuous", cost_model=COST, max_batch_size=4,
                  closed_loop=workloads.ClosedLoop(4, 0.5))
    open_loop = sim.run(df, scheduler="continuous", cost_model=COST, max_batch_size=4)
    assert "users_queue" in _codes(many)
    assert "users_queue" not in _codes(few) and "users_queue" not in _codes(open_loop)
    f = next(f for f in many.diagnose() if f.code == "users_queue")
    s = many.summary()
    assert f.value == s["queueing_delay_mean"] / s["e2e_mean"] > 0.5  # 60 of 64 wait
    assert f.message.startswith("64 users queue") and "fewer users" in f.action
    assert "overloaded" not in _codes(many)


def test_rejected_requests_are_a_finding():
    df = _df(50, 2.0, 100, 50)
    assert "rejected" in _codes(sim.run(df, cost_model=COST, kv_blocks=2))
    assert "rejected" not in _codes(sim.run(df, cost_model=COST))


def test_prompts_over_max_num_tokens_are_their_own_finding_not_the_pools():
    """tensorrt-llm without chunked context rejects a prompt over max_num_tokens at arrival:
    counted apart in the summary and said as such, not as a request larger than the KV pool
    (which holds it easily); with chunked context nothing is rejected."""
    df = _df(40, 2.0, np.where(np.arange(40) % 4 == 0, 300, 50), 20)
    kw = dict(scheduler="tensorrt-llm", token_budget=200, cost_model=COST, kv_blocks=1000)
    res = sim.run(df, **kw)
    s = res.summary()
    assert (s["num_rejected"], s["num_rejected_max_num_tokens"],
            s["num_rejected_context_length"]) == (10, 10, 0)
    assert res.over_max_num_tokens().tolist() == (np.arange(40) % 4 == 0).tolist()
    assert _codes(res) >= {"max_num_tokens"} and "rejected" not in _codes(res)
    f = next(f for f in res.diagnose() if f.code == "max_num_tokens")
    assert f.value == 10 and "up to 300 tokens" in f.message and "max_num_tokens 200" in \
        f.message and "enable_chunked_context=True" in f.action
    chunked = sim.run(df, enable_chunked_context=True, **kw)
    assert chunked.summary()["num_rejected_max_num_tokens"] == 0
    assert not _codes(chunked) & {"max_num_tokens", "rejected"}
    # both kinds at once: the pool's finding counts only the pool's rejections
    both = sim.run(df.assign(num_prompt_tokens=np.where(np.arange(40) % 4 == 1, 190,
                                                        df["num_prompt_tokens"])),
                   **{**kw, "kv_blocks": 6})  # 6 blocks of 32: 192 tokens
    codes = {f.code: f.value for f in both.diagnose()}
    assert codes["max_num_tokens"] == 10 and codes["rejected"] == 10


def test_abandoned_conversations_are_their_own_finding_not_the_pools():
    """A closed-loop user drops a conversation whose turn could never fit the pool: the
    pool's finding counts that turn, this one the turns never sent; without conversations
    nothing is abandoned."""
    df = pd.DataFrame({"arrival_time": 0.0, "num_prompt_tokens": [50, 400, 450, 500, 60, 70],
                       "num_output_tokens": 10, "session_id": ["a", "a", "a", "a", "b", "c"],
                       "turn": [0, 1, 2, 3, 0, 0]})
    kw = dict(scheduler="continuous", cost_model=COST, kv_blocks=8, block_size=16,
              closed_loop=workloads.ClosedLoop(2, 0.1))  # 128 tokens: 400 never fits
    res = sim.run(df, **kw)
    codes = {f.code: f.value for f in res.diagnose()}
    assert codes["rejected"] == 1 and codes["conversation_abandoned"] == 2
    f = next(f for f in res.diagnose() if f.code == "conversation_abandoned")
    assert f.message.startswith("2 of 6 requests were never sent")
    alone = sim.run(df.drop(columns=["session_id", "turn"]), **kw)
    codes = {f.code: f.value for f in alone.diagnose()}
    assert codes["rejected"] == 3 and "conversation_abandoned" not in codes


def test_idle_slots_under_static_batching_only():
    # one long output per batch keeps the slots of its finished neighbours empty
    outputs = np.where(np.arange(200) % 8 == 0, 400, 5)
    df = _df(200, 50.0, 50, outputs)
    static = sim.run(df, scheduler="static", cost_model=COST, max_batch_size=8)
    cont = sim.run(df, scheduler="continuous", cost_model=COST, max_batch_size=8)
    assert "idle_slots" in _codes(static) and "idle_slots" not in _codes(cont)


def test_decode_stalls_under_whole_prompt_prefill_not_chunked():
    n = 8
    long = 8  # enough stalled gaps (8 per decode) to reach the pooled P99
    df = pd.DataFrame({"arrival_time": [0.0] * n + [0.5 * (k + 1) for k in range(long)],
                       "num_prompt_tokens": [16] * n + [8192] * long,
                       "num_output_tokens": [400] * n + [5] * long})
    cost = sim.LinearCost(0.01, 1e-4, 1e-4)
    cont = sim.run(df, scheduler="continuous", cost_model=cost, max_batch_size=16,
                   kv_blocks=10**5)
    chunked = sim.run(df, scheduler="chunked", cost_model=cost, max_batch_size=16,
                      kv_blocks=10**5, chunk_size=512)
    assert "decode_stalls" in _codes(cont) and "decode_stalls" not in _codes(chunked)
    # the advice names what the run's scheduler can do: chunk_size is refused by the
    # tensorrt-llm preset, whose whole prompts are TensorRT-LLM's chunked context left off
    advice = {f.code: f.action for f in cont.diagnose()}["decode_stalls"]
    assert "scheduler='chunked'" in advice and "chunk_size" in advice
    trt = sim.run(df, scheduler="tensorrt-llm", cost_model=cost, max_batch_size=16,
                  kv_blocks=10**5, token_budget=9000)  # (room for a prompt beside 8 decodes)
    advice = {f.code: f.action for f in trt.diagnose()}["decode_stalls"]
    assert "enable_chunked_context=True" in advice and "chunk_size" not in advice
    # with chunked context on, prompts of up to max_num_tokens still run beside the decodes
    on = sim.run(df, scheduler="tensorrt-llm", cost_model=cost, max_batch_size=16,
                 kv_blocks=10**5, token_budget=8192, enable_chunked_context=True)
    advice = {f.code: f.action for f in on.diagnose()}["decode_stalls"]
    assert advice == "lower max_num_tokens (token_budget, now 8,192)"


def test_decode_stalls_behind_sglangs_prefill_batches_that_run_alone():
    """SGLang's prefill batches exclude the decodes, whose next token waits out the whole
    prefill iteration: on Mooncake's long prompts P99 ITL was 18x the median (430 ms) and
    diagnose() said nothing, as no iteration mixed prefill and decode tokens."""
    df = workloads.load("mooncake-conversation", n=300, rate=1.0)
    res = sim.run(df, scheduler="sglang", model="llama-3.1-8b", gpu="h100")
    it = res.iterations
    assert not ((it["num_prefill_tokens"] > 0) & (it["num_decode_tokens"] > 0)).any()
    f = next(f for f in res.diagnose() if f.code == "decode_stalls")
    assert f.value > 5 and "running alone (SGLang's prefill batches)" in f.message
    assert f.action == f"lower the token budget (chunk_size, now {res.config.chunk_size:,})"
    # short prompts: prefill batches far under 2,048 tokens stall nobody
    short = sim.run(workloads.load("azure-code", n=150, rate=1.0).assign(num_prompt_tokens=64),
                    scheduler="sglang", model="llama-3.1-8b", gpu="h100")
    assert "decode_stalls" not in _codes(short)
    # a disaggregated run's prefill pool holds no decodes to stall
    split = sim.run(df, scheduler="sglang", model="llama-3.1-8b", gpu="h100",
                    disaggregation=sim.Disaggregation(prefill_replicas=1, decode_replicas=1))
    assert "decode_stalls" not in _codes(split)


def test_kv_pool_too_small_when_preemptions_recompute_prefill():
    df = workloads.load("azure-conv", n=600, rate=10.0)
    tight = sim.run(df, scheduler="vllm", model="llama-3.1-8b", gpu="h100", kv_blocks=300,
                    prefix_caching=False)
    roomy = sim.run(df, scheduler="vllm", model="llama-3.1-8b", gpu="h100",
                    prefix_caching=False)
    assert "kv_pool_too_small" in _codes(tight) and "kv_pool_too_small" not in _codes(roomy)


def test_kv_pool_too_small_is_not_hidden_by_prefix_cache_hits():
    """With a prefix cache, prefill_compute_ratio (computed / prompt tokens) counts the hits as
    work saved: 2,048-token shared prompts hit 97 % of their tokens, so a pool that preempted
    over a thousand times still read 0.13 and no finding was made; the recomputation is the
    computed plus the hits above the prompt tokens."""
    sp = workloads.shared_prefix(600, n_groups=2, system_prompt_tokens=2048, user_tokens=64,
                                 output=300, rate=50.0, seed=1)
    kw = dict(prefix_caching="block", model="llama-3.1-8b", gpu="h100")
    tight = sim.run(sp, kv_blocks=400, **kw)
    s, req = tight.summary(), tight.requests
    assert s["num_preemptions"] > 1000 and s["prefill_compute_ratio"] < 0.2
    f = next(f for f in tight.diagnose() if f.code == "kv_pool_too_small")
    done = req["num_prefill_computed"].sum() + req["num_cached_tokens"].sum()
    assert f.value == done / req["num_prompt_tokens"].sum() > 1.05
    assert f"recomputed {f.value - 1:.0%} more prefill" in f.message
    assert "kv_pool_too_small" not in _codes(sim.run(sp, **kw))  # the memory budget's pool


def test_no_prefix_hits_when_the_shared_prompt_differs(unshared):
    same = workloads.shared_prefix(60, n_groups=1, system_prompt_tokens=512, user_tokens=32,
                                   output=4, rate=2.0, seed=3)
    shifted = unshared(same)
    kw = dict(scheduler="vllm", cost_model=COST)
    assert "no_prefix_hits" in _codes(sim.run(shifted, **kw))
    assert "no_prefix_hits" not in _codes(sim.run(same, **kw))
    assert "no_prefix_hits" not in _codes(sim.run(shifted, scheduler="continuous",
                                                  cost_model=COST))  # caching off: no finding


def test_no_prefix_hits_is_silent_when_the_workload_names_no_prefix_block():
    """A workload without hash_ids (or whose ids cover no full block) cannot hit by
    construction: no finding (newcomer review: vllm on azure-conv said "no prefix hits"). The
    Result counts the requests naming a cacheable block: in block mode those whose hash ids
    cover one full block, ``min(prompt, ids x 16) >= block_size``."""
    plain = _df(40, 2.0, 600, 4)
    for mode in ("block", "radix"):
        res = sim.run(plain, scheduler="vllm", cost_model=COST, prefix_caching=mode)
        assert res.num_prefix_keyed == 0 and res.summary()["prefix_hit_rate"] == 0
        assert "no_prefix_hits" not in _codes(res)
    short = plain.assign(num_prompt_tokens=[600] * 20 + [20] * 20,
                         hash_ids=[[1000 + i] for i in range(20)] + [[i] for i in range(20)])
    short.attrs["block_size"] = 16  # one id of 16 tokens each: a full block of 16 ...
    res = sim.run(short, scheduler="vllm", cost_model=COST, block_size=32)  # ... not of 32
    assert res.num_prefix_keyed == 0 and "no_prefix_hits" not in _codes(res)
    res = sim.run(short, scheduler="vllm", cost_model=COST, block_size=16)
    assert res.num_prefix_keyed == 40 and "no_prefix_hits" in _codes(res)  # unique ids: no hit
    assert sim.run(short, scheduler="continuous", cost_model=COST).num_prefix_keyed == 0


def test_a_healthy_run_has_no_findings_and_findings_read_as_text():
    res = sim.run(_df(300, 2.0, 100, 50), scheduler="chunked", cost_model=COST)
    assert res.diagnose() == []
    over = sim.run(_df(400, 200.0, 100, 50), scheduler="continuous", cost_model=COST,
                   max_batch_size=8)
    assert all(" — " in str(f) for f in over.diagnose())


def test_counts_and_their_words_agree():
    """"1 of 2 requests was rejected", not "1 of 2 requests were" (newcomer review: "1
    requests", "1 replicas"); :func:`sim.checks.plural` gives the word its count."""
    from sim.checks import plural
    assert [plural(n, "request") for n in (0, 1, 2, 1024)] == [
        "0 requests", "1 request", "2 requests", "1,024 requests"]
    assert plural(np.int64(1), "pass", "passes") == "1 pass" and plural(3, "pass",
                                                                       "passes") == "3 passes"
    assert plural(1.0, "token") == "1.0 token" and plural(2.5, "token") == "2.5 tokens"
    df = pd.DataFrame({"arrival_time": [0.0, 1.0], "num_prompt_tokens": [10, 5000],
                       "num_output_tokens": [5, 5]})
    f = next(f for f in sim.run(df, cost_model=COST, kv_blocks=20).diagnose()
             if f.code == "rejected")
    assert f.message.startswith("1 of 2 requests was rejected: it needs ")
    f = next(f for f in sim.run(pd.concat([df] * 2, ignore_index=True).assign(
        arrival_time=[0.0, 1.0, 2.0, 3.0]), cost_model=COST, kv_blocks=20).diagnose()
        if f.code == "rejected")
    assert f.message.startswith("2 of 4 requests were rejected: each needs ")


def test_kv_bound_batch_when_the_pool_not_the_batch_limit_sets_the_batch():
    """(issue 32, item 10) 400 blocks, 1,000-token prompts, max batch 64: ~5 run at once and
    the findings only said "overloaded ... larger batches". The pool is named; with the
    H100's pool the same load is not KV-bound."""
    df = _df(400, 20.0, 1000, 100)
    small = sim.run(df, scheduler="continuous", kv_blocks=400, max_batch_size=64)
    f = next(f for f in small.diagnose() if f.code == "kv_bound_batch")
    assert 4 < f.value * 64 < 7 and "of max_batch_size 64" in f.message
    assert "400 blocks (6,400 tokens)" in f.message and "max_batch_size changes nothing" in \
        f.action
    big = sim.run(df, scheduler="continuous", max_batch_size=64)
    assert "kv_bound_batch" not in _codes(big)


def test_rare_stalls_seen_at_the_longest_gap_not_at_p99():
    """(issue 32, item 10) One 16k-token prompt in twenty under continuous batching stalls
    every decode of its iteration for ~60x the median gap, invisible at P99 (1.7x): the
    longest gap (and P99.9) shows it, and chunked prefill is what to try; under chunked
    prefill there is none."""
    prompts = np.where(np.arange(400) % 20 == 7, 16_000, 300)
    df = _df(400, 4.0, prompts, 200)
    res = sim.run(df, scheduler="continuous")
    s = res.summary()
    assert s["itl_p99"] / s["itl_p50"] < 5 and "decode_stalls" not in _codes(res)
    f = next(f for f in res.diagnose() if f.code == "rare_stalls")
    assert f.value > 20 and "prefills of up to 16," in f.message and "chunked" in f.action
    assert "rare_stalls" not in _codes(sim.run(df, scheduler="chunked"))


def test_a_given_summary_is_read_not_made_again(monkeypatch):
    """The CLI hands its summary (with an SLO) to diagnose: the same findings as made alone,
    and summary() not called again."""
    over = sim.run(_df(400, 200.0, 100, 50), scheduler="continuous", cost_model=COST,
                   max_batch_size=8)
    alone = over.diagnose()
    given = over.summary(slo={"ttft": 0.5})
    monkeypatch.setattr(type(over), "summary", lambda *a, **k: pytest.fail("made again"))
    assert [(f.code, f.message, f.value) for f in over.diagnose(given)] == \
        [(f.code, f.message, f.value) for f in alone] and alone
