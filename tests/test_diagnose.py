"""Each troubleshooting finding: a scenario that triggers it and one that does not."""

import numpy as np
import pandas as pd

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


def test_rejected_requests_are_a_finding():
    df = _df(50, 2.0, 100, 50)
    assert "rejected" in _codes(sim.run(df, cost_model=COST, kv_blocks=2))
    assert "rejected" not in _codes(sim.run(df, cost_model=COST))


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


def test_kv_pool_too_small_when_preemptions_recompute_prefill():
    df = workloads.load("azure-conv", n=600, rate=10.0)
    tight = sim.run(df, scheduler="vllm", model="llama-3.1-8b", gpu="h100", kv_blocks=300,
                    prefix_caching=False)
    roomy = sim.run(df, scheduler="vllm", model="llama-3.1-8b", gpu="h100",
                    prefix_caching=False)
    assert "kv_pool_too_small" in _codes(tight) and "kv_pool_too_small" not in _codes(roomy)


def test_no_prefix_hits_when_the_shared_prompt_differs(unshared):
    same = workloads.shared_prefix(60, n_groups=1, system_prompt_tokens=512, user_tokens=32,
                                   output=4, rate=2.0, seed=3)
    shifted = unshared(same)
    kw = dict(scheduler="vllm", cost_model=COST)
    assert "no_prefix_hits" in _codes(sim.run(shifted, **kw))
    assert "no_prefix_hits" not in _codes(sim.run(same, **kw))
    assert "no_prefix_hits" not in _codes(sim.run(shifted, scheduler="continuous",
                                                  cost_model=COST))  # caching off: no finding


def test_a_healthy_run_has_no_findings_and_findings_read_as_text():
    res = sim.run(_df(300, 2.0, 100, 50), scheduler="chunked", cost_model=COST)
    assert res.diagnose() == []
    over = sim.run(_df(400, 200.0, 100, 50), scheduler="continuous", cost_model=COST,
                   max_batch_size=8)
    assert all(" — " in str(f) for f in over.diagnose())
