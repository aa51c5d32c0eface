"""The whole simulator against published serving measurements.

    python experiments/validate_serving.py            # prints the report; writes nothing
    python experiments/validate_serving.py --write    # also stores it in sim/data/serving_check.json

Data: ``sim/data/published_serving.csv``, one row per published figure with its source. Every
row is held out: nothing here is fitted, and no setting was chosen after looking at a
prediction. Each row is a serving run - many requests, continuous batching, a KV pool sized by
the memory budget, the roofline pricing every iteration - replayed with ``sim.run`` and compared
on the metric the source measured. Signed error = predicted / measured - 1.

Scenarios (the ``scenario`` column):

- ``offline``: every request queued at t = 0 (``trtllm-bench throughput``, or a rate of "INF");
- ``poisson``: ``request_rate`` requests/s, Poisson arrivals (seeded; the sources give the rate,
  not the process);
- ``closed_loop``: ``concurrency`` clients, each sending its next prompt when the previous one
  finished (LMDeploy's ``profile_throughput``).

Lengths (the ``lengths`` column): ``fixed`` (the source's dataset has stdev 0, or gives one
length), or ``sharegpt-scaled``: the bundled ShareGPT lengths (``workloads.load("sharegpt")``)
kept as vLLM's benchmark sampler keeps them (prompt 4-1,024 tokens, output >= 4, prompt +
output <= 2,048), then scaled so their means are the row's (the source publishes means, not the
distribution), rounded, at least 1 token.

Metrics: ``output_throughput`` = output tokens over the time from the first arrival to the last
finish (``Result.summary()['output_token_throughput']``); ``ttft_mean``; ``itl_mean``, the mean
gap between tokens (with fixed output lengths the same as the mean TPOT).

Each engine's settings (:data:`ENGINES`) are its documented defaults for the run the source
describes, not fits; what the simulator cannot express is said there. The KV pool comes from the
memory budget: TensorRT-LLM's accounting for its rows (``free_gpu_memory_fraction`` of the memory
left free after the weights, the engine's activations and the rest in use; the fraction its
published runs used, see ``ENGINES``), vLLM's at 0.9 utilisation for LMDeploy's. The TensorRT-LLM
rows run the ``"tensorrt-llm"`` preset (:mod:`sim.engine.presets.tensorrt_llm`): its default
GUARANTEED_NO_EVICT scheduler, which admits a request only when the KV of its whole run fits beside
what every running request still needs, so nothing is preempted; 0.14 behind Triton too, whose
backend defaults to that policy when ``batch_scheduler_policy`` is not set.

Every row runs the number of requests its source ran (30,000 at most; the engine fast-forwards
pure-decode stretches). ``--max-requests`` cuts them for a quick look (the report says how many
rows were cut); ``--write`` stores the full runs, which ``tests/test_serving_fidelity.py``
reruns in part and compares exactly.

``--request-path`` (off by default, never written): the rows whose client reached the engine
through a front end with published timings also get its request path
(:mod:`sim.engine.fleet.request_path`; :data:`REQUEST_PATHS`): Triton's for the TensorRT-LLM 0.14
rows, as if their client sent text (the source does not say). LMDeploy 0.1's client is a
Python thread in the engine's process calling TurboMind, no HTTP or gRPC front end: no path.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

import workloads
from sim import SimConfig, sweep
from sim.costs.roofline import RooflineCost
from sim.costs.roofline_params import fitted_params
from sim.specs.memory_terms import TRTLLM_FREE_GPU_MEMORY_FRACTION

DATA = resources.files("sim").joinpath("data")
OUT = Path(__file__).resolve().parent.parent / "sim" / "data" / "serving_check.json"
MAX_REQUESTS = None  # None: as many requests as the source ran
SEED = 0
COLUMNS = ("metric", "scenario", "engine", "gpu", "model", "tensor_parallel", "weight_dtype",
           "kv_dtype", "input_tokens", "output_tokens", "lengths", "num_requests", "concurrency",
           "request_rate", "unit", "value", "split", "source")
METRICS = {"output_throughput": "output_token_throughput", "ttft_mean": "ttft_mean",
           "itl_mean": "itl_mean"}
SCALE = {"tok/s": 1.0, "s": 1.0, "ms": 1e3}  # from the summary's seconds to the row's unit
SCENARIOS = ("offline", "poisson", "closed_loop")


@dataclasses.dataclass(frozen=True, slots=True)
class EngineSettings:
    """How one engine's published runs map onto the simulator.

    ``max_batch_size=None``: the row's ``concurrency`` (the benchmark sizes the engine's batch
    to its clients). ``cuda_graph_max_batch``: decode-only batches up to this size are priced
    without per-layer launch gaps (``RooflineParams``); ``nccl_only``: no custom all-reduce;
    ``kv_fraction``: the KV pool is TensorRT-LLM's accounting at this ``free_gpu_memory_fraction``
    (``None``: vLLM's at 0.9); ``chunked_context``: TensorRT-LLM's ``enable_chunked_context``
    (``None``: the scheduler's default)."""

    scheduler: str
    max_batch_size: int | None
    token_budget: int | None
    cuda_graph_max_batch: int
    nccl_only: bool
    note: str
    kv_fraction: float | None = None
    chunked_context: bool | None = None


# TensorRT-LLM's engines (0.14, 0.17): decode steps priced without launch gaps, prefills with
# them, the convention experiments/fit_roofline.py prices TensorRT-LLM's static batches with
NO_DECODE_GAPS = 1 << 30
_TRT_POOL = ("GUARANTEED_NO_EVICT reserves each request's prompt + output tokens (the client's "
             "max_tokens taken as the length it gets); the pool is TensorRT-LLM's accounting, "
             "whose activation and other terms are estimates (sim memory --accounting "
             "tensorrt-llm); the dataset heuristics trtllm-bench may apply to max_batch_size "
             "and max_num_tokens are not published")
# trtllm-bench's published runs: "In majority of cases, we also use a higher KV cache percentage
# by setting --kv_cache_free_gpu_mem_fraction 0.95 [...] We fall back to 0.90 if we hit an out of
# memory issue" (perf-overview.md @ 258c7540, v0.17; "In many cases" @ 00f37686, v1.0); which
# rows fell back is not published. Triton's backend: no fraction published, the executor's
# default 0.9 (sim.specs.memory_terms).
TRT_BENCH_FRACTION = 0.95
# trtllm-bench throughput runs with chunked context: "--enable_chunked_context/
# --disable_chunked_context", default=True (tensorrt_llm/bench/benchmark/throughput.py @
# 000a01de66f0eab4ab05640711f0253f50f5209c), so its prompts above max_num_tokens (20,000-token
# rows) run in chunks; the 0.17-era default of that flag is taken to be the same (not checked).
ENGINES = {
    # v1.0, PyTorch backend (perf-overview.md @ 00f37686): trtllm-bench's chunked context, the
    # LLM API's default max_batch_size 2048 and max_num_tokens 8192 (trtllm-bench may choose
    # others from the dataset's statistics; not published), CUDA graphs for batches 1-8,192
    # (its llm_options.yml), TensorRT-LLM's own custom all-reduce.
    "tensorrt-llm-1.0": EngineSettings("tensorrt-llm", 2048, 8192, 8192, False, _TRT_POOL,
                                       TRT_BENCH_FRACTION, chunked_context=True),
    # v0.17 engines built by trtllm-bench (perf-overview.md @ 258c7540): its example run prints
    # "Max Runtime Batch Size: 4096, Max Runtime Tokens: 8192, Scheduling Policy: Guaranteed No
    # Evict"; the build's dataset heuristics may choose other limits per row (not published).
    "tensorrt-llm-0.17": EngineSettings("tensorrt-llm", 4096, 8192, NO_DECODE_GAPS, False,
                                        _TRT_POOL, TRT_BENCH_FRACTION, chunked_context=True),
    # v0.14 behind Triton's TensorRT-LLM backend (same file): trtllm-build's defaults
    # (max_batch_size 2048, max_num_tokens 8192), enable_chunked_context off (the backend's
    # default; every prompt of these rows is below 8,192); the backend's batch_scheduler_policy
    # defaults to GUARANTEED_NO_EVICT (model_instance_state.cc,
    # sim.engine.presets.tensorrt_llm); the client's and server's own time per request (HTTP, tokenisation) is not modelled.
    "tensorrt-llm-0.14-triton": EngineSettings("tensorrt-llm", 2048, 8192, NO_DECODE_GAPS, False,
                                               _TRT_POOL + "; Triton's request path is not "
                                               "modelled", TRTLLM_FREE_GPU_MEMORY_FRACTION),
    # LMDeploy 0.1 TurboMind: continuous batching of whole prompts, its batch set to the
    # benchmark's concurrency, NCCL all-reduce only (as experiments/fit_roofline.py prices it).
    "lmdeploy-0.1-turbomind": EngineSettings(
        "continuous", None, None, 512, True,
        "TurboMind's own per-iteration cost and CUDA graphs are not modelled: the roofline's "
        "fixed costs are vLLM's (default capture rule); the client's time is not modelled"),
}


# engine -> the request path of the front end its published runs went through (by name in
# sim.engine.fleet.request_path), for --request-path
REQUEST_PATHS = {"tensorrt-llm-0.14-triton": "triton_path"}


def load_rows() -> pd.DataFrame:
    """The published rows, checked: every column present, every row sourced, split and
    complete for its scenario."""
    with DATA.joinpath("published_serving.csv").open() as f:
        rows = pd.read_csv(f)
    missing = [c for c in COLUMNS if c not in rows.columns]
    if missing:
        raise ValueError(f"published_serving.csv lacks columns {missing}")
    for i, r in rows.iterrows():
        if not isinstance(r.source, str) or (" @ " not in r.source and "http" not in r.source):
            raise ValueError(f"published_serving.csv row {i}: source {r.source!r} names no "
                             f"repository commit or URL")
        if r.split not in ("fit", "held-out"):
            raise ValueError(f"published_serving.csv row {i}: split {r.split!r}")
        if r.engine not in ENGINES or r.metric not in METRICS or r.unit not in SCALE:
            raise ValueError(f"published_serving.csv row {i}: engine {r.engine!r}, metric "
                             f"{r.metric!r} or unit {r.unit!r} unknown")
        needs = {"offline": (), "poisson": ("request_rate",), "closed_loop": ("concurrency",)}
        if r.scenario not in needs or any(pd.isna(r[k]) for k in needs[r.scenario]):
            raise ValueError(f"published_serving.csv row {i}: scenario {r.scenario!r} without "
                             f"its {needs.get(r.scenario, SCENARIOS)}")
    return rows


def _sharegpt_shape() -> tuple[np.ndarray, np.ndarray]:
    df = workloads.load("sharegpt", rate=1.0)
    p, o = df["num_prompt_tokens"].to_numpy(), df["num_output_tokens"].to_numpy()
    keep = (p >= 4) & (o >= 4) & (p <= 1024) & (p + o <= 2048)
    return p[keep], o[keep]


def requests_run(row, max_requests=MAX_REQUESTS) -> int:
    """The requests ``row`` runs: the source's count, at most ``max_requests``."""
    n = int(row.num_requests)
    return n if max_requests is None else min(n, int(max_requests))


def workload(row, max_requests=MAX_REQUESTS, shape=None) -> pd.DataFrame:
    """The row's requests (see the module docstring), deterministic in :data:`SEED`."""
    n = requests_run(row, max_requests)
    rng = np.random.default_rng(SEED)
    if row.lengths == "fixed":
        p = np.full(n, int(row.input_tokens))
        o = np.full(n, int(row.output_tokens))
    elif row.lengths == "sharegpt-scaled":
        sp, so = shape if shape is not None else _sharegpt_shape()
        pick = rng.integers(0, len(sp), n)
        p = np.maximum(1, np.rint(sp[pick] * (row.input_tokens / sp.mean()))).astype(int)
        o = np.maximum(1, np.rint(so[pick] * (row.output_tokens / so.mean()))).astype(int)
    else:
        raise ValueError(f"lengths {row.lengths!r} unknown")
    times = (workloads.poisson(n, float(row.request_rate), rng) if row.scenario == "poisson"
             else np.zeros(n))
    return pd.DataFrame({"arrival_time": times, "num_prompt_tokens": p, "num_output_tokens": o})


def config(row, request_path=False, engine_overheads=None) -> SimConfig:
    """The simulator's settings for ``row``: its engine's (:data:`ENGINES`), model, GPU,
    tensor parallelism and precisions; the roofline with the engine's graph and all-reduce
    rules; the KV pool by the engine's memory accounting; ``request_path``: its front end's
    (:data:`REQUEST_PATHS`), where it has one; ``engine_overheads``: an ``EngineOverheads``
    for every row (none of these engines has fitted terms: an assumption to test)."""
    cfg = _config(row)
    if engine_overheads is not None:
        cfg = dataclasses.replace(cfg, engine_overheads=engine_overheads)
    if request_path and row.engine in REQUEST_PATHS:
        from sim.engine.fleet import request_path as paths
        cfg = dataclasses.replace(cfg, request_path=getattr(paths, REQUEST_PATHS[row.engine])())
    return cfg


def _config(row) -> SimConfig:
    e = ENGINES[row.engine]
    params = fitted_params(RooflineCost(row.model, row.gpu).gpu_key)
    params = dataclasses.replace(params, cuda_graph_max_batch=e.cuda_graph_max_batch)
    if e.nccl_only:
        params = dataclasses.replace(params, custom_allreduce_max_bytes=0)
    tp = int(row.tensor_parallel)
    cost = RooflineCost(row.model, row.gpu, tensor_parallel=tp, weight_dtype=row.weight_dtype,
                        kv_dtype=row.kv_dtype, params=params)
    closed = row.scenario == "closed_loop"
    batch = e.max_batch_size or int(row.concurrency)
    # (the tensorrt-llm preset sizes its pool with TensorRT-LLM's accounting at kv_fraction,
    # activations for its max_num_tokens; vLLM's at 0.9 for the others)
    return SimConfig(scheduler=e.scheduler, cost_model=cost, model=row.model, gpu=row.gpu,
                     tensor_parallel=tp, weight_dtype=row.weight_dtype, kv_dtype=row.kv_dtype,
                     max_batch_size=batch, token_budget=e.token_budget,
                     free_gpu_memory_fraction=e.kv_fraction,
                     enable_chunked_context=e.chunked_context,
                     closed_loop=workloads.ClosedLoop(int(row.concurrency)) if closed else None)


RUN_KEY = ("scenario", "engine", "gpu", "model", "tensor_parallel", "weight_dtype", "kv_dtype",
           "input_tokens", "output_tokens", "lengths", "num_requests", "concurrency",
           "request_rate")


def _plain(x):
    return None if pd.isna(x) else x


def validate(rows: pd.DataFrame, max_requests=MAX_REQUESTS, workers=1,
             request_path=False, engine_overheads=None) -> pd.DataFrame:
    """Predicted vs measured for each row. Rows of one run (same workload and settings, another
    metric) share it; the runs go through :func:`sim.sweep` (``workers`` local processes; each
    run is deterministic, so the table does not depend on them). ``request_path``: see the
    module docstring; ``engine_overheads``: see :func:`config`."""
    shape = _sharegpt_shape() if (rows["lengths"] == "sharegpt-scaled").any() else None
    keys, jobs = {}, []
    for r in rows.itertuples():
        key = tuple(_plain(getattr(r, k)) for k in RUN_KEY)
        if key not in keys:
            keys[key] = len(jobs)
            jobs.append({"workload": workload(r, max_requests, shape),
                         "config": {"config": config(r, request_path, engine_overheads)}})
    summaries = sweep(jobs, workers=workers, progress=False).to_dict(orient="records")
    out = []
    for r in rows.itertuples():
        summary = summaries[keys[tuple(_plain(getattr(r, k)) for k in RUN_KEY)]]
        predicted = summary[METRICS[r.metric]] * SCALE[r.unit]
        out.append({"row": r.Index, "metric": r.metric, "engine": r.engine, "gpu": r.gpu,
                    "model": r.model, "tp": r.tensor_parallel, "in": r.input_tokens,
                    "out": r.output_tokens, "concurrency": _plain(r.concurrency),
                    "rate": _plain(r.request_rate), "requests": requests_run(r, max_requests),
                    "published_requests": r.num_requests, "measured": r.value,
                    "predicted": predicted, "error": predicted / r.value - 1.0,
                    "split": r.split, "rejected": summary["num_rejected"],
                    "preempted": summary["num_preemptions"]})
    return pd.DataFrame(out)


def report(table: pd.DataFrame) -> pd.DataFrame:
    """Median, P90 and worst |error| per engine, metric and split."""
    g = table.assign(abs_error=table["error"].abs()).groupby(["engine", "metric", "split"])
    return g.agg(rows=("error", "size"), median_abs_error=("abs_error", "median"),
                 p90_abs_error=("abs_error", lambda e: float(np.percentile(e, 90))),
                 worst=("error", lambda e: e.loc[e.abs().idxmax()])).reset_index()


def _records(table: pd.DataFrame) -> list:
    """Rows as JSON-able dicts (a missing value as null, not NaN)."""
    return table.astype(object).where(table.notna(), None).to_dict(orient="records")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-requests", type=int, default=MAX_REQUESTS,
                    help="requests per run at most (default: as many as the source ran)")
    ap.add_argument("--workers", type=int, default=2,
                    help="local processes running the simulations (default 2)")
    ap.add_argument("--write", action="store_true", help=f"store the report in {OUT}")
    ap.add_argument("--request-path", action="store_true",
                    help="add the published front end's request path to the rows that have "
                         "one (Triton's; see sim.engine.fleet.request_path); not with --write")
    ap.add_argument("--engine-overheads", default=None, metavar="SPEC",
                    help="every row with these engine overheads, as sim run --engine-overheads "
                         "writes them (REQUEST_MS,ITER_US,SEQ_US,sync|overlap; none of these "
                         "engines has fitted ones); not with --write")
    args = ap.parse_args(argv)
    overheads = None
    if args.engine_overheads is not None:
        from sim.cli.table_overheads import engine_overheads as spec
        try:
            overheads = spec("--engine-overheads", args.engine_overheads)
        except ValueError as e:
            ap.error(str(e))
    if args.write and overheads is not None:
        ap.error("--write stores the check as configured: drop --engine-overheads")
    if args.max_requests is not None and args.max_requests < 1:
        ap.error(f"--max-requests must be >= 1, got {args.max_requests}")
    if args.write and args.request_path:
        ap.error("--write stores the check as configured: drop --request-path")
    if args.write and args.max_requests is not None:
        ap.error("--write stores the full runs as configured: drop --max-requests")
    t = time.perf_counter()
    if args.workers < 1:
        ap.error(f"--workers must be >= 1, got {args.workers}")
    table = validate(load_rows(), args.max_requests, args.workers, args.request_path,
                     overheads)
    summary = report(table)
    with pd.option_context("display.width", 220, "display.max_rows", 1000):
        print(table.round({"predicted": 4, "error": 4}).to_string(
            index=False))
        print()
        print(summary.round(4).to_string(index=False))
        cut = table[table["requests"] < table["published_requests"]]
        print(f"\n{len(cut)} row(s) ran fewer requests than published; "
              f"wall {time.perf_counter() - t:.1f} s")
        print("\nNot modelled, per engine:")
        for name in sorted(set(table["engine"])):
            print(f"  {name}: {ENGINES[name].note}")
    if args.write:
        lists = {k: ",\n".join("  " + json.dumps(x) for x in _records(t))
                 for k, t in (("rows", table), ("summary", summary))}
        OUT.write_text(f'{{"seed": {SEED},\n "rows": [\n{lists["rows"]}\n ],\n'
                       f' "summary": [\n{lists["summary"]}\n ]}}\n')  # one row a line
    return table, summary


if __name__ == "__main__":
    main()
