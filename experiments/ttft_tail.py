"""Where the simulated TTFT P99 misses on B200 and MI300X: the fit rows' tail, row by row, and
one candidate term tried as a what-if (issue 27).

    python experiments/ttft_tail.py            # prints the tables; writes nothing
    python experiments/ttft_tail.py --write    # also stores sim/data/ttft_tail.json

Input: ``sim/data/validation_runs.csv``, replayed as ``experiments/validate_independent.py``
does (warm server, the engines' fitted overheads, ``engine_overheads="fitted"``). Tables:

- ``rows``: per run, measured TTFT P50 / P99 beside the replay's on the warm server (the
  validation's), on a cold one (``--cold``: no earlier block's prefix cache) and with the
  chosen front-end term below; ``excess_p99_ms`` = measured minus warm P99;
- ``patterns``: the fit rows' median excess per GPU and concurrency (1 vs 16 or more), and
  how many of those rows the warm replay under-predicts;
- the what-ifs. ``bench_serving`` (request rate ``inf``, ``--max-concurrency N``) sends its
  first ``N`` requests at once after its one warm-up request and a 1 s sleep (sglang
  ``python/sglang/bench_serving.py`` ``benchmark()``). Two forms of a time that burst pays and
  the replay does not, each moving the burst's engine arrivals (the client's TTFT and E2E
  include the move; the requests sent later arrive one by one and are not moved):
  **front end** ``s``: a front end that hands the burst's requests to the scheduler one at a
  time (SGLang's tokenizer manager is one process): request ``k`` arrives ``(k + 1) x s``
  after it was sent; **stall** ``D``: the burst (``N > 1``) waits ``D`` once before its first
  prefill, whatever its size (a one-off per block, e.g. compiling kernels for batch shapes the
  server has not run yet; no source times it). The pair ``(s, D)`` is chosen on the ``fit``
  rows only, from :data:`GRID`, by the mean over the eight metrics of their median |error|
  (the rule ``fit_overheads.py`` step 3 uses; ties keep the earlier grid point); the held-out
  rows are reported, never used to choose;
- ``scores``: per grid point, the fit rows' score and TTFT P50 / P99 median |error| per split;
- ``shape``: per grid point, the median |error| of two numbers ``bench_serving`` prints and the
  score does not use (``sim/data/validation_tails.csv``): the TTFT **mean** and the **longest**
  inter-token gap. They tell the forms apart: a burst whose requests all wait about the same
  ``D`` lifts the mean by ``D x N / prompts``, a front-end ramp by about half that per
  request; both are reported per split, neither is used to choose.

This is a what-if in the replay, not a simulator term: the sourced tokeniser rate (1.1 us a
prompt token, ``sim/data/request_overheads.csv``) gives a burst of 100 ~500-token prompts
55 ms, where the fit needs several ms a request. The simulator's closed loops now take a
request path (``sim.engine.fleet.request_path``), and ``experiments/front_end_path.py``
replays the set with the sourced tokeniser itself.

Invariants: ``s = D = 0`` is the validation's replay bit for bit (``test_ttft_tail.py``); the
burst's delays are ``D + s, D + 2 s, ..., D + N s`` in sending order (``D`` only for
``N > 1``); deterministic (no sampling beyond
the rows' seeded lengths).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

import sim

sys.path.insert(0, str(Path(__file__).resolve().parent))
import server_history as sh  # noqa: E402
import validate_independent as vi  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "sim" / "data" / "ttft_tail.json"
# (s, D) in seconds: the front end alone, the stall alone, then both
GRID = ((0.0, 0.0), (0.002, 0.0), (0.004, 0.0), (0.006, 0.0), (0.008, 0.0), (0.012, 0.0),
        (0.0, 0.15), (0.0, 0.3), (0.0, 0.4), (0.0, 0.5), (0.0, 0.6), (0.002, 0.3),
        (0.004, 0.3))
SHAPE = ("ttft_mean", "itl_max")  # validation_tails.csv's columns, ms (reported, never scored)
TAILS = Path(__file__).resolve().parent.parent / "sim" / "data" / "validation_tails.csv"
TAIL_GPUS = ("B200-HGX", "MI300X")


class _Shifted:
    """A result whose requests are the client's view of a front-end delay (for
    :func:`server_history.measured_summary`)."""

    def __init__(self, res, requests):
        self.requests, self._itl, self.iterations = requests, res._itl, res.iterations


def replay(i: int, s: float, runs: pd.DataFrame | None = None, stall: float = 0.0) -> dict:
    """Run ``i`` of ``runs`` (default: the validation set) on its warm server with the burst's
    front-end delay ``s`` per request and its one-off ``stall`` (``N > 1``): the measured
    summary (:data:`server_history.METRIC_KEYS`, seconds and tokens/s)."""
    for name, x in (("s", s), ("stall", stall)):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not x >= 0:
            raise ValueError(f"{name} must be a number >= 0, got {x!r}")
    runs = vi.load_runs() if runs is None else runs
    r = list(runs.itertuples())[i]
    shape = vi.vs._sharegpt_shape() if r.lengths == "sharegpt-scaled" else None
    cfg = dataclasses.replace(vi.config(r, "fitted"), closed_loop=sh.closed_loop(r.concurrency))
    parts = [vi.workload(h, shape) for h in sh.history(runs, r)] + [vi.workload(r, shape)]
    t0 = 0.0
    if len(parts) > 1:  # as server_history.replay: the warm-up drains before t0
        alone = sim.run(sh.workload(parts[:-1] + [parts[-1].iloc[:0]], 0.0), cfg)
        t0 = 3.0 * float(alone.requests["finish_time"].max()) + 1.0
    wl = sh.workload(parts, t0)
    mine = np.flatnonzero(wl["request_id"].str.startswith("m:").to_numpy())
    burst, later = mine[:int(r.concurrency)], mine[int(r.concurrency):]
    delay = s * np.arange(1, len(burst) + 1) + (stall if len(burst) > 1 else 0.0)
    wl.loc[burst, "arrival_time"] = t0 + delay
    wl.loc[later, "arrival_time"] = t0 + delay.max()  # (sent when a slot frees, after the burst)
    res = sim.run(wl, cfg)
    req = res.requests.copy()
    lag = pd.Series(delay, index=wl["request_id"].iloc[burst])
    extra = req["request_id"].map(lag).fillna(0.0).to_numpy()
    req["ttft"], req["e2e"] = req["ttft"] + extra, req["e2e"] + extra
    out = sh.measured_summary(_Shifted(res, req), t0)
    fin = req[req["request_id"].astype(str).str.startswith("m:")]
    out["ttft_mean"] = float(fin["ttft"].mean())
    out["itl_max"] = float(fin["max_itl"].max())  # (the engine's gaps: the delay moves none)
    return out


def load_tails() -> pd.DataFrame:
    """``sim/data/validation_tails.csv``: the TTFT mean and longest gap per run, checked."""
    t = pd.read_csv(TAILS, comment="#")
    for i, r in t.iterrows():
        if "http" not in str(r.source) or " @ " not in str(r.source):
            raise ValueError(f"validation_tails.csv row {i}: source {r.source!r} names no "
                             f"commit and URL")
    return t.set_index("run_id")


def _job(args):
    i, (s, stall) = args
    return replay(i, s, _RUNS, stall)


_RUNS = None


def _init():
    global _RUNS
    _RUNS = vi.load_runs()


def table(runs: pd.DataFrame, grid=GRID, workers=2) -> pd.DataFrame:
    """One row per (grid point, run, metric the source measured): measured, predicted,
    signed error; ``s`` and ``stall`` name the point."""
    jobs = [(i, g) for g in grid for i in range(len(runs))]
    with ProcessPoolExecutor(workers, initializer=_init) as ex:
        sums = list(ex.map(_job, jobs))
    tails, out = load_tails(), []
    for (i, (s, stall)), summ in zip(jobs, sums):
        r = runs.iloc[i]
        for m in vi.METRICS + SHAPE:
            if m in SHAPE:
                measured = tails[f"{m}_ms"].get(r.run_id, np.nan)
            else:
                measured = r[vi._measured_column(m)]
            if pd.isna(measured):
                continue
            key = "output_token_throughput" if m == "output_throughput" else m
            pred = summ[key] * (1.0 if m == "output_throughput" else 1e3)
            out.append({"s": s, "stall": stall, "run_id": r.run_id, "gpu": r.gpu, "engine": r.engine,
                        "concurrency": int(r.concurrency), "split": r.split, "metric": m,
                        "measured": float(measured), "predicted": float(pred),
                        "error": float(pred / measured - 1.0)})
    return pd.DataFrame(out)


def scores(tab: pd.DataFrame) -> pd.DataFrame:
    """Per grid point (in ``tab``'s order): the fit rows' all-metric score, and TTFT P50 / P99
    median |error| per split."""
    a = tab.assign(a=tab["error"].abs())
    rows = []
    for (s, stall), t in a.groupby(["s", "stall"], sort=False):
        fit = t[(t.split == "fit") & ~t.metric.isin(SHAPE)]
        row = {"s": float(s), "stall": float(stall), "fit_score_all_metrics":
               float(fit.groupby("metric")["a"].median().mean())}
        for m in ("ttft_p50", "ttft_p99") + SHAPE:
            for sp in vi.SPLITS:
                row[f"{m}_{sp}"] = float(t[(t.metric == m) & (t.split == sp)]["a"].median())
        rows.append(row)
    return pd.DataFrame(rows)


def chosen(sc: pd.DataFrame) -> tuple:
    """The ``(s, stall)`` with the smallest fit score (ties: the earlier grid point)."""
    best = sc["fit_score_all_metrics"].min()
    r = sc[sc["fit_score_all_metrics"] <= best + 1e-12].iloc[0]
    return float(r["s"]), float(r["stall"])


def _at(tab, point):
    return tab[(tab.s == point[0]) & (tab.stall == point[1])]


def rows_table(runs: pd.DataFrame, tab: pd.DataFrame, point, workers=2) -> pd.DataFrame:
    """Per run: TTFT P50 / P99 measured, warm, cold and at the chosen ``(s, stall)``."""
    cold = vi.validate(runs, workers, {e: "fitted" for e in runs.engine.unique()}, warm=False)
    pick = lambda t, m: t[t.metric == m].set_index("run_id")["predicted"]  # noqa: E731
    out = []
    for r in runs.itertuples():
        if pd.isna(r.ttft_p99_ms):
            continue
        d = {"run_id": r.run_id, "gpu": r.gpu, "model": r.model, "split": r.split,
             "concurrency": int(r.concurrency), "blocks_before": len(sh.history(runs, r))}
        for m in ("ttft_p50", "ttft_p99"):
            d[f"{m}_measured"] = float(getattr(r, f"{m}_ms"))
            d[f"{m}_warm"] = float(pick(_at(tab, (0.0, 0.0)), m)[r.run_id])
            d[f"{m}_cold"] = float(pick(cold, m)[r.run_id])
            d[f"{m}_what_if"] = float(pick(_at(tab, point), m)[r.run_id])
        for m in SHAPE:  # (the cold replay has no mean: validate reports percentiles)
            t = tab[(tab.metric == m) & (tab.run_id == r.run_id)]
            at = lambda p: t[(t.s == p[0]) & (t.stall == p[1])]  # noqa: E731
            d[f"{m}_measured"] = float(at((0.0, 0.0))["measured"].iloc[0]) if len(t) else None
            d[f"{m}_warm"] = float(at((0.0, 0.0))["predicted"].iloc[0]) if len(t) else None
            d[f"{m}_what_if"] = float(at(point)["predicted"].iloc[0]) if len(t) else None
        d["excess_p99_ms"] = d["ttft_p99_measured"] - d["ttft_p99_warm"]
        out.append(d)
    return pd.DataFrame(out)


def patterns(rows: pd.DataFrame) -> pd.DataFrame:
    """The fit rows' median P99 excess per GPU and concurrency class, and the share of rows
    the warm replay under-predicts."""
    fit = rows[rows.split == "fit"].assign(
        load=np.where(rows[rows.split == "fit"].concurrency > 1, ">=16", "1"))
    g = fit.groupby(["gpu", "load"])
    return g.agg(rows=("excess_p99_ms", "size"), median_excess_p99_ms=("excess_p99_ms",
                                                                       "median"),
                 under_predicted=("excess_p99_ms", lambda x: int((x > 0).sum()))).reset_index()


def per_gpu(tab: pd.DataFrame, point) -> pd.DataFrame:
    """Median |error| per GPU, engine, split and metric, before (``s = D = 0``) and at
    ``point``."""
    return vi.median_abs_columns({"before": _at(tab, (0.0, 0.0)), "after": _at(tab, point)},
                                 ("gpu", "engine", "split", "metric"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="local processes (default 2)")
    ap.add_argument("--write", action="store_true", help=f"store the tables in {OUT}")
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error(f"--workers must be >= 1, got {args.workers}")
    runs = vi.load_runs()
    tab = table(runs, GRID, args.workers)
    sc = scores(tab)
    point = chosen(sc)
    rows = rows_table(runs, tab, point, args.workers)
    by_metric = pd.concat([vi.medians(_at(tab, p), ("metric", "split")).assign(at=at)
                           for at, p in (("before", (0.0, 0.0)), ("after", point))],
                          ignore_index=True)
    parts = {"rows": rows, "patterns": patterns(rows), "scores": sc,
             "by_metric": by_metric, "per_gpu": per_gpu(tab, point)}
    with pd.option_context("display.width", 250, "display.max_rows", 500):
        print(f"chosen: s = {point[0] * 1e3:g} ms per request of the burst, stall "
              f"{point[1] * 1e3:g} ms")
        for name, t in parts.items():
            print(f"\n{name}\n{t.round(3).to_string(index=False)}")
    if args.write:
        OUT.write_text(json.dumps({"chosen_s": point[0], "chosen_stall_s": point[1],
                                   **{k: vi._records(t) for k, t in parts.items()}},
                                  indent=1)
                       + "\n")
    return point, parts


if __name__ == "__main__":
    main()
