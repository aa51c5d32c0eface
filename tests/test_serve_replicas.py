"""``sim serve --replicas N --router R``: the live engine's replicas behind ``sim run``'s
routers on one simulated clock. Round robin alternates replicas (seen in ``/metrics``, per
``engine`` label); a burst that saturates one replica sees a lower client-measured TTFT with
two, within 10 % of ``sim.run`` with the same replicas and router on the same arrivals;
nothing lost, nothing left running after shutdown; bad settings are one-line errors."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pandas as pd
import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from sim.cli.main import main  # noqa: E402
from sim.engine import Disaggregation, SimConfig, run  # noqa: E402
from sim.engine.core.invariants import check_replica  # noqa: E402
from sim.serve.engine import LiveEngine  # noqa: E402

from test_serve import sdk_client, served, stream_one  # noqa: E402



def knee(**kw):  # (tests/test_serve_limits.py's) 1,000-token prefill ~230 ms, step ~60 ms
    return SimConfig(model="llama-3.1-8b", gpu="l4", **kw)


SCALE = 3.0


def metric_values(text):
    """``{(name, labels): value}`` of a Prometheus exposition."""
    values = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            m = re.fullmatch(r'([a-z0-9_:]+)\{([^}]*)\} (\S+)', line)
            assert m, line
            values[(m[1], m[2])] = float(m[3])
    return values


def test_round_robin_alternates_replicas_in_the_metrics():
    engine = LiveEngine(knee(replicas=2, router="round_robin"), 0.2)
    with served(engine) as port:
        client = sdk_client(port)
        base, label = f"http://127.0.0.1:{port}", 'model_name="sim"'
        for i in range(4):
            client.completions.create(model="sim", prompt="w " * 20, max_tokens=3 + i)
            v = metric_values(httpx.get(f"{base}/metrics").text)
            got = [v[("vllm:request_success_total", f'{label},engine="{k}"')] for k in (0, 1)]
            assert got == [i // 2 + 1, (i + 1) // 2]  # replica i mod 2 served request i
        # each replica's generation tokens: 3 + 5 and 4 + 6; the total series sums them
        assert [v[("vllm:generation_tokens_total", f'{label},engine="{k}"')]
                for k in (0, 1)] == [8, 10]
        assert v[("vllm:generation_tokens_total", label)] == 18
        assert v[("vllm:request_success_total", label)] == 4
        assert v[("vllm:e2e_request_latency_seconds_count", f'{label},engine="1"')] == 2
        for k in (0, 1):
            assert v[("vllm:num_requests_running", f'{label},engine="{k}"')] == 0
            assert v[("vllm:kv_cache_usage_perc", f'{label},engine="{k}"')] == 0
    assert engine.routed == [2, 2] and engine.counts["finished"] == 4


def burst(replicas, n=8):
    """``n`` clients at once (0.02 s apart, wall), each a 1,000-word prompt for 12 tokens, at
    ``replicas`` round-robin replicas: (client TTFT mean, sim.run's, the engine)."""
    engine = LiveEngine(knee(replicas=replicas), SCALE)
    with served(engine) as port:
        client = sdk_client(port, 60)
        for _ in range(replicas):  # warm up, one per replica (round robin back at 0)
            stream_one(client, 5, 2, False, [])
        results, threads = [], []
        for _ in range(n):
            threads.append(threading.Thread(target=stream_one,
                                            args=(client, 1000, 12, False, results)))
            threads[-1].start()
            time.sleep(0.02)
        for th in threads:
            th.join(120)
        assert not any(th.is_alive() for th in threads)
    assert len(results) == n and all(len(r[1]) == 12 for r in results)  # nothing lost
    assert engine.counts == {"finished": n + replicas, "rejected": 0, "aborted": 0}
    assert not engine.active  # nothing left after shutdown
    for rep in engine.replicas:
        assert not rep.running and not rep.waiting
        assert rep.blocks.num_free == rep.blocks.num_blocks
        check_replica(rep)
    results.sort(key=lambda r: r[0])
    start = results[0][0]
    df = pd.DataFrame({"arrival_time": [(r[0] - start) / SCALE for r in results],
                       "num_prompt_tokens": [r[3].prompt_tokens for r in results],
                       "num_output_tokens": [r[3].completion_tokens for r in results]})
    sim = run(df, knee(replicas=replicas, router="round_robin")).summary()
    ttft = np.mean([(r[1][0] - r[0]) / SCALE for r in results])
    print(f"{replicas} replica(s): TTFT client {ttft * 1e3:.1f} ms vs sim "
          f"{sim['ttft_mean'] * 1e3:.1f} ms")
    return ttft, sim["ttft_mean"], engine


@pytest.mark.slow
def test_two_replicas_cut_the_ttft_of_a_burst_as_sim_run_predicts():
    one, one_sim, _ = burst(1)
    two, two_sim, engine = burst(2)
    assert one_sim > 3 * 0.23  # one replica saturated: the prompts queue for its prefills
    assert two < 0.75 * one  # two replicas: half the queue each
    assert one == pytest.approx(one_sim, rel=0.10)
    assert two == pytest.approx(two_sim, rel=0.10)
    assert engine.routed == [5, 5]


def test_bad_replicas_and_router_are_one_line_errors(capsys):
    for argv, said in ((["--replicas", "0"], "--replicas"),
                       (["--router", "nearest"], "nearest")):
        assert main(["serve", "--model", "llama-3.2-1b", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("sim serve: error:") and said in err and "\n" not in err, err
    with pytest.raises(ValueError, match="sim serve does not take disaggregation"):
        LiveEngine(knee(disaggregation=Disaggregation(1, 1)))


@pytest.mark.parametrize("router", ["round_robin", "random", "least_outstanding", "least_kv",
                                    "prefix_affinity", "cache_aware"])
def test_every_named_router_serves_every_request(router):
    engine = LiveEngine(SimConfig(replicas=3, router=router, prefix_caching="block"), 0.02)
    ended, heard = threading.Event(), []

    def hear(kind, value, now):
        if kind != "tokens":
            heard.append((kind, value))
            if len(heard) == 6:
                ended.set()
    engine.start()
    for i in range(6):
        engine.add(200 + 10 * i, 5, hear)
    assert ended.wait(20)
    engine.stop()
    assert [k for k, _ in heard] == ["done"] * 6 and sum(engine.routed) == 6
    assert sorted(r.index for r, _ in (v for _, v in heard)) == list(range(6))
    assert all(0 <= k < 3 for _, (_, k) in heard)
