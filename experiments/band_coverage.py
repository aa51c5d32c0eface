"""How often the error band holds the measurement: coverage of ``bands`` on the serving check.

    python experiments/band_coverage.py                       # every run, 2,000 requests at most
    python experiments/band_coverage.py --every 4 --max-requests 1000   # a quick look

Rows: ``sim/data/published_serving.csv`` through ``experiments/validate_serving.py``'s own
workloads and settings (every row there is held out: nothing was fitted to it). Each run is
replayed with ``SimConfig(bands=LEVEL)`` (:mod:`sim.engine.bands`: two more runs with every step
priced at the ends of the central ``LEVEL`` interval of the roofline's measured step-time
error on that GPU); a row is *covered* when its measured value lies in ``[<metric>_lo,
<metric>_hi]``. Printed: the coverage overall, per metric, per GPU and per engine, and the
rows' median signed error, which says whether a miss is the band's width or a bias.

``--max-requests`` cuts long runs (the point estimate then differs a little from
``sim/data/serving_check.json``'s full runs); ``--every K`` keeps every K-th run.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import pandas as pd

from sim import sweep

sys.path.insert(0, str(Path(__file__).resolve().parent))
import validate_serving as vs  # noqa: E402  (the serving check's rows, workloads and settings)


def coverage(level=0.9, max_requests=2000, every=1, workers=2) -> pd.DataFrame:
    """One row per published figure: measured, predicted, the band and whether it holds it."""
    rows = vs.load_rows()
    shape = vs._sharegpt_shape()
    keys, jobs = {}, []
    for r in rows.itertuples():
        key = tuple(vs._plain(getattr(r, k)) for k in vs.RUN_KEY)
        if key not in keys:
            keys[key] = len(keys)
            if keys[key] % every == 0:
                cfg = dataclasses.replace(vs.config(r), bands=level)
                jobs.append((keys[key], {"workload": vs.workload(r, max_requests, shape),
                                         "config": {"config": cfg}}))
    summaries = dict(zip([k for k, _ in jobs], sweep([j for _, j in jobs], workers=workers,
                                                     progress=False).to_dict("records")))
    out = []
    for r in rows.itertuples():
        s = summaries.get(keys[tuple(vs._plain(getattr(r, k)) for k in vs.RUN_KEY)])
        if s is None:
            continue
        metric, scale = vs.METRICS[r.metric], vs.SCALE[r.unit]
        lo, hi = s[f"{metric}_lo"] * scale, s[f"{metric}_hi"] * scale
        out.append({"metric": r.metric, "engine": r.engine, "gpu": r.gpu, "measured": r.value,
                    "predicted": s[metric] * scale, "lo": lo, "hi": hi,
                    "errors": s["bands_errors"], "covered": lo <= r.value <= hi,
                    "error": s[metric] * scale / r.value - 1})
    return pd.DataFrame(out)


def report(table: pd.DataFrame) -> str:
    """Coverage overall and per metric, GPU and engine, with the median signed error."""
    lines = [f"coverage {table['covered'].mean():.1%} of {len(table)} rows"]
    for by in ("metric", "gpu", "errors", "engine"):
        g = table.groupby(by).agg(rows=("covered", "size"), coverage=("covered", "mean"),
                                  median_error=("error", "median"))
        lines.append(g.round(3).to_string())
    return "\n\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--level", type=float, default=0.9, help="the band (default 0.9)")
    ap.add_argument("--max-requests", type=int, default=2000,
                    help="requests per run at most (default 2,000)")
    ap.add_argument("--every", type=int, default=1, help="keep every K-th run (default 1)")
    ap.add_argument("--workers", type=int, default=2, help="local processes (default 2)")
    args = ap.parse_args(argv)
    t = time.perf_counter()
    table = coverage(args.level, args.max_requests, args.every, args.workers)
    print(report(table))
    print(f"\nwall {time.perf_counter() - t:.1f} s")
    return table


if __name__ == "__main__":
    main()
