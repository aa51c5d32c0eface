"""``/metrics``: the served engine's state in Prometheus' text format, with vLLM's names.

vLLM's metric names (docs.vllm.ai, "Production Metrics"; vllm/v1/metrics/loggers.py):
gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``
(a fraction, 0..1); counters ``vllm:request_success_total``, ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``; histograms ``vllm:time_to_first_token_seconds``,
``vllm:inter_token_latency_seconds`` and ``vllm:e2e_request_latency_seconds``, each labelled
``model_name``. Latencies are **simulated** seconds (what the engine predicts), not wall time.
Plus ``sim:num_requests_rejected_total`` (a request the engine refused at arrival),
``sim:num_requests_refused_total`` (over the server's ``--max-concurrency``: HTTP 429) and
``sim:num_requests_aborted_total`` (its client left mid-stream). Bounded memory:
histograms are bucket counts.

More than one replica (``sim serve --replicas N``): every gauge, the success and token
counters and the histograms are reported per replica too, labelled as vLLM labels its
data-parallel engines (``engine="0"`` ..., vllm/v1/metrics/loggers.py: ``labelnames =
["model_name", "engine"]``), beside the series without ``engine``, all replicas together (so
a sum over every series counts each request twice: sum the ``engine`` series, or read the
total). One replica: only the total series, as before.
"""

from __future__ import annotations

import bisect

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # (vLLM's)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class Histogram:
    """Cumulative bucket counts, their sum and count (Prometheus' histogram)."""

    def __init__(self, bounds):
        self.bounds, self.counts = tuple(bounds), [0] * (len(bounds) + 1)
        self.sum, self.count = 0.0, 0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def lines(self, name, labels):
        total = 0
        for bound, c in zip(self.bounds + (float("inf"),), self.counts):
            total += c
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            yield f'{name}_bucket{{{labels},le="{le}"}} {total}'
        yield f"{name}_sum{{{labels}}} {self.sum!r}"
        yield f"{name}_count{{{labels}}} {self.count}"


class Served:
    """One set of request-level series: successes, tokens and the latency histograms."""

    def __init__(self):
        self.ttft, self.itl = Histogram(TTFT_BUCKETS), Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.success = self.prompt_tokens = self.generation_tokens = 0

    def finished(self, r, token_times) -> None:
        self.success += 1
        self.prompt_tokens += r.num_prompt_tokens
        self.generation_tokens += r.num_output_tokens
        first = token_times[0][0]
        self.ttft.observe(first - r.arrival_time)
        for (t0, _), (t1, n) in zip(token_times, token_times[1:]):
            self.itl.observe((t1 - t0) / n, n)  # (n tokens at once: speculative decoding)
        self.e2e.observe(token_times[-1][0] - r.arrival_time)


class Metrics(Served):
    """What ``/metrics`` reports, updated by the request handlers as requests end;
    ``replicas``: how many the engine runs (more than one: per-replica series too)."""

    def __init__(self, model: str, replicas: int = 1):
        super().__init__()
        self.labels = f'model_name="{model}"'
        self.per_replica = [Served() for _ in range(replicas)] if replicas > 1 else []
        self.rejected = self.refused = self.aborted = 0

    def finished(self, r, token_times, replica: int = 0) -> None:
        """A request finished at ``replica``: its simulated arrival, token times (one per
        emission, with the tokens emitted then) and counts."""
        super().finished(r, token_times)
        if self.per_replica:
            self.per_replica[replica].finished(r, token_times)

    def text(self, snapshot, snapshots=()) -> str:
        """The exposition; ``snapshot``: (running, waiting, KV usage) of all replicas,
        ``snapshots``: each replica's (reported only with per-replica series)."""
        each = [(f'{self.labels},engine="{k}"', s, shot) for k, (s, shot) in
                enumerate(zip(self.per_replica, snapshots))]
        series = [(self.labels, self, snapshot)] + each
        out = []
        for name, kind, get in (("vllm:num_requests_running", "gauge", lambda s, g: g[0]),
                                ("vllm:num_requests_waiting", "gauge", lambda s, g: g[1]),
                                ("vllm:kv_cache_usage_perc", "gauge", lambda s, g: float(g[2])),
                                ("vllm:request_success_total", "counter",
                                 lambda s, g: s.success),
                                ("vllm:prompt_tokens_total", "counter",
                                 lambda s, g: s.prompt_tokens),
                                ("vllm:generation_tokens_total", "counter",
                                 lambda s, g: s.generation_tokens)):
            out.append(f"# TYPE {name[:-6] if kind == 'counter' else name} {kind}")
            out += [f"{name}{{{labels}}} {get(s, shot)}" for labels, s, shot in series]
        for name, value in (("sim:num_requests_rejected_total", self.rejected),
                            ("sim:num_requests_refused_total", self.refused),
                            ("sim:num_requests_aborted_total", self.aborted)):
            out += [f"# TYPE {name[:-6]} counter", f"{name}{{{self.labels}}} {value}"]
        for name, attr in (("vllm:time_to_first_token_seconds", "ttft"),
                           ("vllm:inter_token_latency_seconds", "itl"),
                           ("vllm:e2e_request_latency_seconds", "e2e")):
            out.append(f"# TYPE {name} histogram")
            for labels, s, _shot in series:
                out.extend(getattr(s, attr).lines(name, labels))
        return "\n".join(out) + "\n"
