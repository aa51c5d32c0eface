"""The simulator against an independent set of measured serving runs, per metric and split.

    python experiments/validate_independent.py            # prints the report; writes nothing
    python experiments/validate_independent.py --write    # also stores sim/data/independent_check.json

Data: ``sim/data/validation_runs.csv`` (its header states the source, what was left out and
why, and the split rule), one row per measured run with its whole setup: engine and version,
GPU, tensor parallelism, precisions, the benchmark's length sampler, prompts, concurrency, and
the TTFT / TPOT / ITL / E2E percentiles and output throughput the benchmark printed. None of it
is in the other checks' data (``published_serving.csv``, ``published_latency.csv``), and nothing
in the cost model was fitted to it: the ``fit`` split is what a later fit may use, ``held_out``
what it must not.

Replay: each row is a closed loop of ``concurrency`` clients (``sglang.bench_serving
--max-concurrency``, request rate ``inf``) over ``num_prompts`` requests, through the engine's
preset (``"sglang"``, ``"vllm"``) with the roofline at the GPU's fitted parameters, the row's model, TP and
precisions. A cookbook block that ran after others on the same server (the CSV's
``server`` column) is replayed after them, its radix prefix cache as they left it: the same
seed gives prompt ``i`` of every block the same ShareGPT text, so a later block finds its first
prompts' prefixes cached (:mod:`server_history`; ``--cold``: every row on a fresh server).
Lengths: ``sglang-random`` draws them exactly as ``bench_serving``'s random sampler
does (numpy's legacy ``RandomState`` seeded with the row's ``seed``: inputs ``randint(1,
input_len + 1)``, then outputs ``randint(output_min, output_len + 1)``; a 0-token output runs as
1);
``sharegpt-scaled`` is experiments/validate_serving.py's ShareGPT shape scaled to the row's
mean lengths (``total_*_tokens / num_prompts``); ``vllm-sharegpt`` is ``vllm bench serve``'s
ShareGPT sampler's rules (:func:`workloads.vllm_sharegpt`: its shuffle with the row's
``seed`` and its length filter over the bundled ShareGPT subset and token counts: the same
rules and length distribution, not the same conversations) scaled the same way (the served model's tokenizer
and its stops at EOS set the published totals); ``vllm-random`` is ``vllm bench serve``'s
random sampler's distribution (:func:`vllm_random_lengths`).

Metrics: signed error = predicted / measured - 1 for ``ttft_p50/p99``, ``tpot_p50/p99``,
``itl_p50/p99``, ``e2e_p50`` and ``output_throughput`` (the summary's ``*_p50``/``*_p99`` in ms
and ``output_token_throughput``). The report: the median |error| per metric and split, and per
GPU and engine (all metrics pooled). ``--write`` also stores how often the 90 % error band
(``SimConfig(bands=0.9)``) holds the measurement, per split and metric, with the roofline alone
and with the engines' fitted overheads (:mod:`sim.costs.overheads`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

import workloads
from sim import SimConfig, sweep
from sim.costs.overheads import EngineOverheads
from sim.costs.roofline import RooflineCost
from sim.costs.roofline_params import fitted_params

sys.path.insert(0, str(Path(__file__).resolve().parent))
import server_history as sh  # noqa: E402  (the warm server)
import validate_serving as vs  # noqa: E402  (the ShareGPT shape)

DATA = resources.files("sim").joinpath("data")
OUT = Path(__file__).resolve().parent.parent / "sim" / "data" / "independent_check.json"
METRICS = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99", "e2e_p50",
           "output_throughput")
ENGINE_PRESETS = {"sglang": "sglang", "vllm": "vllm"}
LENGTHS = ("sglang-random", "vllm-random", "sharegpt-scaled", "vllm-sharegpt")
SPLITS = ("fit", "held_out")
BAND_LEVEL = 0.9  # the band whose coverage --write stores
REQUIRED = ("run_id", "engine", "engine_version", "gpu", "model", "tensor_parallel",
            "weight_dtype", "kv_dtype", "lengths", "num_prompts", "concurrency",
            "total_input_tokens", "total_output_tokens", "split", "source")


def load_runs() -> pd.DataFrame:
    """The measured runs, checked: every column present, every row sourced, split and with a
    known engine and length sampler."""
    with DATA.joinpath("validation_runs.csv").open() as f:
        rows = pd.read_csv(f, comment="#")
    missing = [c for c in REQUIRED + tuple(m + ("" if m == "output_throughput" else "_ms")
                                           for m in METRICS) if c not in rows.columns]
    if missing:
        raise ValueError(f"validation_runs.csv lacks columns {missing}")
    for i, r in rows.iterrows():
        if "http" not in str(r.source) or " @ " not in str(r.source):
            raise ValueError(f"validation_runs.csv row {i}: source {r.source!r} names no commit "
                             f"and URL")
        if r.split not in SPLITS or r.engine not in ENGINE_PRESETS or r.lengths not in LENGTHS:
            raise ValueError(f"validation_runs.csv row {i}: split {r.split!r}, engine "
                             f"{r.engine!r} or lengths {r.lengths!r} unknown")
    return rows


def sglang_random_lengths(n, input_len, output_len, output_min, seed):
    """``sglang.bench_serving``'s random lengths (range ratio 0): inputs, then outputs (an output
    may be 0 tokens; :func:`workload` runs it as 1)."""
    state = np.random.RandomState(int(seed))
    p = state.randint(1, int(input_len) + 1, size=int(n))
    o = state.randint(int(output_min), int(output_len) + 1, size=int(n))
    return p, o


def vllm_random_lengths(n, input_len, output_len, range_ratio, seed):
    """``vllm bench serve``'s random lengths: ``U[floor(L (1 - r)), ceil(L (1 + r))]`` each,
    inputs then outputs, from ``np.random.default_rng(seed)`` (the prompts' tokens, drawn by
    the tool in between, are not: the draws are the tool's distribution, not its exact values)."""
    rng = np.random.default_rng(int(seed))
    lo = lambda x: max(1, math.floor(x * (1 - range_ratio)))  # noqa: E731
    hi = lambda x: math.ceil(x * (1 + range_ratio))  # noqa: E731
    p = rng.integers(lo(input_len), hi(input_len) + 1, size=int(n))
    o = rng.integers(lo(output_len), hi(output_len) + 1, size=int(n))
    return p, o


@functools.lru_cache(maxsize=None)
def _vllm_sharegpt(n, seed):
    """``(prompts, outputs)`` of :func:`workloads.vllm_sharegpt` (read-only arrays), drawn once
    per ``(n, seed)``: a fit replays the same rows a hundred times, each draw reading the
    bundled counts again (33 ms)."""
    w = workloads.vllm_sharegpt(n, seed=seed)
    p, o = w["num_prompt_tokens"].to_numpy(), w["num_output_tokens"].to_numpy()
    p.flags.writeable = o.flags.writeable = False
    return p, o


def _scaled(p, o, row, of_p, of_o):
    """Lengths ``p``, ``o`` times the row's mean prompt and output over the means ``of_p``,
    ``of_o`` (of the lengths they were drawn from), at least 1 token each."""
    n = len(p)
    mean_p, mean_o = row.total_input_tokens / n, row.total_output_tokens / n
    return (np.maximum(1, np.rint(p * (mean_p / of_p))).astype(int),
            np.maximum(1, np.rint(o * (mean_o / of_o))).astype(int))


def workload(row, shape=None) -> pd.DataFrame:
    """The row's requests, all queued at t = 0 (the closed loop paces them)."""
    n = int(row.num_prompts)
    if row.lengths == "sglang-random":
        p, o = sglang_random_lengths(n, row.input_len, row.output_len, row.output_min, row.seed)
        o = np.maximum(o, 1)
    elif row.lengths == "vllm-random":
        p, o = vllm_random_lengths(n, row.input_len, row.output_len, row.range_ratio, row.seed)
    elif row.lengths == "vllm-sharegpt":  # the tool's rules' draw, scaled to the totals
        p, o = _vllm_sharegpt(n, int(row.seed))
        p, o = _scaled(p, o, row, p.mean(), o.mean())
    else:
        sp, so = shape if shape is not None else vs._sharegpt_shape()
        pick = np.random.default_rng(int(row.seed)).integers(0, len(sp), n)
        p, o = _scaled(sp[pick], so[pick], row, sp.mean(), so.mean())
    return pd.DataFrame({"arrival_time": np.zeros(n), "num_prompt_tokens": p,
                         "num_output_tokens": o})


def config(row, overheads: EngineOverheads | str | None = None, path=None) -> SimConfig:
    """The engine's preset, the roofline at the GPU's fitted parameters, the row's setup;
    ``overheads``: the run's ``SimConfig(engine_overheads=...)`` (``"fitted"``, an
    ``EngineOverheads`` or None: ``"none"``; :mod:`sim.engine.engine_overheads`); ``path``:
    its ``request_path`` (a ``sim.RequestPath`` or None)."""
    tp = int(row.tensor_parallel)
    params = fitted_params(RooflineCost(row.model, row.gpu).gpu_key)
    cost = RooflineCost(row.model, row.gpu, tensor_parallel=tp, weight_dtype=row.weight_dtype,
                        kv_dtype=row.kv_dtype, params=params)
    return SimConfig(scheduler=ENGINE_PRESETS[row.engine], cost_model=cost, model=row.model,
                     gpu=row.gpu, tensor_parallel=tp, weight_dtype=row.weight_dtype,
                     kv_dtype=row.kv_dtype,
                     closed_loop=workloads.ClosedLoop(int(row.concurrency)),
                     engine_overheads=overheads, request_path=path)


def front_end(runs: pd.DataFrame):
    """``(overheads, paths)`` per engine of ``runs`` for ``--front-end``: each engine's sourced
    tokenising front end (``request_path.front_end_path``) and the overheads refitted under it
    on the fit rows, as ``experiments/front_end_path.py --write`` stored them
    (``sim/data/front_end_path.json``)."""
    from sim.engine.fleet.request_path import front_end_path
    with DATA.joinpath("front_end_path.json").open() as f:
        refit = json.load(f)["refit"]
    engines = sorted(runs.engine.unique())
    missing = [e for e in engines if e not in refit]
    if missing:
        raise ValueError(f"front_end_path.json has no refit for {missing}")
    ov = {e: EngineOverheads(**refit[e], source="refitted with the front end's path by "
                             "experiments/front_end_path.py") for e in engines}
    return ov, {e: front_end_path(e) for e in engines}


def _measured_column(metric):
    return metric if metric == "output_throughput" else f"{metric}_ms"


def _predicted(summary, metric):
    if metric == "output_throughput":
        return summary["output_token_throughput"]
    return summary[metric] * 1e3


class _Inline:
    """A one-process stand-in for an executor (``map`` in order)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @staticmethod
    def map(f, items):
        return map(f, items)


def _replay(job):
    parts, config, bands = job
    return sh.replay(parts, config, bands)


def validate(rows: pd.DataFrame, workers=1, overheads=None, bands=None, warm=True,
             runs_all=None, paths=None) -> pd.DataFrame:
    """One row per (run, metric) the source measured: measured, predicted, signed error.
    ``overheads``: ``{engine: EngineOverheads or "fitted"}`` (:func:`config`: the run's
    ``engine_overheads`` setting, whose summary is the client's view). ``bands``: each run also with
    ``SimConfig(bands=...)`` (:mod:`sim.engine.bands`); the table then has ``lo``, ``hi`` and
    ``covered`` (the measurement inside ``[lo, hi]``). ``warm`` (default): a row whose server
    ran earlier blocks first (:mod:`server_history`, looked up in ``runs_all``, default
    ``rows``) is replayed after them, its prefix cache as the benchmark found it; False: every
    row on a cold server. ``paths``: ``{engine: sim.RequestPath}``, each run's
    ``request_path`` (the warm-up blocks take it too; experiments/front_end_path.py)."""
    runs_all = rows if runs_all is None else runs_all
    shape = vs._sharegpt_shape() if (rows["lengths"] == "sharegpt-scaled").any() else None
    ov = [None if overheads is None else overheads.get(r.engine) for r in rows.itertuples()]
    path = [None if paths is None else paths.get(r.engine) for r in rows.itertuples()]
    cfgs = [config(r, o, p) for r, o, p in zip(rows.itertuples(), ov, path)]
    if bands is not None:
        cfgs = [dataclasses.replace(c, bands=bands) for c in cfgs]
    hist = [sh.history(runs_all, r) if warm else [] for r in rows.itertuples()]
    cold = [i for i, h in enumerate(hist) if not h]
    jobs = [{"workload": workload(r, shape), "config": {"config": c}}
            for i, (r, c) in enumerate(zip(rows.itertuples(), cfgs)) if i in cold]
    summaries = [None] * len(rows)
    for i, s in zip(cold, sweep(jobs, workers=workers, progress=False).to_dict(
            orient="records") if jobs else []):
        summaries[i] = s
    warm_jobs = [(i, [workload(h, shape) for h in hist[i]] + [workload(r, shape)],
                  dataclasses.replace(cfgs[i], closed_loop=sh.closed_loop(r.concurrency)))
                 for i, r in enumerate(rows.itertuples()) if hist[i]]
    with ProcessPoolExecutor(workers) if workers > 1 and warm_jobs else _Inline() as pool:
        done = pool.map(_replay, [(p, c, bands) for _, p, c in warm_jobs])
        for (i, _, _), s in zip(warm_jobs, done):
            summaries[i] = s
    out = []
    for r, s in zip(rows.itertuples(), summaries):
        for m in METRICS:
            measured = getattr(r, _measured_column(m))
            if pd.isna(measured):
                continue
            pred = _predicted(s, m)
            row = {"run_id": r.run_id, "engine": r.engine, "gpu": r.gpu, "model": r.model,
                   "concurrency": int(r.concurrency), "metric": m, "split": r.split,
                   "measured": float(measured), "predicted": float(pred),
                   "error": float(pred / measured - 1.0)}
            if bands is not None:
                lo, hi = (_predicted(s, f"{m}_{end}") if m != "output_throughput" else
                          s[f"output_token_throughput_{end}"] for end in ("lo", "hi"))
                row.update(lo=float(lo), hi=float(hi), covered=bool(lo <= measured <= hi))
            out.append(row)
    return pd.DataFrame(out)


def medians(table: pd.DataFrame, by) -> pd.DataFrame:
    """Rows and median |error| (and median signed error) per ``by``."""
    g = table.assign(abs_error=table["error"].abs()).groupby(list(by))
    return g.agg(rows=("error", "size"), median_abs_error=("abs_error", "median"),
                 median_error=("error", "median")).reset_index()


def median_abs_columns(tables: dict, by) -> pd.DataFrame:
    """Median |error| per ``by``, one column per entry of ``tables`` (name -> a table of
    :func:`validate`'s rows): variants of a replay side by side."""
    parts = [t.assign(a=t["error"].abs()).groupby(list(by))["a"].median().rename(name)
             for name, t in tables.items()]
    return pd.concat(parts, axis=1).reset_index()


def report(table: pd.DataFrame) -> dict:
    """The medians the docs show: per metric and split, per GPU / engine and split."""
    return {"by_metric": medians(table, ("metric", "split")),
            "by_gpu": medians(table, ("gpu", "split")),
            "by_engine": medians(table, ("engine", "split"))}


def _records(table):
    return table.astype(object).where(table.notna(), None).to_dict(orient="records")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="local processes (default 2)")
    ap.add_argument("--write", action="store_true", help=f"store the report in {OUT}")
    ap.add_argument("--overheads", action="store_true",
                    help="add each engine's fitted overheads (sim/data/engine_overheads.json)")
    ap.add_argument("--bands", type=float, default=None,
                    help="also report the coverage of this error band (e.g. 0.9)")
    ap.add_argument("--cold", action="store_true",
                    help="replay every row on a fresh server (no earlier blocks' cache)")
    ap.add_argument("--front-end", action="store_true",
                    help="each engine's sourced tokenising front end (a request path) with "
                         "the overheads refitted under it (sim/data/front_end_path.json)")
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error(f"--workers must be >= 1, got {args.workers}")
    if args.write and (args.overheads or args.bands is not None or args.cold or args.front_end):
        ap.error("--write stores the warm roofline alone: drop --overheads, --bands, --cold, "
                 "--front-end")
    if args.overheads and args.front_end:
        ap.error("--front-end brings its own refitted overheads: drop --overheads")
    runs = load_runs()
    ov = ({e: "fitted" for e in runs.engine.unique()} if args.overheads else None)
    paths = None
    if args.front_end:
        ov, paths = front_end(runs)
    table = validate(runs, args.workers, ov, args.bands, warm=not args.cold, paths=paths)
    rep = report(table)
    with pd.option_context("display.width", 200, "display.max_rows", 1000):
        print(table.round(4).to_string(index=False))
        for name, t in rep.items():
            print(f"\n{name}\n{t.round(4).to_string(index=False)}")
        if args.bands is not None:
            print(f"\ncoverage of the {args.bands:.0%} band")
            print(table.groupby(["split", "metric"])["covered"].agg(["size", "mean"]).round(3))
            print(table.groupby("split")["covered"].agg(["size", "mean"]).round(3))
    if args.write:  # plus the 90 % band's coverage, roofline alone and with the overheads
        cover = []
        for name, o in (("roofline", None), ("overheads", {e: "fitted"
                                                          for e in runs.engine.unique()})):
            t = validate(runs, args.workers, o, BAND_LEVEL)
            g = t.groupby(["split", "metric"])["covered"].agg(rows="size", coverage="mean")
            cover += [{"model": name, "level": BAND_LEVEL, **r} for r in _records(
                pd.concat([g.reset_index(), t.groupby("split")["covered"].agg(
                    rows="size", coverage="mean").reset_index().assign(metric="all")]))]
        parts = {"rows": table, **rep, "band_coverage": pd.DataFrame(cover)}
        body = ",\n".join(f' "{k}": [\n' + ",\n".join("  " + json.dumps(x) for x in _records(t))
                          + "\n ]" for k, t in parts.items())
        OUT.write_text("{\n" + body + "\n}\n")  # one row a line
    return table, rep


if __name__ == "__main__":
    main()
