"""``sim serve`` under load and at its limits: the openai SDK near the knee (client-measured TTFT
and ITL against ``sim.run`` on the same arrivals), a client that leaves mid-stream aborts its
simulated request (blocks freed, counted aborted, nothing lost), ``max_concurrency`` answers
429 with the reason (SIGINT and SIGTERM: tests/test_serve.py)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pandas as pd
import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from sim.engine import SimConfig, run  # noqa: E402
from sim.engine.core.invariants import check_replica  # noqa: E402
from sim.serve.app import make_app  # noqa: E402
from sim.serve.engine import LiveEngine  # noqa: E402

from test_serve import sdk_client, served, stream_one  # noqa: E402

KNEE = SimConfig(model="llama-3.1-8b", gpu="l4")  # 1,000-token prefill ~230 ms, step ~60 ms
SCALE = 3.0


def test_openai_clients_near_the_knee_see_what_the_simulation_predicts():
    """Eight clients, each sending three 1,000-word prompts for 12 tokens back to back (the
    knee: sim's throughput there is 92 % of its plateau, TTFT 3x one client's): the TTFT and
    ITL the SDK measures (wall / SCALE) are within 10 % of sim.run's on the same arrivals."""
    engine = LiveEngine(KNEE, SCALE)
    with served(engine) as port:
        client = sdk_client(port, 60)
        stream_one(client, 5, 2, False, [])  # warm up
        results = []

        def user():
            for _ in range(3):
                stream_one(client, 1000, 12, False, results)
        users = [threading.Thread(target=user) for _ in range(8)]
        for u in users:
            u.start()
        for u in users:
            u.join(120)
        assert len(results) == 24 and all(len(r[1]) == 12 for r in results)  # nothing lost
        results.sort(key=lambda r: r[0])
        start = results[0][0]
        df = pd.DataFrame({"arrival_time": [(r[0] - start) / SCALE for r in results],
                           "num_prompt_tokens": [r[3].prompt_tokens for r in results],
                           "num_output_tokens": [r[3].completion_tokens for r in results]})
        s = run(df, KNEE).summary()
        ttft = np.mean([(r[1][0] - r[0]) / SCALE for r in results])
        itl = np.mean(np.concatenate([np.diff(r[1]) / SCALE for r in results]))
        print(f"knee: TTFT client {ttft * 1e3:.1f} ms vs sim {s['ttft_mean'] * 1e3:.1f} ms; "
              f"ITL client {itl * 1e3:.1f} ms vs sim {s['itl_mean'] * 1e3:.1f} ms")
        assert s["ttft_mean"] > 2 * 0.23  # queueing: past one client's prefill
        assert ttft == pytest.approx(s["ttft_mean"], rel=0.10)
        assert itl == pytest.approx(s["itl_mean"], rel=0.10)
        assert engine.counts == {"finished": 25, "rejected": 0, "aborted": 0}


def test_a_client_that_leaves_aborts_its_request():
    engine = LiveEngine(KNEE, 1.0)
    with served(engine) as port:
        body = {"model": "sim", "prompt": "w " * 200, "max_tokens": 400, "stream": True}
        with httpx.Client(timeout=30) as http:
            with http.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
                chunks = 0
                for line in r.iter_lines():
                    chunks += line.startswith("data:")
                    if chunks == 3:
                        break  # the client leaves, its stream closed
            deadline = time.monotonic() + 10
            while engine.counts["aborted"] == 0:
                assert time.monotonic() < deadline, "the request was not aborted"
                time.sleep(0.05)
            time.sleep(0.2)  # (the engine's thread between events)
            assert not engine.active and not engine.replica.running
            blocks = engine.replica.blocks
            assert blocks.num_free == blocks.num_blocks  # its KV blocks freed
            check_replica(engine.replica)
            metrics = http.get(f"http://127.0.0.1:{port}/metrics").text
            assert 'sim:num_requests_aborted_total{model_name="sim"} 1' in metrics
            # the engine goes on: the next request runs to its end
            done = http.post(f"http://127.0.0.1:{port}/v1/completions",
                             json={"model": "sim", "prompt": "w w", "max_tokens": 3}).json()
        assert done["usage"]["completion_tokens"] == 3
        assert engine.counts == {"finished": 1, "rejected": 0, "aborted": 1}


def test_over_max_concurrency_is_a_429_with_the_reason():
    engine = LiveEngine(KNEE, 1.0)
    with served(engine, max_concurrency=2) as port:
        client = sdk_client(port, 60)
        results = []
        threads = [threading.Thread(target=stream_one, args=(client, 50, 20, False, results))
                   for _ in range(2)]
        for th in threads:
            th.start()
        deadline = time.monotonic() + 10
        while len(engine.active) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(openai.RateLimitError, match=r"2 requests in flight, the server's "
                                                        r"limit \(--max-concurrency 2\)") as e:
            client.completions.create(model="sim", prompt="w", max_tokens=2)
        assert e.value.response.headers["retry-after"] == "1"
        for th in threads:
            th.join(30)
        assert len(results) == 2 and all(len(r[1]) == 20 for r in results)
        client.completions.create(model="sim", prompt="w", max_tokens=2)  # room again
        with pytest.raises(ValueError, match="max_concurrency must be an integer >= 1"):
            make_app(engine, "sim", max_concurrency=0)
