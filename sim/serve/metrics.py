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


class Metrics:
    """What ``/metrics`` reports, updated by the request handlers as requests end."""

    def __init__(self, model: str):
        self.labels = f'model_name="{model}"'
        self.ttft, self.itl = Histogram(TTFT_BUCKETS), Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.success = self.rejected = self.refused = self.aborted = self.prompt_tokens = self.generation_tokens = 0

    def finished(self, r, token_times) -> None:
        """A request finished: its simulated arrival, token times (one per emission, with the
        tokens emitted then) and counts."""
        self.success += 1
        self.prompt_tokens += r.num_prompt_tokens
        self.generation_tokens += r.num_output_tokens
        first = token_times[0][0]
        self.ttft.observe(first - r.arrival_time)
        for (t0, _), (t1, n) in zip(token_times, token_times[1:]):
            self.itl.observe((t1 - t0) / n, n)  # (n tokens at once: speculative decoding)
        self.e2e.observe(token_times[-1][0] - r.arrival_time)

    def text(self, snapshot) -> str:
        running, waiting, usage = snapshot
        out = []
        for name, kind, value in (("vllm:num_requests_running", "gauge", running),
                                  ("vllm:num_requests_waiting", "gauge", waiting),
                                  ("vllm:kv_cache_usage_perc", "gauge", float(usage)),
                                  ("vllm:request_success_total", "counter", self.success),
                                  ("vllm:prompt_tokens_total", "counter", self.prompt_tokens),
                                  ("vllm:generation_tokens_total", "counter",
                                   self.generation_tokens),
                                  ("sim:num_requests_rejected_total", "counter",
                                   self.rejected),
                                  ("sim:num_requests_refused_total", "counter", self.refused),
                                  ("sim:num_requests_aborted_total", "counter", self.aborted)):
            base = name[:-6] if kind == "counter" else name
            out += [f"# TYPE {base} {kind}", f"{name}{{{self.labels}}} {value}"]
        for name, h in (("vllm:time_to_first_token_seconds", self.ttft),
                        ("vllm:inter_token_latency_seconds", self.itl),
                        ("vllm:e2e_request_latency_seconds", self.e2e)):
            out.append(f"# TYPE {name} histogram")
            out.extend(h.lines(name, self.labels))
        return "\n".join(out) + "\n"
