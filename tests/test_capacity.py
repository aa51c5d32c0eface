"""Capacity search against queueing theory (M/D/1) and on SLO attainment."""

import numpy as np
import pandas as pd
import pytest

import sim
from sim.tools.capacity import max_rate


def _poisson(n, seed=0, prompt=8, output=1):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"arrival_time": np.cumsum(rng.exponential(1.0, n)),
                         "num_prompt_tokens": prompt, "num_output_tokens": output})


def test_mean_e2e_limit_matches_the_md1_closed_form():
    """Batch 1, one iteration of D seconds per request: an M/D/1 queue. Mean E2E = D + W_q with
    Pollaczek-Khinchine W_q = rho D / (2 (1 - rho)), so the rate whose mean E2E is s is
    rho*/D with rho* = 2 (s - D) / (D + 2 (s - D))."""
    d, s = 0.01, 0.015  # rho* = 0.5
    cfg = sim.SimConfig(scheduler="continuous", cost_model=sim.ConstantCost(d),
                        max_batch_size=1)
    cap = max_rate(_poisson(60_000), {"e2e_mean": s}, config=cfg, tol=0.002)
    rho = 2 * (s - d) / (d + 2 * (s - d))
    assert cap.rate == pytest.approx(rho / d, rel=0.02)
    assert cap.summary["e2e_mean"] <= s
    assert cap.points["passed"].any() and not cap.points["passed"].all()
    # below the answer every point passed, above it every point failed (monotone here)
    pts = cap.points
    assert pts.loc[pts["rate"] <= cap.rate, "passed"].all()
    assert not pts.loc[pts["rate"] > cap.rate, "passed"].any()


def test_attainment_target_and_goodput_per_gpu():
    cfg = sim.SimConfig(scheduler="continuous", cost_model=sim.ConstantCost(0.01),
                        max_batch_size=1, tensor_parallel=2)
    df = _poisson(3000, seed=1)
    strict = max_rate(df, {"e2e": 0.03}, attainment=0.99, config=cfg)
    loose = max_rate(df, {"e2e": 0.03}, attainment=0.5, config=cfg)
    assert 0 < strict.rate < loose.rate < 100  # one server of 100 req/s
    assert strict.summary["slo_attainment"] >= 0.99
    assert strict.num_gpus == 2
    assert strict.goodput_per_gpu == pytest.approx(strict.summary["goodput"] / 2)


@pytest.mark.parametrize("fleet, gpus", [
    (dict(replicas=3), 3), (dict(replicas=2, tensor_parallel=2), 4),
    (dict(disaggregation=sim.Disaggregation(2, 1)), 3)])
def test_goodput_per_gpu_counts_every_gpu_of_a_cluster(fleet, gpus):
    """num_gpus was tensor_parallel alone: a 3-replica cluster's goodput was reported per 1 GPU
    (3x too high); now the run's own count (replicas x TP, or both pools), as its summary's."""
    cfg = sim.SimConfig(scheduler="continuous", cost_model=sim.ConstantCost(0.01),
                        max_batch_size=1, **fleet)
    cap = max_rate(_poisson(300, seed=2), {"e2e": 0.05}, config=cfg, tol=0.05)
    assert cap.num_gpus == gpus == cap.summary["num_gpus"]
    assert cap.goodput_per_gpu == pytest.approx(cap.summary["goodput"] / gpus)
    assert cap.goodput_per_gpu == pytest.approx(cap.summary["goodput_per_gpu"])


def test_a_closed_loop_or_limits_no_rate_breaks_are_clear_errors():
    """A closed loop has no arrival rate to scale (every rate gave the same run: 60 doublings,
    then a RuntimeError); limits that even the whole workload at once meets cannot bracket."""
    import workloads
    cfg = sim.SimConfig(cost_model=sim.ConstantCost(0.01),
                        closed_loop=workloads.ClosedLoop(num_users=2))
    with pytest.raises(ValueError, match=r"^max_rate time-scales an open loop's arrivals; "
                                         r"config.closed_loop=ClosedLoop\(num_users=2"):
        max_rate(_poisson(20), {"ttft": 1.0}, config=cfg)
    with pytest.raises(ValueError, match=r"^every rate tried, up to .* req/s and every "
                                         r"request at once, meets \{'e2e': 1000.0\}: 20 "
                                         r"requests cannot load"):
        max_rate(_poisson(20), {"e2e": 1000.0},
                 config=sim.SimConfig(cost_model=sim.ConstantCost(0.01)))


def test_a_workload_no_rate_loads_is_found_in_a_few_runs_not_sixty(monkeypatch):
    """Where every rate passes, the doublings' limit (every request at once) is run after
    BURST_AFTER passing rates: 7 runs, not the 60 doublings of the same near-burst. Where
    the burst fails, the search goes on doubling and finds the edge (one run more)."""
    import sim.tools.capacity as capacity
    runs = []
    real = capacity.run
    monkeypatch.setattr(capacity, "run", lambda df, cfg: runs.append(len(df)) or real(df, cfg))
    with pytest.raises(ValueError, match="every request at once"):
        max_rate(_poisson(20), {"e2e": 1000.0},
                 config=sim.SimConfig(cost_model=sim.ConstantCost(0.01)))
    assert len(runs) == capacity.BURST_AFTER + 1
    runs.clear()
    cfg = sim.SimConfig(scheduler="continuous", cost_model=sim.ConstantCost(0.01),
                        max_batch_size=1)
    cap = max_rate(_poisson(200), {"e2e_mean": 0.05}, config=cfg, tol=0.05, start=0.5)
    assert 0.5 * 2 ** capacity.BURST_AFTER < cap.rate < 100  # (past the burst check)
    assert len(runs) == len(cap.points) + 1


def test_bad_limits_are_clear_errors():
    df = _poisson(50)
    with pytest.raises(ValueError, match="non-empty dict"):
        max_rate(df, {})
    with pytest.raises(ValueError, match=r"slo\['ttft'\] must be a positive"):
        max_rate(df, {"ttft": -1})
    with pytest.raises(ValueError, match=r"slo\['ttft'\] must be a positive"):
        max_rate(df, {"ttft": True})


def test_a_workload_arriving_at_once_has_no_rate_to_search():
    """All arrivals at one instant: the first trial failed in scale_to_rate, whose message
    told the user to omit a rate they never gave."""
    df = pd.DataFrame({"arrival_time": [0.0] * 10, "num_prompt_tokens": 100,
                       "num_output_tokens": 10})
    with pytest.raises(ValueError, match=r"^max_rate time-scales the workload's arrivals, but "
                                         r"its 10 requests all arrive at 0 s"):
        max_rate(df, {"ttft": 1.0}, config=sim.SimConfig(cost_model=sim.ConstantCost(0.01)))


def test_limits_from_numpy_give_the_same_answer():
    """Limits taken from a table are numpy scalars: they were refused as not positive
    numbers of seconds."""
    cfg = sim.SimConfig(scheduler="continuous", cost_model=sim.ConstantCost(0.01),
                        max_batch_size=1)
    df = _poisson(500, seed=2)
    plain = max_rate(df, {"e2e": 0.03}, config=cfg)
    for limit in (np.float64(0.03), np.float32(0.03)):
        assert max_rate(df, {"e2e": limit}, config=cfg).rate == pytest.approx(plain.rate)
    assert max_rate(df, {"e2e": np.int64(1)}, config=cfg).rate > plain.rate
    with pytest.raises(ValueError, match="attainment"):
        max_rate(df, {"ttft": 1}, attainment=1.5)
    with pytest.raises(ValueError, match="neither per-request SLOs"):
        max_rate(df, {"latency_p99": 1.0}, config=sim.SimConfig(cost_model=sim.ConstantCost(0.01)))


def test_a_limit_no_rate_can_meet_gives_nan_not_a_vanishing_rate():
    cfg = sim.SimConfig(scheduler="continuous", cost_model=sim.ConstantCost(0.01),
                        max_batch_size=1)
    with pytest.warns(UserWarning, match="no rate meets the SLOs, down to .* e2e_mean is "):
        cap = max_rate(_poisson(200), {"e2e_mean": 0.005}, config=cfg)  # below a 10 ms step
    assert cap.rate != cap.rate and not cap.points["passed"].any()
    assert cap.points["rate"].min() >= cap.points["rate"].max() / 2 ** 20


def test_requests_rejected_at_any_rate_that_cap_the_attainment_are_a_clear_error():
    """15 of 100 requests over max_model_len (and 5 more than the KV pool holds) fail at every
    rate: an attainment of 0.9 was searched for over 21 rates, then 'no rate tried meets'."""
    df = _poisson(100).assign(num_prompt_tokens=[8] * 80 + [200] * 15 + [90] * 5)
    cfg = sim.SimConfig(scheduler="continuous", cost_model=sim.ConstantCost(0.01),
                        max_model_len=100, kv_blocks=5, block_size=16, max_batch_size=1)
    with pytest.raises(ValueError, match=r"20 of 100 requests are rejected at any rate \(15 over "
                       r"max_model_len, 5 larger than the KV pool\) .* at most 80\.0%, below "
                       r"the 90\.0% asked"):
        max_rate(df, {"ttft": 0.2}, attainment=0.9, config=cfg)
    cap = max_rate(df, {"ttft": 0.2}, attainment=0.8, config=cfg)  # reachable: searched
    assert cap.rate > 0 and cap.summary["slo_attainment"] >= 0.8
    assert max_rate(df, {"e2e_mean": 0.2}, config=cfg).rate > 0  # a summary limit: no cap
    # tensorrt-llm without chunked context: prompts over max_num_tokens, said as such
    trt = sim.SimConfig(scheduler="tensorrt-llm", cost_model=sim.ConstantCost(0.01),
                        token_budget=100, kv_blocks=50)
    with pytest.raises(ValueError, match=r"15 of 100 requests are rejected at any rate \(15 "
                       r"over max_num_tokens\) .* at most 85\.0%"):
        max_rate(df.assign(num_prompt_tokens=[8] * 85 + [200] * 15), {"ttft": 0.2},
                 attainment=0.9, config=trt)


def test_max_rate_says_why_no_rate_meets_the_slo():
    """(issue 32, item 9) sim.max_rate returned rate=nan silently for an SLO no rate meets: it
    warns and its reason names the limit that fails with each request nearly alone (its
    attainment there and the metric's median), not the ones that hold."""
    cfg = sim.SimConfig(scheduler="continuous", cost_model=sim.ConstantCost(0.01),
                        max_batch_size=1)
    with pytest.warns(UserWarning) as seen:
        cap = max_rate(_poisson(200), {"ttft": 0.005, "e2e": 100.0}, config=cfg)
    assert cap.rate != cap.rate and str(seen[0].message) == cap.reason
    assert "ttft <= 0.005 s holds for 0.0% of requests (P50 ttft 0.01 s)" in cap.reason
    assert "e2e" not in cap.reason and "the 90.0% asked is out of reach" in cap.reason
    assert max_rate(_poisson(200), {"ttft": 1.0}, config=cfg).reason == ""
