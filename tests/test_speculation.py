"""Speculative decoding in the engine: closed forms of the acceptance process, the draft's cost
(speedup against the cheat sheet's formula), KV lookahead slots, invariants under random
inputs (nothing lost, the pool exact every iteration, every token emitted once)."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import sim
from sim import SpeculativeConfig, speculative_speedup
from sim.costs.roofline import RooflineCost
from sim.costs.simple import ConstantCost, LinearCost
from sim.engine import run
from sim.engine.core.batch import make_batch
from sim.engine.core.request import DECODE, PREFILL
from sim.engine.speculation.acceptance import emission_draws
from sim.engine.speculation.draft_cost import DraftCost

from test_invariants import prefill_tokens


def _one(n_out, prompt=100, arrival=0.0):
    return pd.DataFrame({"arrival_time": [arrival], "num_prompt_tokens": [prompt],
                         "num_output_tokens": [n_out]})


def _closed_e(a, k):
    return (1 - a ** (k + 1)) / (1 - a)


@pytest.mark.parametrize("alpha", [0.5, 0.8, 0.95])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_one_long_request_iterations_and_acceptance_match_closed_forms(alpha, k):
    n = 20_000
    spec = SpeculativeConfig(num_speculative_tokens=k, acceptance_rate=alpha, method="ngram")
    res = run(_one(n), scheduler="continuous", cost_model=ConstantCost(0.01), speculative=spec,
              kv_blocks=2000)
    s = res.summary()
    decode_iterations = s["num_iterations"] - 1  # the first iteration is the prefill
    assert decode_iterations == pytest.approx((n - 1) / _closed_e(alpha, k), rel=0.02)
    assert s["spec_acceptance_rate"] == pytest.approx(
        alpha * (1 - alpha ** k) / ((1 - alpha) * k), rel=0.02)
    assert s["spec_mean_acceptance_length"] == pytest.approx(_closed_e(alpha, k), rel=0.02)
    r = res.requests.iloc[0]
    assert r.spec_steps == decode_iterations and r.spec_drafted == k * decode_iterations
    # every token emitted once; accepted counts as vLLM's (the last verification's accepted
    # drafts beyond the end included, at most k)
    assert n <= 1 + r.spec_steps + r.spec_accepted <= n + k
    # ITL is the gap between emissions: one per verification
    assert len(res.itl()) == decode_iterations
    assert res.itl().sum() == pytest.approx(r.e2e - r.ttft)
    assert r.tpot == pytest.approx((r.e2e - r.ttft) / (n - 1))


def test_empirical_acceptance_lengths():
    p = [0.1, 0.2, 0.3, 0.4]  # exactly j accepted
    spec = SpeculativeConfig(num_speculative_tokens=3, acceptance_lengths=p, method="ngram")
    s = run(_one(30_000), scheduler="continuous", cost_model=ConstantCost(0.01),
            speculative=spec, kv_blocks=3000).summary()
    mean_accepted = float(np.dot(np.arange(4), p))
    assert s["spec_mean_acceptance_length"] == pytest.approx(1 + mean_accepted, rel=0.02)
    assert s["spec_acceptance_rate"] == pytest.approx(mean_accepted / 3, rel=0.02)


def test_emission_draws_sum_range_and_seed():
    spec = SpeculativeConfig(num_speculative_tokens=4, acceptance_rate=0.7, method="ngram")
    for n in (1, 2, 5, 17, 1000):
        e = emission_draws(spec, np.random.default_rng(3), n)
        assert e.sum() == n and e.min() >= 1 and e.max() <= 5 and e.dtype == np.int64
    a = emission_draws(spec, np.random.default_rng(3), 500)
    b = emission_draws(spec, np.random.default_rng(3), 500)
    assert np.array_equal(a, b)
    assert np.all(emission_draws(spec, np.random.default_rng(0), 50, alpha=0.0) == 1)
    full = emission_draws(spec, np.random.default_rng(0), 52, alpha=1.0)
    assert full.tolist() == [5] * 10 + [2]


@pytest.mark.parametrize("alpha,k,c", [(0.8, 3, 0.05), (0.9, 5, 0.1), (0.6, 2, 0.2),
                                       (0.3, 4, 0.5)])
def test_batch_one_speedup_matches_the_cheat_sheet_formula(alpha, k, c):
    n = 20_000
    base = run(_one(n), scheduler="continuous", cost_model=ConstantCost(0.01),
               kv_blocks=2000).requests.iloc[0]
    spec = SpeculativeConfig(num_speculative_tokens=k, acceptance_rate=alpha,
                             draft_cost_ratio=c)
    fast = run(_one(n), scheduler="continuous", cost_model=ConstantCost(0.01),
               speculative=spec, kv_blocks=2000).requests.iloc[0]
    speedup = (base.e2e - base.ttft) / (fast.e2e - fast.ttft)
    assert speedup == pytest.approx(speculative_speedup(alpha, k, c), rel=0.03)
    if speculative_speedup(alpha, k, c) < 1:  # low acceptance, costly draft: slower
        assert fast.e2e > base.e2e


def test_gain_shrinks_at_high_load_compute_bound_verification():
    def speedup(n_req, rate):
        rng = np.random.default_rng(1)
        df = pd.DataFrame({"arrival_time": np.sort(rng.uniform(0, n_req / rate, n_req)),
                           "num_prompt_tokens": 512, "num_output_tokens": 128})
        spec = SpeculativeConfig(num_speculative_tokens=4, acceptance_rate=0.8,
                                 draft_cost_ratio=0.05)
        pool = dict(kv_blocks=1800)  # ~45 running at once: still a gain (at the H100's 28,343
        # blocks, 256 run at once and verifying 5 tokens each is compute-bound: a loss)
        off = run(df, scheduler="continuous", **pool).summary()["tpot_mean"]
        on = run(df, scheduler="continuous", speculative=spec, **pool).summary()["tpot_mean"]
        return off / on
    alone, loaded = speedup(1, 1.0), speedup(600, 1000.0)
    assert alone > 2.0
    assert 1.0 < loaded < 0.8 * alone


def test_per_request_acceptance_rate_column_overrides_the_run():
    df = pd.DataFrame({"arrival_time": [0.0, 0.0], "num_prompt_tokens": [50, 50],
                       "num_output_tokens": [8000, 8000], "acceptance_rate": [0.95, 0.2]})
    spec = SpeculativeConfig(num_speculative_tokens=1, acceptance_rate=0.5, method="ngram")
    req = run(df, scheduler="continuous", cost_model=ConstantCost(0.01), speculative=spec,
              kv_blocks=2000).requests
    rates = req["spec_accepted"] / req["spec_drafted"]
    assert rates.tolist() == pytest.approx([0.95, 0.2], abs=0.02)
    bad = df.assign(acceptance_rate=[0.5, 1.5])
    with pytest.raises(ValueError, match=r"acceptance_rate: row 1 has 1\.5"):
        run(bad, speculative=spec)


def test_config_errors_name_the_setting():
    with pytest.raises(ValueError, match="draft_model .* or draft_cost_ratio"):
        SpeculativeConfig(num_speculative_tokens=3)  # no silent free draft
    with pytest.raises(ValueError, match="both given: give one"):
        SpeculativeConfig(draft_model="llama-3.2-1b", draft_cost_ratio=0.1)
    with pytest.raises(TypeError, match="num_speculative_tokens must be an integer"):
        SpeculativeConfig(num_speculative_tokens=True, method="ngram")
    with pytest.raises(ValueError, match="at most 64"):
        SpeculativeConfig(num_speculative_tokens=100, method="ngram")
    assert SpeculativeConfig(num_speculative_tokens=2.0, method="ngram").num_speculative_tokens \
        == 2 and isinstance(SpeculativeConfig(2.0, method="ngram").num_speculative_tokens, int)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        SpeculativeConfig(num_speculative_tokens=3, acceptance_lengths=[1.2, -0.2, 0, 0],
                          method="ngram")
    with pytest.raises(TypeError, match="acceptance_lengths must be a list"):
        SpeculativeConfig(num_speculative_tokens=3, acceptance_lengths="0.25,0.25,0.25,0.25",
                          method="ngram")
    with pytest.raises(ValueError, match="draft_model 'tinyllama'"):
        SpeculativeConfig(draft_model="tinyllama")
    with pytest.raises(ValueError, match="ngram"):
        SpeculativeConfig(method="ngram", draft_cost_ratio=0.1)
    with pytest.raises(ValueError, match="method"):
        SpeculativeConfig(method="medusa", draft_cost_ratio=0.1)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig(num_speculative_tokens=0, method="ngram")
    with pytest.raises(ValueError, match="acceptance_rate"):
        SpeculativeConfig(acceptance_rate=1.2, method="ngram")
    with pytest.raises(ValueError, match="k \\+ 1 = 3"):
        SpeculativeConfig(num_speculative_tokens=2, acceptance_lengths=[0.5, 0.5],
                          method="ngram")
    with pytest.raises(ValueError, match="must sum to 1"):
        SpeculativeConfig(num_speculative_tokens=1, acceptance_lengths=[0.5, 0.6],
                          method="ngram")
    with pytest.raises(ValueError, match="not both"):
        SpeculativeConfig(acceptance_rate=0.5, acceptance_lengths=[0.5, 0.5] + [0] * 4,
                          method="ngram")
    with pytest.raises(ValueError, match="draft_model 'nosuchmodel'"):
        SpeculativeConfig(draft_model="nosuchmodel")
    with pytest.raises(TypeError, match="SpeculativeConfig"):
        sim.SimConfig(speculative={"num_speculative_tokens": 3})


def test_same_seed_same_result_other_seed_other_draws():
    df = pd.DataFrame({"arrival_time": np.arange(40) * 0.05, "num_prompt_tokens": 64,
                       "num_output_tokens": 200})
    spec = SpeculativeConfig(num_speculative_tokens=3, acceptance_rate=0.7,
                             draft_cost_ratio=0.1)
    a = run(df, speculative=spec, seed=5, kv_blocks=200)
    b = run(df, speculative=spec, seed=5, kv_blocks=200)
    c = run(df, speculative=spec, seed=6, kv_blocks=200)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.iterations, b.iterations)
    assert not a.requests["spec_accepted"].equals(c.requests["spec_accepted"])


def test_lookahead_slots_reject_a_request_that_only_fits_without_them():
    df = _one(20, prompt=44)  # 64 tokens: 4 blocks of 16; + 3 lookahead slots: 5 blocks
    spec = SpeculativeConfig(num_speculative_tokens=3, acceptance_rate=0.5, method="ngram")
    assert run(df, kv_blocks=4, block_size=16).requests.status[0] == "finished"
    r = run(df, kv_blocks=4, block_size=16, speculative=spec).requests.iloc[0]
    assert r.status == "rejected" and "lookahead" in r.reason


def test_draft_cost_prices_k_draft_steps_and_the_draft_prefill():
    target = RooflineCost("llama-3.1-8b", "h100")
    draft = RooflineCost("llama-3.2-1b", "h100")
    k = 4
    spec_batch = make_batch(7, ((128, 0),), 128, 3, 3 * (100 + k + 1), num_spec_tokens=k)
    plain = make_batch(7, (), 0, 3, 3 * 101)
    prefill = make_batch(7, ((128, 0),), 128, 0, 0)
    got = DraftCost(target, k, draft=draft)(spec_batch)
    # the draft's steps without its per-iteration CPU costs (scheduled and sampled once)
    assert got == pytest.approx(target(spec_batch) + k * (draft(plain) - draft.fixed_time(
        3, graphed=True)) + draft(prefill) - draft.fixed_time(1, graphed=True))
    assert 0 < DraftCost(target, k, draft=draft).cost_ratio() < 0.5
    assert DraftCost(target, k, ratio=0.1)(spec_batch) == pytest.approx(
        target(spec_batch) + k * 0.1 * target(plain))
    # the verification of k + 1 tokens per decode costs more than one token per decode
    assert target(spec_batch) > target(make_batch(7, ((128, 0),), 128, 3, 3 * 105))
    assert LinearCost(per_decode_token=1.0)(spec_batch) == 3 * (k + 1)
    cfg = sim.SimConfig(speculative=SpeculativeConfig(draft_model="llama-3.2-1b"))
    assert "llama-3.2-1b" in repr(cfg.resolved_cost_model())
    ngram = sim.SimConfig(speculative=SpeculativeConfig(method="ngram"))
    assert isinstance(ngram.resolved_cost_model(), RooflineCost)


class Checked:
    """Wraps a policy; after each schedule checks the KV pool against the blocks every running
    request must hold (decodes: their context slots, lookahead included) and the tokens each
    decode has emitted against its context."""

    def __init__(self, policy, k):
        self.policy, self.k = policy, k
        self.name = getattr(policy, "name", "checked")
        self.replica = None

    def __getattr__(self, name):  # engine defaults, knobs
        return getattr(self.policy, name)

    def schedule(self, replica, now):
        self.replica = replica
        self.policy.schedule(replica, now)
        batch = replica.batch(detail=True)
        bs = replica.block_size
        in_batch = {rid: new for (new, _), rid in zip(batch.prefills, batch.prefill_ids)}
        lengths = dict(zip(batch.decode_ids, batch.decode_lengths.tolist()))
        held = 0
        for r in replica.running.values():
            if r.status == DECODE:
                slots = lengths[r.index]
                assert slots == (r.decode_base_tokens + self.k + 1
                                 + replica.num_generated(r) - r.decode_base_generated)
                held += -(-slots // bs)
            else:
                assert r.status == PREFILL
                held += -(-(r.num_computed + in_batch.get(r.index, 0)) // bs)
        pool = replica.blocks
        assert 0 <= pool.num_free <= pool.num_blocks
        if not replica.caching:
            assert held == pool.num_used
        assert held == sum(replica.held_blocks(r) for r in replica.running.values())
        assert batch.decode_context_tokens == sum(lengths.values())
        assert batch.num_spec_tokens == self.k


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.floats(0, 3), st.integers(1, 90), st.integers(1, 60)),
                min_size=1, max_size=25),
       st.sampled_from(["static", "continuous", "chunked", "vllm", "sarathi", "orca"]),
       st.integers(6, 40), st.sampled_from([1, 4, 16]), st.integers(1, 5),
       st.floats(0, 1), st.integers(0, 3))
def test_nothing_lost_pool_exact_every_token_once(rows, sched, kv_blocks, block_size, k, alpha,
                                                   seed):
    rows.sort()
    df = pd.DataFrame(rows, columns=["arrival_time", "num_prompt_tokens", "num_output_tokens"])
    spec = SpeculativeConfig(num_speculative_tokens=k, acceptance_rate=alpha,
                             draft_cost_ratio=0.1)
    kw = {"chunk_size": 16} if sched == "chunked" else {}
    checked = Checked(sim.SimConfig(scheduler=sched, max_batch_size=6, **kw).policy(), k)
    res = run(df, scheduler=checked, cost_model=LinearCost(0.01, 0.001, 0.002),
              kv_blocks=kv_blocks, block_size=block_size, max_batch_size=6, speculative=spec,
              seed=seed)
    req = res.requests
    assert len(req) == len(df) and set(req["status"]) <= {"finished", "rejected"}
    too_big = -(-(df.num_prompt_tokens + df.num_output_tokens + k) // block_size) > kv_blocks
    assert (req["status"] == "rejected").tolist() == too_big.tolist()
    assert (res.iterations["kv_blocks_used"] <= kv_blocks).all()
    fin = req[req.status == "finished"]
    if checked.replica is not None:
        for r in checked.replica.finished:
            if r.status == 3:  # FINISHED: prefill completions + verifications' tokens = n
                assert prefill_tokens(r) + r.spec_steps + r.spec_accepted == r.num_output_tokens
    assert res.itl().sum() == pytest.approx(float((fin.e2e - fin.ttft).sum()), abs=1e-9)
    assert (fin.spec_accepted <= fin.spec_drafted).all()
    assert req["num_preemptions"].sum() == res.iterations["num_preemptions"].sum()


def test_cli_flags_and_toml_table(tmp_path, capsys):
    from sim.cli import main
    import json
    out = tmp_path / "o"
    assert main(["run", "-n", "60", "--spec-tokens", "3", "--acceptance-rate", "0.7",
                 "--draft-cost-ratio", "0.05", "--no-plots", "-o", str(out)]) == 0
    assert "tokens per verification" in capsys.readouterr().out
    doc = json.loads((out / "summary.json").read_text())
    assert doc["settings"]["speculative"] == {"num_speculative_tokens": 3,
                                              "acceptance_rate": 0.7, "draft_cost_ratio": 0.05}
    assert 0 < doc["summary"]["spec_acceptance_rate"] < 1
    toml = tmp_path / "s.toml"
    toml.write_text('[speculative]\nnum_speculative_tokens = 2\nmethod = "ngram"\n'
                    'acceptance_rate = 1.5\n')
    assert main(["run", str(toml), "-n", "5", "-o", str(out)]) == 2
    assert f"{toml}: speculative.acceptance_rate must be at most 1" in capsys.readouterr().err
    toml.write_text('[speculative]\nnum_speculative_tokens = 2\nacceptance_rat = 0.5\n')
    assert main(["run", str(toml), "-n", "5", "-o", str(out)]) == 2
    assert "did you mean 'acceptance_rate'" in capsys.readouterr().err
    assert main(["run", "-n", "5", "--spec-tokens", "2", "-o", str(out)]) == 2
    assert "give --draft-model (a preset name or ModelConfig) or --draft-cost-ratio, or " \
           "--spec-method ngram" in capsys.readouterr().err
    assert main(["run", "-n", "5", "--acceptance-rate", "0.5", "-o", str(out)]) == 2
    assert "--spec-tokens K" in capsys.readouterr().err


def test_diagnose_says_when_speculation_got_slower():
    df = _one(3000)
    slow = SpeculativeConfig(num_speculative_tokens=5, acceptance_rate=0.3, draft_cost_ratio=0.3)
    fast = SpeculativeConfig(num_speculative_tokens=3, acceptance_rate=0.8, draft_cost_ratio=0.05)
    found = {f.code: f for f in run(df, speculative=slow).diagnose()}
    assert "speculation_slower" in found
    assert found["speculation_slower"].value == pytest.approx(speculative_speedup(0.3, 5, 0.3),
                                                              rel=0.05)
    assert "measure the acceptance rate first" in found["speculation_slower"].action
    assert "speculation_slower" not in {f.code for f in run(df, speculative=fast).diagnose()}
    # a draft model: its cost ratio comes from the two rooflines (here as big as the target)
    big_draft = SpeculativeConfig(num_speculative_tokens=5, acceptance_rate=0.3,
                                  draft_model="llama-3.1-8b")
    assert "speculation_slower" in {f.code for f in run(df, speculative=big_draft).diagnose()}


def test_long_runs_wrap_and_grow_the_rings_with_preemptions_exact():
    """Outputs far longer than the ring (1,024 iterations) and a pool tight enough to preempt:
    the checked pool and context stay exact through wrap-around, growth and take-backs."""
    df = pd.DataFrame({"arrival_time": [0.0, 0.5, 1.0, 1.5],
                       "num_prompt_tokens": [300, 40, 900, 64],
                       "num_output_tokens": [4000, 2500, 6000, 3000]})
    k = 3
    spec = SpeculativeConfig(num_speculative_tokens=k, acceptance_rate=0.6, method="ngram")
    checked = Checked(sim.SimConfig(scheduler="continuous").policy(), k)
    res = run(df, scheduler=checked, cost_model=ConstantCost(0.001), kv_blocks=450,
              block_size=16, speculative=spec)
    assert (res.requests.status == "finished").all()
    assert res.requests.num_preemptions.sum() > 0
    for r in checked.replica.finished:
        assert prefill_tokens(r) + r.spec_steps + r.spec_accepted == r.num_output_tokens


def test_a_draft_model_shares_the_gpu_memory():
    from sim import get_gpu, kv_cache_bytes, memory_budget
    plain = sim.SimConfig(model="llama-3.1-8b")
    drafted = sim.SimConfig(model="llama-3.1-8b",
                            speculative=SpeculativeConfig(draft_model="llama-3.2-1b"))
    draft_gb = sim.get_model("llama-3.2-1b").total_params() * 2 / 1e9
    b = memory_budget("llama-3.1-8b", get_gpu("h100").memory_gb, overhead_gb=draft_gb)
    per_block = b.kv_block_bytes_per_gpu + kv_cache_bytes(16, model="llama-3.2-1b")
    assert drafted.resolved_kv_blocks() == int(b.kv_bytes_per_gpu // per_block)
    assert drafted.resolved_kv_blocks() < 0.85 * plain.resolved_kv_blocks()
    ratio = SpeculativeConfig(draft_cost_ratio=0.1)  # no draft model: the pool is unchanged
    assert sim.SimConfig(model="llama-3.1-8b", speculative=ratio).resolved_kv_blocks() == \
        plain.resolved_kv_blocks()


def test_speculation_in_clusters_and_disaggregated_pools():
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"arrival_time": np.sort(rng.uniform(0, 4, 60)),
                       "num_prompt_tokens": rng.integers(50, 600, 60),
                       "num_output_tokens": rng.integers(1, 200, 60)})
    spec = SpeculativeConfig(num_speculative_tokens=3, acceptance_rate=0.7,
                             draft_cost_ratio=0.05)
    one = run(df, speculative=spec, kv_blocks=400)
    # a 3-replica cluster routing everything to replica 0: the single replica's run exactly
    all_to_0 = run(df, speculative=spec, kv_blocks=400, replicas=3,
                   router=lambda r, replicas, now: 0)
    cols = [c for c in one.requests.columns if c in all_to_0.requests.columns]
    pd.testing.assert_frame_equal(one.requests[cols], all_to_0.requests[cols])
    fleet = run(df, speculative=spec, kv_blocks=400, replicas=3)
    assert (fleet.requests.status == "finished").all()
    assert 0 < fleet.summary()["spec_acceptance_rate"] < 1
    # disaggregated: the decode pool speculates; the KV sent is at the run's kv_dtype
    d = sim.Disaggregation(prefill_replicas=1, decode_replicas=2, link_bandwidth_gbps=1.0)
    fp16 = run(df, speculative=spec, disaggregation=d)
    fp8 = run(df, speculative=spec, disaggregation=d, kv_dtype="fp8")
    assert (fp16.requests.status == "finished").all() and (fp8.requests.status == "finished").all()
    assert fp16.summary()["spec_mean_acceptance_length"] > 1.5
    assert fp8.requests.kv_transfer_time.median() < 0.6 * fp16.requests.kv_transfer_time.median()


def test_diagnose_with_a_calibrated_target_and_a_draft_model():
    from sim.costs.calibrated import CalibratedCost, shipped_cpu_profile
    cost = CalibratedCost.from_file(shipped_cpu_profile())
    spec = SpeculativeConfig(num_speculative_tokens=3, acceptance_rate=0.7,
                             draft_model="llama-3.2-1b")
    res = run(_one(200, prompt=64), cost_model=cost, speculative=spec, kv_blocks=200)
    assert isinstance(res.diagnose(), list)  # prices the draft against the profile or skips


def test_per_request_rate_overrides_acceptance_lengths_and_overshoot_counts_as_vllm():
    df = pd.DataFrame({"arrival_time": [0.0, 0.0], "num_prompt_tokens": [50, 50],
                       "num_output_tokens": [6000, 6000], "acceptance_rate": [0.0, None]})
    spec = SpeculativeConfig(num_speculative_tokens=3, acceptance_lengths=[0.25] * 4,
                             method="ngram")
    req = run(df, scheduler="continuous", cost_model=ConstantCost(0.01), speculative=spec,
              kv_blocks=2000).requests
    assert req.spec_accepted[0] == 0  # its own rate 0: nothing accepted
    assert req.spec_accepted[1] / req.spec_drafted[1] == pytest.approx(0.5, abs=0.03)
    one = SpeculativeConfig(num_speculative_tokens=4, acceptance_rate=1.0, method="ngram")
    s = run(_one(11), cost_model=ConstantCost(0.01), speculative=one).summary()
    assert s["spec_acceptance_rate"] == 1.0  # 2 verifications of 5; the last cut to 0 + 5


def test_a_draft_must_share_the_target_vocabulary():
    with pytest.raises(ValueError, match="tokenizer"):
        sim.SimConfig(model="llama-3.1-8b",
                      speculative=SpeculativeConfig(draft_model="tinyllama-1.1b"))
    ok = sim.SimConfig(model="llama-2-7b",
                       speculative=SpeculativeConfig(draft_model="tinyllama-1.1b"))
    assert ok.speculative.draft_model == "tinyllama-1.1b"  # Llama-2's tokenizer: a real pair


def test_a_draft_cost_is_declared_pure_only_over_pure_parts_and_not_in_a_repricing_subclass():
    """``DraftCost`` declares ``pure_decode_cost`` (so the engine may fast-forward) only when
    its target and draft do, and not in a subclass that overrides ``__call__``."""
    from sim.costs.roofline import RooflineCost
    from sim.engine.core.batch import decode_pricer
    from sim.engine.speculation.draft_cost import DraftCost

    class Noisy:
        def __call__(self, batch):
            return 0.01

    class Scaled(DraftCost):
        def __call__(self, batch):
            return 2 * super().__call__(batch)
    target = RooflineCost("llama-3.1-8b", "h100")
    assert decode_pricer(DraftCost(target, 4, ratio=0.05)) is not None
    assert decode_pricer(DraftCost(target, 4, draft=RooflineCost("llama-3.2-1b", "h100")))
    assert decode_pricer(DraftCost(Noisy(), 4, ratio=0.05)) is None
    assert decode_pricer(DraftCost(target, 4, draft=Noisy())) is None
    assert decode_pricer(Scaled(target, 4, ratio=0.05)) is None
