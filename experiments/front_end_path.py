"""The engines' own front ends on the independent set: the sourced tokeniser in the closed loop
(issue 27).

    python experiments/front_end_path.py            # prints the tables; writes nothing
    python experiments/front_end_path.py --write    # also stores sim/data/front_end_path.json

``bench_serving``'s burst (``--max-concurrency N`` at request rate ``inf``: its first ``N``
requests sent at once) reaches SGLang's scheduler through its TokenizerManager, and vLLM's
through its API server process: one process that tokenises each prompt before the next
(``sim.engine.fleet.request_path.front_end_path``: one FIFO tokeniser at the fast tokenizer's
sourced 1.1 us a prompt token, ``sim/data/request_overheads.csv``'s fit row; no in / out time,
which no source gives for these front ends). Since the simulator's closed loops take a request
path, every row of ``sim/data/validation_runs.csv`` is replayed as
``experiments/validate_independent.py`` does (warm server, the engines' fitted overheads)
three ways:

- ``before``: the validation's replay (``engine_overheads="fitted"``, no path);
- ``path``: the same overheads with the front end's path;
- ``refit``: the path, with the overheads refitted under it on the fit rows
  (``experiments/fit_overheads.py``'s three steps, every replay taking the path: the
  per-request shift is then the shortfall the tokeniser leaves).

Nothing is chosen on the held-out rows: ``refit`` is fitted on the fit rows, and which variant
the validation should use is decided by the fit rows' score (the mean over the eight metrics of
their median |error|, ``fit_overheads.py`` step 3's rule); the held-out columns are reported.
Stored: the refitted terms, the fit scores, the medians per metric and split and per GPU,
engine, split and metric for each variant.

Invariants: ``before`` is ``validate_independent.validate(runs, 2, {e: "fitted"})`` itself;
the path is the sourced one (no number here is fitted but the ``refit`` overheads, on fit
rows); deterministic.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from sim.engine.fleet.request_path import front_end_path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fit_overheads as fo  # noqa: E402
import validate_independent as vi  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "sim" / "data" / "front_end_path.json"
VARIANTS = ("before", "path", "refit")


def paths_for(runs: pd.DataFrame) -> dict:
    """``{engine: sim.RequestPath}``: each engine's own front end, sourced."""
    return {e: front_end_path(e) for e in sorted(runs.engine.unique())}


def tables(runs: pd.DataFrame, workers=2):
    """The three variants' validation tables, the refitted terms and the paths."""
    paths = paths_for(runs)
    fitted = {e: "fitted" for e in runs.engine.unique()}
    _, terms, _ = fo.fit(runs, workers, paths)
    out = {"before": vi.validate(runs, workers, fitted),
           "path": vi.validate(runs, workers, fitted, paths=paths),
           "refit": vi.validate(runs, workers, terms, paths=paths)}
    return out, terms, paths


def fit_score(table: pd.DataFrame) -> float:
    """The fit rows' mean over the metrics of their median |error| (fit_overheads step 3)."""
    return fo._all_metrics_score(table)


def by_metric(tabs: dict) -> pd.DataFrame:
    """Median |error| per metric and split, one column per variant."""
    return vi.median_abs_columns(tabs, ("metric", "split"))


def per_gpu(tabs: dict) -> pd.DataFrame:
    """Median |error| per GPU, engine, split and metric, one column per variant."""
    return vi.median_abs_columns(tabs, ("gpu", "engine", "split", "metric"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="local processes (default 2)")
    ap.add_argument("--write", action="store_true", help=f"store the tables in {OUT}")
    args = ap.parse_args(argv)
    if args.workers < 1:
        ap.error(f"--workers must be >= 1, got {args.workers}")
    runs = vi.load_runs()
    tabs, terms, paths = tables(runs, args.workers)
    scores = {v: fit_score(t) for v, t in tabs.items()}
    best = min(VARIANTS, key=lambda v: scores[v])  # (ties: the earlier variant)
    met, gpu = by_metric(tabs), per_gpu(tabs)
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        for e, p in paths.items():
            print(f"{e}: tokeniser {p.per_prompt_token_s * 1e6:g} us / prompt token; refit "
                  f"per_request_s {terms[e].per_request_s:.4f}, per_seq_s "
                  f"{terms[e].per_seq_s:.6f}, overlap {terms[e].overlap}, per_prefill_iter_s "
                  f"{terms[e].per_prefill_iter_s:.3f}, prefill_host_layer_s "
                  f"{terms[e].prefill_host_layer_s:.5f}, prefill_host_launch_s "
                  f"{terms[e].prefill_host_launch_s:.6f}")
        print("fit score:", {v: round(s, 4) for v, s in scores.items()}, "best:", best)
        print(f"\nby_metric\n{met.round(4).to_string(index=False)}")
        print(f"\nper_gpu\n{gpu.round(4).to_string(index=False)}")
    if args.write:
        OUT.write_text(json.dumps({
            "paths": {e: {"per_prompt_token_s": p.per_prompt_token_s, "in_s": p.in_s,
                          "out_s": p.out_s} for e, p in paths.items()},
            "refit": {e: {"per_request_s": t.per_request_s,
                          "per_request_layer_s": t.per_request_layer_s,
                          "per_seq_s": t.per_seq_s, "overlap": t.overlap,
                          "per_prefill_iter_s": t.per_prefill_iter_s,
                          "prefill_host_layer_s": t.prefill_host_layer_s,
                          "prefill_host_launch_s": t.prefill_host_launch_s}
                      for e, t in terms.items()},
            "fit_scores": scores, "best_on_fit": best,
            "by_metric": vi._records(met), "per_gpu": vi._records(gpu)}, indent=1) + "\n")
    return tabs, terms, scores


if __name__ == "__main__":
    main()
