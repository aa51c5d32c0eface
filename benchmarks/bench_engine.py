"""Engine speed: simulated requests per wall-second on a saturated chunked-prefill replica.

    python benchmarks/bench_engine.py [--requests 100000] [--repeats 3]

Workload: lognormal prompts (mean 1,000 tokens, CV 1) and outputs (mean 250, CV 1), Poisson
arrivals at 1,000 req/s (far above capacity: saturated), max batch 256, chunked prefill with
the 512-token budget, Llama-3.1-8B on H100 roofline costs, KV blocks on (the pool from the
memory budget, 28,343 blocks; and the cheat sheet's 1,800 blocks, which forces preemptions).
Reports medians over repeats and the ratio to a bare SimPy loop with one timeout per iteration
(the floor any one-event-per-iteration engine pays). A third scenario turns speculative
decoding on (k = 4, acceptance 0.8, draft cost ratio 0.05: ``SPEC``) over the first scenario;
its ``per_request_vs_off`` is its wall time per request over the first's. A fourth routes the
same workload round-robin over 4 replicas (a cluster: one process per replica, a dispatcher
per arrival).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import deque

import simpy

import workloads as wl
from sim.constants import KV_BLOCKS_AVAILABLE
from sim.engine import SpeculativeConfig, run
from sim.costs.roofline import RooflineCost

SPEC = SpeculativeConfig(num_speculative_tokens=4, acceptance_rate=0.8, draft_cost_ratio=0.05)


def workload(n, seed=0):
    return wl.synthetic(n, rate=1000.0, prompt=wl.LogNormal(1000, 1.0, max_tokens=16384),
                        output=wl.LogNormal(250, 1.0, max_tokens=4096), seed=seed)


def bare_simpy(iterations) -> float:
    env = simpy.Environment()

    def loop():
        for _ in range(iterations):
            yield env.timeout(0.001)

    env.process(loop())
    t = time.perf_counter()
    env.run()
    return time.perf_counter() - t


class _Req:
    __slots__ = ("arrival", "prompt", "output", "computed", "generated", "finish")

    def __init__(self, arrival, prompt, output):
        self.arrival, self.prompt, self.output = arrival, prompt, output
        self.computed = self.generated = 0
        self.finish = None


def per_request_reference(df, max_batch=256, chunk=512, step=0.01) -> tuple:
    """Issue 15's reference loop: the straightforward simulator, written plainly - one Python
    object per request, one SimPy timeout per iteration, and each iteration a pass over every
    running request (decodes take one token of the ``chunk`` budget, prefills the rest, oldest
    first; FCFS admission up to ``max_batch``), no KV accounting, a constant step. Returns
    ``(wall seconds, iterations)``; the engine's speed is reported as a multiple of it."""
    env = simpy.Environment()
    reqs = [_Req(a, p, o) for a, p, o in zip(df["arrival_time"].tolist(),
                                             df["num_prompt_tokens"].tolist(),
                                             df["num_output_tokens"].tolist())]
    n = len(reqs)
    count = [0]

    def loop():
        queue, running, nxt, done = deque(), [], 0, 0
        while done < n:
            now = env.now
            while nxt < n and reqs[nxt].arrival <= now:
                queue.append(reqs[nxt])
                nxt += 1
            if not running and not queue:
                yield env.timeout(reqs[nxt].arrival - now)
                continue
            while queue and len(running) < max_batch:
                running.append(queue.popleft())
            budget = chunk - sum(1 for r in running if r.computed == r.prompt)
            work = []
            for r in running:
                if r.computed < r.prompt:
                    take = min(r.prompt - r.computed, budget) if budget > 0 else 0
                    budget -= take
                    work.append(take)
                else:
                    work.append(1)
            yield env.timeout(step)
            count[0] += 1
            keep = []
            for r, w in zip(running, work):
                if r.computed < r.prompt:
                    r.computed += w
                    if r.computed == r.prompt:
                        r.generated = 1
                else:
                    r.generated += 1
                if r.generated >= r.output:
                    r.finish = env.now
                    done += 1
                else:
                    keep.append(r)
            running = keep

    env.process(loop())
    t = time.perf_counter()
    env.run()
    return time.perf_counter() - t, count[0]


def measure(n=100_000, repeats=3, kv_blocks=None, speculative=None, replicas=1) -> dict:
    df = workload(n)
    cost = RooflineCost("llama-3.1-8b", "h100")
    walls, res = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        res = run(df, scheduler="chunked", cost_model=cost, max_batch_size=256,
                  kv_blocks=kv_blocks, model="llama-3.1-8b", gpu="h100",
                  speculative=speculative, replicas=replicas)
        walls.append(time.perf_counter() - t)
    wall = statistics.median(walls)
    iters = len(res.iterations)
    bare = statistics.median(bare_simpy(iters) for _ in range(repeats))
    return {"requests": n, "speculative": speculative is not None, "replicas": replicas,
            "kv_blocks": res.kv_blocks, "iterations": iters,
            "preemptions": int(res.requests["num_preemptions"].sum()),
            "wall_s_median": round(wall, 3), "requests_per_s": round(n / wall),
            "iterations_per_s": round(iters / wall),
            "bare_simpy_iterations_per_s": round(iters / bare),
            "ratio_to_bare_simpy": round(bare / wall, 3)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    out = [measure(a.requests, a.repeats), measure(a.requests, a.repeats, KV_BLOCKS_AVAILABLE),
           measure(a.requests, a.repeats, speculative=SPEC),
           measure(a.requests, a.repeats, replicas=4)]
    out[2]["per_request_vs_off"] = round(out[2]["wall_s_median"] / out[0]["wall_s_median"], 3)
    json.dump(out, sys.stdout, indent=2)
    print()
    return out


if __name__ == "__main__":
    main()
