"""``sim serve`` (sim.serve): the simulated engine in real time behind an OpenAI-compatible
endpoint, hit with the real ``openai`` SDK: client-measured TTFT / ITL against ``sim.run`` on
the same arrivals, nothing lost, 400s with the engine's reason, ``/metrics``, shutdown."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from sim.engine import SimConfig, run  # noqa: E402
from sim.serve.app import make_app, sizes  # noqa: E402
from sim.serve.engine import LiveEngine  # noqa: E402

SCALE = 8.0  # wall seconds per simulated second in the timing test
SENT = {}  # x-tag header -> when the HTTP client sent the request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(engine, **kw):
    """``engine``'s app served by uvicorn in a thread of this process: yields its port."""
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(make_app(engine, "sim", **kw), host="127.0.0.1",
                                        port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield port
    finally:
        srv.should_exit = True
        thread.join(10)


def sdk_client(port, timeout=30):
    """The openai SDK on ``port``, its HTTP client noting when each request goes out (after
    the SDK built it) in ``SENT`` by its x-tag header."""
    http = httpx.Client(timeout=timeout, event_hooks={"request": [
        lambda r: SENT.__setitem__(r.headers.get("x-tag"), time.monotonic())]})
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                         max_retries=0, http_client=http)


@pytest.fixture(scope="module")
def server():
    engine = LiveEngine(SimConfig(), SCALE)
    with served(engine) as port:
        client = sdk_client(port)
        client.completions.create(model="sim", prompt="warm up", max_tokens=2)  # (lazy imports)
        client.chat.completions.create(model="sim", max_tokens=2,
                                       messages=[{"role": "user", "content": "warm up"}])
        yield client, port, engine


def stream_one(client, prompt_words, max_tokens, chat, out):
    """One streaming request; ``out``: (send time, [chunk times], text, usage)."""
    tag = f"{threading.get_ident()}-{time.monotonic()}"
    kw = dict(model="sim", max_tokens=max_tokens, stream=True,
              stream_options={"include_usage": True}, extra_headers={"x-tag": tag})
    if chat:
        chunks = client.chat.completions.create(
            messages=[{"role": "user", "content": "word " * prompt_words}], **kw)
    else:
        chunks = client.completions.create(prompt="word " * prompt_words, **kw)
    times, text, usage = [], "", None
    for c in chunks:
        if c.usage is not None:
            usage = c.usage
        if c.choices:
            piece = c.choices[0].delta.content if chat else c.choices[0].text
            if piece:
                times.append(time.monotonic())
                text += piece
    out.append((SENT.pop(tag, None), times, text, usage))


def test_sizes_from_the_body():
    assert sizes({"prompt": "a b  c", "max_tokens": 5}, chat=False) == (3, 5)
    assert sizes({"prompt": [1, 2, 3, 4]}, chat=False) == (4, 16)
    assert sizes({"messages": [{"role": "user", "content": "x y"},
                               {"role": "assistant", "content": "z"}],
                  "max_completion_tokens": 7}, chat=True) == (3, 7)
    with pytest.raises(ValueError, match="max_tokens"):
        sizes({"prompt": "a", "max_tokens": 0}, chat=False)


def test_engine_listener_hears_every_token_then_done():
    engine = LiveEngine(SimConfig(), 0.05)  # twenty times faster than real time
    heard, ended = {}, threading.Event()

    def listener(i):
        def hear(kind, value, now):
            heard.setdefault(i, []).append((kind, value if kind == "tokens" else None, now))
            if len(heard) == 5 and all(h[-1][0] == "done" for h in heard.values()):
                ended.set()
        return hear
    engine.start()
    for i in range(5):
        engine.add(100 * (i + 1), 10 + i, listener(i))
    assert ended.wait(20)
    engine.stop()
    for i, events in heard.items():
        assert [k for k, _, _ in events].count("done") == 1 and events[-1][0] == "done"
        assert sum(v for k, v, _ in events if k == "tokens") == 10 + i
        times = [t for _, _, t in events]
        assert times == sorted(times)


@pytest.mark.slow
def test_client_latencies_match_the_simulation(server):
    """A light load (8 requests, ~10 per simulated second, both endpoints): the TTFT and ITL the
    client measures (wall / SCALE) are within 10 % of sim.run's for the same arrivals."""
    client, _, _ = server
    rng = np.random.default_rng(0)
    prompts, outputs = rng.integers(100, 1500, 8).tolist(), rng.integers(10, 40, 8).tolist()
    gaps = rng.exponential(0.1 * SCALE, 8)
    results, threads, t0 = [], [], time.monotonic()
    for i in range(8):
        time.sleep(max(0.0, t0 + gaps[:i + 1].sum() - time.monotonic()))
        th = threading.Thread(target=stream_one, args=(client, prompts[i], outputs[i],
                                                        i % 2 == 1, results))
        th.start()
        threads.append(th)
    for th in threads:
        th.join(60)
    assert len(results) == 8
    results.sort(key=lambda x: x[0])
    start = results[0][0]
    by_send = {round(r[0], 9): r for r in results}
    order = sorted(by_send)
    # the lengths of each request, matched by its usage (prompt words, max_tokens)
    df = pd.DataFrame({"request_id": range(8),
                       "arrival_time": [(t - start) / SCALE for t in order],
                       "num_prompt_tokens": [by_send[t][3].prompt_tokens for t in order],
                       "num_output_tokens": [by_send[t][3].completion_tokens for t in order]})
    sim = run(df, SimConfig())
    for t, n in zip(order, df["num_output_tokens"]):
        assert len(by_send[t][1]) == n and len(by_send[t][2].split()) == n  # one chunk a token
    ttft_client = np.mean([(by_send[t][1][0] - t) / SCALE for t in order])
    itl_client = np.mean(np.concatenate([np.diff(by_send[t][1]) / SCALE for t in order]))
    s = sim.summary()
    print(f"TTFT client {ttft_client * 1e3:.2f} ms vs sim {s['ttft_mean'] * 1e3:.2f} ms; "
          f"ITL client {itl_client * 1e3:.2f} ms vs sim {s['itl_mean'] * 1e3:.2f} ms")
    assert ttft_client == pytest.approx(s["ttft_mean"], rel=0.10)
    assert itl_client == pytest.approx(s["itl_mean"], rel=0.10)


def test_rejected_request_is_a_400_with_the_reason(server):
    client, _, _ = server
    with pytest.raises(openai.BadRequestError, match="exceed max_model_len"):
        client.completions.create(model="sim", prompt="w " * 140_000, max_tokens=10)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model="sim", prompt="w", max_tokens=0)


def test_non_streaming_usage_models_health_and_metrics(server):
    client, port, engine = server
    before = engine.counts["finished"]
    r = client.chat.completions.create(model="sim", max_tokens=5,
                                       messages=[{"role": "user", "content": "one two three"}])
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (3, 5)
    assert len(r.choices[0].message.content.split()) == 5
    assert r.choices[0].finish_reason == "length"
    assert [m.id for m in client.models.list()] == ["sim"]
    base = f"http://127.0.0.1:{port}"
    assert httpx.get(f"{base}/health").status_code == 200
    text = httpx.get(f"{base}/metrics").text
    values = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.fullmatch(r"# TYPE [a-z0-9_:]+ (gauge|counter|histogram)", line), line
            continue
        m = re.fullmatch(r'([a-z0-9_:]+)\{([^}]*)\} (\S+)', line)
        assert m, line
        values[(m[1], m[2])] = float(m[3])
    label = 'model_name="sim"'
    assert values[("vllm:request_success_total", label)] == engine.counts["finished"] > before
    assert values[("vllm:e2e_request_latency_seconds_count", label)] == engine.counts["finished"]
    assert values[("vllm:time_to_first_token_seconds_bucket", label + ',le="+Inf"')] \
        == engine.counts["finished"]
    assert values[("vllm:num_requests_running", label)] == 0
    assert 0 <= values[("vllm:kv_cache_usage_perc", label)] <= 1


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_lets_requests_in_flight_finish_then_exits(tmp_path, sig):
    """`sim serve` in a subprocess: SIGTERM (or SIGINT) while three streams run; each gets all
    its tokens, the process exits 0 and then refuses connections (nothing left hanging)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sim.cli.main", "serve", "--port", str(port),
                             "--model", "llama-3.2-1b"], stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                               max_retries=0, timeout=30)
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, "no server"
                time.sleep(0.1)
        results = []
        threads = [threading.Thread(target=stream_one, args=(client, 50, 200, False, results))
                   for _ in range(3)]
        for th in threads:
            th.start()
        time.sleep(0.3)
        proc.send_signal(sig)
        for th in threads:
            th.join(30)
        assert not any(th.is_alive() for th in threads)  # none left hanging
        assert proc.wait(20) == 0
        assert len(results) == 3 and all(len(r[1]) == 200 for r in results)
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/health")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
