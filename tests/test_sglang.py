"""The SGLang preset, rule by rule (sim/engine/presets/sglang.py), and the decode clock it needs:
prefill-only iterations pause the decodes, and every token is still timed exactly."""

import numpy as np
import pandas as pd
import pytest

import sim
from sim.costs.simple import ConstantCost, LinearCost
from sim.engine import run
from sim.engine.presets.sglang import (INIT_NEW_TOKEN_RATIO, MIN_NEW_TOKEN_RATIO, SGLang,
                               chunked_prefill_size)


def _df(rows):
    return pd.DataFrame(rows, columns=["arrival_time", "num_prompt_tokens", "num_output_tokens"])


class Trace:
    """Wraps the policy: per iteration, which requests prefill and which decode."""

    name = "sglang"
    pauses_decodes = True
    quiet_when_decoding = False  # it records every iteration: no fast-forward past any

    def __init__(self, policy):
        self.policy, self.steps = policy, []

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def schedule(self, replica, now):
        self.policy.schedule(replica, now)
        b = replica.batch(detail=True)
        self.steps.append((b.prefill_ids, b.decode_ids, b.prefills))


def test_prefill_batches_run_alone_and_the_decodes_wait():
    df = _df([(0.0, 64, 30), (0.05, 64, 5), (0.1, 2000, 3)])
    trace = Trace(SGLang(512))
    res = run(df, scheduler=trace, cost_model=ConstantCost(0.01), kv_blocks=4000)
    assert (res.requests.status == "finished").all()
    for prefill_ids, decode_ids, _ in trace.steps:
        assert not (prefill_ids and decode_ids)  # never mixed (rule 1)
    it = res.iterations
    assert ((it.num_prefill_tokens > 0) & (it.num_decode_tokens > 0)).sum() == 0
    # request 0 decodes; request 1 and 2's prefills interrupt it: its gaps span them
    r0 = res.requests.iloc[0]
    assert r0.max_itl == pytest.approx(0.02) or r0.max_itl > 0.015
    fin = res.requests
    assert res.itl().sum() == pytest.approx(float((fin.e2e - fin.ttft).sum()))
    assert len(res.itl()) == int((fin.num_output_tokens - 1).sum())


def test_every_token_once_against_a_per_step_trace():
    rng = np.random.default_rng(3)
    n = 40
    df = _df(list(zip(np.sort(rng.uniform(0, 2, n)), rng.integers(1, 900, n),
                      rng.integers(1, 60, n))))
    trace = Trace(SGLang(256))
    res = run(df, scheduler=trace, cost_model=LinearCost(0.002, 1e-5, 1e-4), kv_blocks=3000,
              block_size=1)
    end = (res.iterations.start + res.iterations.duration).to_numpy()
    times = {}
    for k, (_, decode_ids, _) in enumerate(trace.steps):
        for idx in decode_ids:
            times.setdefault(idx, []).append(end[k])
    req = res.requests
    itls = []
    for i, r in req.iterrows():
        t = [r.first_token_time] + times.get(i, [])  # the prefill's token, then each decode
        assert len(t) == r.num_output_tokens and t[-1] == pytest.approx(r.finish_time)
        itls += list(np.diff(t))
    np.testing.assert_allclose(np.sort(res.itl()), np.sort(itls), rtol=1e-12, atol=1e-12)


def test_one_chunked_request_at_a_time():
    df = _df([(0.0, 1000, 2), (0.0, 1000, 2)])
    trace = Trace(SGLang(512))
    run(df, scheduler=trace, cost_model=ConstantCost(0.01), kv_blocks=5000)
    prefills = [p for _, _, p in trace.steps if p]
    assert prefills[0] == ((512, 0),)  # r0 chunked to the budget, nobody else
    assert prefills[1] == ((488, 512), (24, 0))  # r0 completes, r1 takes what is left
    assert prefills[2] == ((512, 24),)  # r1 continues alone


def test_new_token_ratio_decays_per_decode_step_to_its_floor():
    policy = SGLang(512)
    run(_df([(0.0, 10, 200)]), scheduler=policy, cost_model=ConstantCost(0.01), kv_blocks=500)
    decay = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
    assert policy.new_token_ratio == pytest.approx(INIT_NEW_TOKEN_RATIO - 199 * decay)
    policy = SGLang(512)
    run(_df([(0.0, 10, 900)]), scheduler=policy, cost_model=ConstantCost(0.01), kv_blocks=1000)
    assert policy.new_token_ratio == MIN_NEW_TOKEN_RATIO


def test_reservation_for_running_outputs_delays_admission():
    # 1,000 token slots; r0 will write 800 more tokens: 0.7 x 800 are reserved for it, so r1
    # (300 + 100) waits although its prompt's slots are free; vLLM's rules admit it at once
    df = _df([(0.0, 100, 801), (0.5, 300, 100)])
    kw = dict(cost_model=ConstantCost(0.01), kv_blocks=1000, block_size=1)
    sg = run(df, scheduler="sglang", **kw).requests
    vl = run(df, scheduler="vllm", max_batch_size=16, chunk_size=512, **kw).requests
    assert vl.queueing_delay[1] < 0.02
    assert sg.queueing_delay[1] > 0.5
    assert (sg.status == "finished").all()


def test_retraction_takes_the_fewest_outputs_and_raises_the_ratio():
    # after 600 decode steps the ratio reserves only 0.1 x r0's remaining 880 tokens, so r1
    # (10 + 700) is admitted; both cannot finish in 1,500 slots: a decode step runs short and
    # SGLang retracts r1 (fewer output tokens), raising new_token_ratio again
    class Watch(SGLang):
        ratios = []

        def schedule(self, replica, now):
            super().schedule(replica, now)
            self.ratios.append(self.new_token_ratio)

    policy = Watch(512)
    df = _df([(0.0, 10, 1480), (6.0, 10, 700)])
    req = run(df, scheduler=policy, cost_model=ConstantCost(0.01), kv_blocks=1500,
              block_size=1).requests
    assert (req.status == "finished").all()
    assert req.num_preemptions[1] >= 1 and req.num_preemptions[0] == 0
    jumps = np.flatnonzero(np.diff(policy.ratios) > 0.05)
    assert len(jumps) >= 1 and policy.ratios[jumps[0] + 1] > 0.5  # retraction raised it


def test_defaults():
    cfg = sim.SimConfig(scheduler="sglang", gpu="h100").resolved()
    assert (cfg.block_size, cfg.chunk_size, cfg.max_batch_size) == (1, 8192, 1024)
    assert cfg.prefix_caching == "radix" and cfg.token_budget == 16384
    assert chunked_prefill_size(sim.SimConfig(gpu="l40s")) == 4096
    # ServerArgs._handle_gpu_memory_settings: 8,192 up to 160 GiB (H200), 16,384 above (B200)
    assert chunked_prefill_size(sim.SimConfig(gpu="h200")) == 8192
    assert chunked_prefill_size(sim.SimConfig(gpu="b200")) == 16384
    # the pool from SGLang's accounting: mem_fraction_static x device - weights, page size 1
    from sim.specs.gpus import get_gpu
    from sim.specs.memory import memory_budget
    want = memory_budget("llama-3.1-8b", get_gpu("h100").memory_gb, accounting="sglang",
                         block_size=1)
    got = sim.SimConfig(scheduler="sglang", model="llama-3.1-8b", gpu="h100")
    assert got.resolved_kv_blocks() == want.kv_blocks != sim.SimConfig(
        scheduler="vllm", model="llama-3.1-8b", gpu="h100", block_size=1).resolved_kv_blocks()


def test_cli_runs_the_preset(tmp_path, capsys):
    from sim.cli import main
    assert main(["run", "-s", "sglang", "-n", "200", "--no-plots", "-q",
                 "-o", str(tmp_path)]) == 0


def test_vllms_gpu_memory_utilization_is_refused_not_ignored():
    """The pool comes from SGLang's mem_fraction_static: a utilization given for the sglang
    preset would change nothing, so it is an error (before, 0.5 and 0.9 both gave 422,282
    tokens and summary.json recorded 0.9)."""
    cfg = sim.SimConfig(scheduler="sglang", model="llama-3.1-8b", gpu="h100")
    assert cfg.resolved().gpu_memory_utilization is None and cfg.resolved_kv_blocks() > 0
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.5 is vLLM's setting: the "
                                         r"'sglang' scheduler sizes its KV pool with sglang's"):
        sim.SimConfig(scheduler="sglang", model="llama-3.1-8b", gpu="h100",
                      gpu_memory_utilization=0.5).resolved_kv_blocks()
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.5 sizes the KV pool, "
                                         r"which kv_blocks=1000 gives: set one of them"):
        sim.SimConfig(scheduler="sglang", gpu_memory_utilization=0.5, kv_blocks=1000)


class _Counted(SGLang):
    """SGLang counting its reads of decoding requests' tokens left, one by one."""

    decode_reads = 0
    clip_left = 50  # (SGLang's is 4,096: short outputs cross it)

    def _left(self, replica, r):
        _Counted.decode_reads += r.status == sim.engine.core.request.DECODE
        return super()._left(replica, r)


class _Checked(_Counted):
    """...that checks, at every admission's reservation, the replica's kept sum against the
    running requests read one by one (what SGLang's own loop reads)."""

    checks = 0

    def _reserved(self, replica):
        kept = super()._reserved(replica)
        assert kept == sum(self._left(replica, x) for x in replica.running.values())
        _Checked.checks += 1
        return kept


@pytest.mark.parametrize("spec", [None, 3], ids=["plain", "speculative"])
@pytest.mark.parametrize("kv_blocks, outputs, retracts", [(900, (1, 200), True),
                                                          (100_000, (1, 200), False),
                                                          (700, (1, 40), True),
                                                          (10**6, (1500, 3000), False)])
def test_the_kept_reservation_is_the_running_requests_sum(kv_blocks, outputs, retracts, spec):
    """Rule 3's sum kept by the replica (ClippedDecodes: phase A at the clip, 50 here, phase B
    counting down; under speculation SpecDecodes' ring of each request's drawn tokens left)
    equals the sum read request by request at every admission: outputs above and below the
    clip, a pool tight enough to retract, one roomy enough never to, outputs longer than the
    rings' first 1,024 steps (they grow); and with the kept sum, no decoding request is read
    one by one (O(prefilling) per iteration)."""
    rng = np.random.default_rng(kv_blocks)
    n = 300
    df = _df(np.column_stack([np.sort(rng.uniform(0, 20, n)), rng.integers(1, 300, n),
                              rng.integers(*outputs, n)]).tolist())
    df = df.astype({"num_prompt_tokens": int, "num_output_tokens": int})
    _Checked.checks = _Counted.decode_reads = 0
    kw = dict(cost_model=ConstantCost(0.01), kv_blocks=kv_blocks, block_size=1,
              max_batch_size=1024, speculative=spec and sim.SpeculativeConfig(
                  num_speculative_tokens=spec, acceptance_rate=0.6, draft_cost_ratio=0.05))
    res = run(df, scheduler=_Checked(512), **kw)
    assert (res.requests.status == "finished").all()
    assert (res.requests.num_preemptions.sum() > 0) == retracts and _Checked.checks > 50
    reads = _Counted.decode_reads
    _Counted.decode_reads = 0
    again = run(df, scheduler=_Counted(512), **kw)
    assert _Counted.decode_reads == 0 and reads > 0  # (the check itself read them)
    pd.testing.assert_frame_equal(res.requests, again.requests)


def test_clipped_decodes_sum_by_hand():
    """ClippedDecodes by hand: tokens left after decode step ``last`` are ``finish_iteration -
    last``, each clipped at ``clip``; a stop takes the request out of either phase."""
    from sim.engine.core.decoding import ClippedDecodes
    from sim.engine.core.request import Request
    d = ClippedDecodes(16, clip=10)
    a, b = Request(0, 0, 0.0, 5, 30), Request(1, 1, 0.0, 5, 8)
    for r in (a, b):
        r.num_computed, r.num_generated = 5, 1
    d.start(a, 0)  # finishes at 29: 29 - last left
    d.start(b, 2)  # finishes at 9
    assert d.clipped_left(2) == 10 + 7
    assert d.clipped_left(19) == 10 + (9 - 19)  # (b past its end is not asked in the engine)
    assert d.clipped_left(25) == 4 + (9 - 25)
    d.stop(b, 8)
    assert d.clipped_left(25) == 4
    d.stop(a, 25)
    assert d.clipped_left(26) == 0 and d.count == 0
