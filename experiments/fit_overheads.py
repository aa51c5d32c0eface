"""Fit each engine's overheads (:mod:`sim.costs.overheads`) on the independent set's fit split.

    python experiments/fit_overheads.py            # prints the fit and its check; writes nothing
    python experiments/fit_overheads.py --write    # also stores sim/data/engine_overheads.json

Only the ``fit`` rows of ``sim/data/validation_runs.csv`` are used to choose a value; the
``held_out`` rows are replayed once, with the chosen terms, and reported - never used to choose.
Per engine:

1. the per-request shift (closed form), in one of two forms: ``per_request_s``, the median
   over the engine's fit rows of measured minus predicted TTFT P50 with the roofline alone (a
   time every request pays outside the engine's iterations shifts each percentile by
   itself), or ``per_request_layer_s``, the median of that shortfall per layer of the row's
   model (``experiments/ttft_residual.py``: what the shift stands for grows with the model's
   layers, not the request); each at least 0. The form with the smaller median |error| of the
   fit rows' TTFT P50 (roofline plus the shift alone) is kept; ties keep ``per_request_s``.
   Closed-loop rows only (more prompts than clients): a run that sends every prompt at once
   (GPUStack's saturation blocks, 1,000 prompts at request rate inf) queues all but its first
   batch by construction, so its first-token shortfall is the queue's (seconds, from a
   throughput miss), not a time each request pays (first fitted over them, vLLM's shift came
   out 68.7 ms a layer, 2.5 s for a 36-layer model at concurrency 1);
2. the per-iteration CPU term ``per_seq_s`` and its form (``overlap`` False: added to the GPU's
   time; True: the step is the longer of the two): a grid search over :data:`PER_SEQ_GRID` x
   both forms, with ``per_request_s`` applied, minimising the median |error| over the fit rows'
   non-TTFT metrics (TPOT, ITL, E2E, throughput); ties keep the smaller term and the
   synchronous form. ``per_iter_s`` stays 0 (the roofline has its own fixed cost per
   iteration, fitted on NVIDIA's tables).
3. the fixed time per iteration holding prefill work, ``per_prefill_iter_s``
   (``experiments/ttft_residual.py``: the concurrency-1 TTFT residual is an intercept, not a
   slope): a grid search over :data:`PREFILL_GRID`, each value ``p`` taken out of the flat
   shift (``per_request_s = max(0, shift - p)``: at concurrency 1 a request is one prefill
   iteration, so those rows keep their TTFT), step 2's ``per_seq_s`` and form held, minimising
   the mean over the eight metrics of the fit rows' median |error| (every metric weighs the
   same: the term moves TTFT one way and E2E / ITL P99 / throughput the other); ties keep the
   smaller term. Only for an engine whose shift is flat (the per-layer form keeps p = 0).
   Step 3 runs with step 2b's host term held.
2b. (before step 3) the host's time per layer of a prefill iteration, ``prefill_host_layer_s``
   (a prefill iteration takes at least ``layers x`` it: the launches of a forward outside CUDA
   graphs, the GPU behind them; ``experiments/ttft_residual.py``'s intercept and flat slope):
   a grid search over :data:`HOST_GRID`, each value with the shift re-derived under it (step
   1's median, in step 1's form, of the fit rows replayed with the host term and step 2's CPU
   term, the shift 0), scored as step 3 (the mean over the eight metrics of the fit rows'
   median |error|); a larger term is kept only where it beats every smaller one by at least
   :data:`MIN_GAIN` (a flat score, such as the vLLM blog's two fit rows gave alone - their
   20,000-token prompts keep every prefill GPU-bound - keeps the smallest: no term is
   fitted to noise).
   The same in a second form, ``prefill_host_launch_s`` over :data:`LAUNCH_GRID` (the floor
   is ``launches x`` it, the model's kernel launches counted from SGLang's model files:
   :mod:`sim.specs.prefill_launches`, so an MLA or Gated DeltaNet layer weighs more than a
   GQA one); the per-launch form is kept only where its score beats the per-layer form's by
   :data:`MIN_GAIN` (one form per engine, the other 0).

The roofline under both steps is each GPU's as shipped (``fitted_params``: the profiled
terms, and a GPU's own published kernel terms, ``sim/data/gpu_kernel_fit.json``): the
overheads absorb what the roofline misses, so they are refitted whenever those terms change
(with MI300X's own kernels SGLang's ``per_seq_s`` went 120 -> 100 us; ``per_request_s``, a
median over the fit rows, stayed 76.5 ms).

Printed and stored: the terms, and the median |error| per metric and split before (roofline
alone) and after; the lead decides from the held-out columns whether they become defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from sim.costs.overheads import EngineOverheads
from sim.specs.models import get_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
import validate_independent as vi  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "sim" / "data" / "engine_overheads.json"
PREFILL_GRID = (0.0, 0.02, 0.04, 0.06, 0.08, 0.1)
MIN_GAIN = 0.001  # step 2b: 0.1 percentage point of the fit score
HOST_GRID = tuple(float(x) for x in np.round(np.arange(0.0, 0.00251, 0.00025), 6))
LAUNCH_GRID = tuple(float(x) for x in np.round(np.arange(0.0, 6.1e-5, 5e-6), 7))
HOST_GRIDS = {"prefill_host_layer_s": HOST_GRID, "prefill_host_launch_s": LAUNCH_GRID}
PER_SEQ_GRID = tuple(float(x) for x in np.round(np.arange(0.0, 0.00041, 0.00002), 6))
SOURCE = ("fitted by experiments/fit_overheads.py on the fit split of "
          "sim/data/validation_runs.csv (SGLang cookbook, vLLM blog, GPUStack performance "
          "lab)")


@functools.lru_cache(maxsize=1)
def _bursts() -> frozenset:
    """The runs that send every prompt at once (prompts <= clients: request rate inf, no
    concurrency cap), whose first tokens wait in the engine's queue by construction."""
    runs = vi.load_runs()
    return frozenset(runs.run_id[runs.num_prompts <= runs.concurrency])


def _shift_rows(base: pd.DataFrame, engine: str) -> pd.DataFrame:
    """Step 1's rows: ``engine``'s fit rows' TTFT P50, closed loops only (a burst's TTFT
    shortfall is its queue's, not a time each request pays)."""
    t = base[(base.engine == engine) & (base.split == "fit") & (base.metric == "ttft_p50")
             & ~base.run_id.isin(_bursts())]
    if t.empty:
        raise ValueError(f"{engine} has no closed-loop fit row to derive its shift from")
    return t


def per_request(base: pd.DataFrame, engine: str) -> float:
    """Step 1's first form: the median TTFT P50 shortfall (seconds) on ``engine``'s
    closed-loop fit rows."""
    t = _shift_rows(base, engine)
    return max(0.0, float(np.median(t.measured - t.predicted)) / 1e3)


def per_request_layer(base: pd.DataFrame, engine: str) -> float:
    """Step 1's second form: the median TTFT P50 shortfall per layer of the row's model
    (seconds) on ``engine``'s closed-loop fit rows."""
    t = _shift_rows(base, engine)
    layers = t.model.map(lambda m: get_model(m).num_hidden_layers)
    return max(0.0, float(np.median((t.measured - t.predicted) / layers)) / 1e3)


def _ttft_score(base: pd.DataFrame, engine: str, ov: EngineOverheads) -> float:
    """Step 1's rows' TTFT P50 median |error| with the roofline plus ``ov``'s shift alone."""
    t = _shift_rows(base, engine)
    lag = t.model.map(lambda m: ov.request_s(get_model(m).num_hidden_layers)) * 1e3
    return float(((t.predicted + lag) / t.measured - 1).abs().median())


def shift(base: pd.DataFrame, engine: str) -> EngineOverheads:
    """Step 1: the per-request shift in the form that fits the fit rows' TTFT P50 better."""
    flat = EngineOverheads(per_request_s=per_request(base, engine), source=SOURCE)
    layered = EngineOverheads(per_request_layer_s=per_request_layer(base, engine),
                              source=SOURCE)
    return layered if _ttft_score(base, engine, layered) < _ttft_score(base, engine, flat) \
        else flat


def _score(table: pd.DataFrame) -> float:
    t = table[(table.split == "fit") & ~table.metric.str.startswith("ttft")]
    return float(t["error"].abs().median())


def fit(runs: pd.DataFrame, workers=1, paths=None):
    """The terms per engine and the table per candidate's fit score (steps 1 and 2);
    ``paths``: ``{engine: sim.RequestPath}`` every replay of the fit takes (its time outside
    the engine is then not the shift's to absorb: experiments/front_end_path.py)."""
    base = vi.validate(runs, workers, paths=paths)
    terms, scores = {}, []
    for engine in sorted(runs.engine.unique()):
        rows = runs[(runs.engine == engine) & (runs.split == "fit")]
        req = shift(base, engine)
        best = None
        for overlap in (False, True):
            for k in PER_SEQ_GRID:
                ov = dataclasses.replace(req, per_seq_s=k, overlap=overlap)
                s = _score(vi.validate(rows, workers, {engine: ov}, runs_all=runs,
                                       paths=paths))
                scores.append({"engine": engine, "overlap": overlap, "per_seq_s": k,
                               "fit_score": s})
                if best is None or s < best[0] - 1e-12:
                    best = (s, ov)
        host, host_scores = prefill_host_form(rows, runs, engine, best[1], workers, paths)
        terms[engine], split = prefill_split(rows, runs, engine, host, workers, paths)
        scores += host_scores + split
    return base, terms, pd.DataFrame(scores)


def _reshift(table: pd.DataFrame, engine: str, ov: EngineOverheads) -> EngineOverheads:
    """``ov`` with its shift re-derived (step 1's median, in ``ov``'s form) from ``table``, a
    replay of the fit rows with ``ov``'s other terms and no shift."""
    if ov.per_request_layer_s:
        return dataclasses.replace(ov, per_request_s=0.0,
                                   per_request_layer_s=per_request_layer(table, engine))
    return dataclasses.replace(ov, per_request_s=per_request(table, engine),
                               per_request_layer_s=0.0)


def prefill_host(rows, runs, engine, ov, workers=1, paths=None, field="prefill_host_layer_s"):
    """Step 2b in one form (``field``: ``prefill_host_layer_s`` over :data:`HOST_GRID` or
    ``prefill_host_launch_s`` over :data:`LAUNCH_GRID`): ``ov`` with the smallest value that
    no larger one beats by :data:`MIN_GAIN` on the fit ``rows``, its shift re-derived under
    it; its score; and one score row per candidate."""
    best, scores = None, []
    for h in HOST_GRIDS[field]:
        bare = dataclasses.replace(ov, per_request_s=0.0, per_request_layer_s=0.0, **{field: h})
        cand = _reshift(vi.validate(rows, workers, {engine: bare}, runs_all=runs, paths=paths),
                        engine, dataclasses.replace(ov, **{field: h}))
        s = _all_metrics_score(vi.validate(rows, workers, {engine: cand}, runs_all=runs,
                                           paths=paths))
        scores.append({"engine": engine, "form": field, field: h,
                       "per_request_s": cand.per_request_s,
                       "per_request_layer_s": cand.per_request_layer_s,
                       "fit_score_all_metrics": s})
        if best is None or s < best[0] - MIN_GAIN:
            best = (s, cand)
    return best[1], best[0], scores


def prefill_host_form(rows, runs, engine, ov, workers=1, paths=None):
    """Step 2b: both forms fitted; the one with the better fit score kept (ties, and gains
    under :data:`MIN_GAIN`, keep the per-layer form); and every candidate's score row."""
    layer, s_layer, scores = prefill_host(rows, runs, engine, ov, workers, paths)
    launch, s_launch, more = prefill_host(rows, runs, engine, ov, workers, paths,
                                          "prefill_host_launch_s")
    return (launch if s_launch < s_layer - MIN_GAIN else layer), scores + more


def _all_metrics_score(table: pd.DataFrame) -> float:
    t = table[table.split == "fit"]
    return float(t.assign(a=t["error"].abs()).groupby("metric")["a"].median().mean())


def prefill_split(rows, runs, engine, ov, workers=1, paths=None):
    """Step 3: ``ov`` with the ``per_prefill_iter_s`` of :data:`PREFILL_GRID` that fits the
    fit ``rows`` best, taken out of its flat shift; and one score row per candidate."""
    best, scores = None, []
    for p in PREFILL_GRID if not ov.per_request_layer_s else (0.0,):
        cand = dataclasses.replace(ov, per_prefill_iter_s=p,
                                   per_request_s=max(0.0, ov.per_request_s - p))
        s = _all_metrics_score(vi.validate(rows, workers, {engine: cand}, runs_all=runs,
                                           paths=paths))
        scores.append({"engine": engine, "overlap": ov.overlap, "per_seq_s": ov.per_seq_s,
                       "per_prefill_iter_s": p, "fit_score_all_metrics": s})
        if best is None or s < best[0] - 1e-12:
            best = (s, cand)
    return best[1], scores


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="local processes (default 2)")
    ap.add_argument("--write", action="store_true", help=f"store the fit in {OUT}")
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error(f"--workers must be >= 1, got {args.workers}")
    runs = vi.load_runs()
    base, terms, scores = fit(runs, args.workers)
    after = vi.validate(runs, args.workers, terms)
    before_m, after_m = vi.medians(base, ("metric", "split")), vi.medians(after, ("metric",
                                                                                  "split"))
    both = before_m.merge(after_m, on=("metric", "split", "rows"), suffixes=("_before",
                                                                           "_after"))
    for e, t in terms.items():
        print(f"{e}: per_request_s {t.per_request_s:.4f}, per_request_layer_s "
              f"{t.per_request_layer_s:.6f}, per_seq_s {t.per_seq_s:.6f}, overlap {t.overlap}, "
              f"per_prefill_iter_s {t.per_prefill_iter_s:.3f}, prefill_host_layer_s "
              f"{t.prefill_host_layer_s:.5f}, prefill_host_launch_s "
              f"{t.prefill_host_launch_s:.6f}")
    print(both.round(4).to_string(index=False))
    if args.write:
        out = {"source": SOURCE,
               "engines": {e: {"per_request_s": t.per_request_s,
                               "per_request_layer_s": t.per_request_layer_s,
                               "per_iter_s": t.per_iter_s, "per_seq_s": t.per_seq_s,
                               "overlap": t.overlap,
                               "per_prefill_iter_s": t.per_prefill_iter_s,
                               "prefill_host_layer_s": t.prefill_host_layer_s,
                               "prefill_host_launch_s": t.prefill_host_launch_s}
                           for e, t in terms.items()},
               "shift_forms": [{"engine": e, "per_request_s": per_request(base, e),
                                "per_request_layer_s": per_request_layer(base, e),
                                "fit_ttft_p50_flat": _ttft_score(base, e, EngineOverheads(
                                    per_request_s=per_request(base, e))),
                                "fit_ttft_p50_per_layer": _ttft_score(base, e, EngineOverheads(
                                    per_request_layer_s=per_request_layer(base, e))),
                                "chosen": ("per_request_layer_s" if terms[e].per_request_layer_s
                                           else "per_request_s")} for e in terms],
               "prefill_split": vi._records(
                   scores[scores.per_prefill_iter_s.notna()].dropna(axis=1, how="all")),
               "prefill_host": vi._records(
                   scores[scores.form.notna()].dropna(axis=1, how="all")),
               "by_metric": vi._records(both),
               "by_gpu_after": vi._records(vi.medians(after, ("gpu", "split"))),
               "by_engine_after": vi._records(vi.medians(after, ("engine", "split")))}
        OUT.write_text(json.dumps(out, indent=1) + "\n")
    return terms, both


if __name__ == "__main__":
    main()
