"""The compiled engine core against the same source interpreted (sim/native.py).

    python benchmarks/bench_native.py [--requests 30000] [--pairs 3]

Runs scenario 1 of bench_engine.py (saturated chunked prefill, Llama-3.1-8B on H100 roofline
costs), its speculative variant and the `sglang` preset in fresh processes, compiled and with
``SIM_PURE_PYTHON=1``, alternated pair by pair (this machine's speed drifts); reports each
mode's median CPU seconds of ``sim.run``, the ratio interpreted / compiled, and checks that both
modes gave the same results (a SHA-256 of the request and iteration tables).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = """
import hashlib, json, sys, time
sys.path.insert(0, {here!r})
import bench_engine
from sim import native
from sim.engine import run
from sim.costs.roofline import RooflineCost
df = bench_engine.workload({n})
cases = {{"chunked": {{"scheduler": "chunked"}},
          "chunked_spec": {{"scheduler": "chunked", "speculative": bench_engine.SPEC}},
          "sglang": {{"scheduler": "sglang", "max_batch_size": 1024}}}}
out = {{"modes": sorted(set(native.status().values()))}}
for name, kw in cases.items():
    kw = {{"max_batch_size": 256, **kw}}
    cost = RooflineCost("llama-3.1-8b", "h100")
    t = time.process_time()
    res = run(df, cost_model=cost, model="llama-3.1-8b", gpu="h100", **kw)
    cpu = time.process_time() - t
    digest = hashlib.sha256(res.requests.to_csv().encode() + res.iterations.to_csv().encode())
    out[name] = [cpu, len(res.iterations), digest.hexdigest()[:16]]
print(json.dumps(out))
"""


def child(n, pure):
    env = {k: v for k, v in os.environ.items() if k != "SIM_PURE_PYTHON"}
    if pure:
        env["SIM_PURE_PYTHON"] = "1"
    p = subprocess.run([sys.executable, "-c", CHILD.format(here=str(HERE), n=n)], env=env,
                       check=True, capture_output=True, text=True, timeout=1800)
    return json.loads(p.stdout.splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=30_000)
    p.add_argument("--pairs", type=int, default=3)
    a = p.parse_args(argv)
    runs = {False: [], True: []}
    for _ in range(a.pairs):
        for pure in (False, True):
            runs[pure].append(child(a.requests, pure))
    report = {"requests": a.requests, "pairs": a.pairs,
              "compiled_modes": runs[False][0]["modes"],
              "interpreted_modes": runs[True][0]["modes"]}
    for name in ("chunked", "chunked_spec", "sglang"):
        comp = statistics.median(r[name][0] for r in runs[False])
        interp = statistics.median(r[name][0] for r in runs[True])
        digests = {r[name][2] for r in runs[False] + runs[True]}
        iters = runs[False][0][name][1]
        report[name] = {"compiled_cpu_s": round(comp, 3), "interpreted_cpu_s": round(interp, 3),
                        "speedup": round(interp / comp, 3), "iterations": iters,
                        "compiled_us_per_iteration": round(comp / iters * 1e6, 2),
                        "same_results": len(digests) == 1}
    json.dump(report, sys.stdout, indent=2)
    print()
    return report


if __name__ == "__main__":
    main()
