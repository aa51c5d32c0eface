"""What the engines' per-request constant stands for: the first token's time the roofline does
not price, where nothing queues, beside every sourced candidate's size (issue 27).

    python experiments/ttft_residual.py            # prints the tables; writes nothing
    python experiments/ttft_residual.py --write    # also stores sim/data/ttft_residual.json

Input: ``sim/data/validation_runs.csv`` and the roofline-alone replay
``experiments/validate_independent.py --write`` stored (``sim/data/independent_check.json``:
warm server, no engine overheads); no simulation is run here. Per run at concurrency 1 (one
request in the engine at a time: no queue, no batch, no running step to wait for):

- ``residual_ms``: measured TTFT P50 minus the roofline's (the time :mod:`sim.costs.overheads`'
  ``per_request_s`` stands in for);
- the sourced candidates, each from its source, none fitted here: the request path
  (``triton_path``, ``sim/data/request_overheads.csv``' fit rows: an HTTP/gRPC round trip,
  0.54 ms, and the fast tokenizer's 1.1 us per prompt token, x the row's mean prompt); the
  wait for a running step (0: at concurrency 1 none runs; the engine models the wait,
  ``tests/test_first_step_wait.py``); speculative/MTP heads (0: the cookbook pages' launch
  commands are ``--tp 8`` without ``--speculative-algorithm``); the eager (non-CUDA-graph)
  prefill's per-layer gaps (``eager_layer_overhead_s`` x layers: already in the roofline's
  price, shown for scale); ``unexplained_ms`` = residual - request path.

Two shape checks: ``slopes``, per model with concurrency-1 ``fit`` runs at two prompt lengths
(1,000 and 8,000 random: ~610 and ~4,194 mean), the measured TTFT's rise beside the
roofline's and each two-point line's intercept; ``batching``, per ShareGPT page, the measured
TTFT P50 at concurrency 1 beside 100 (one request's prefill against a batch of many).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from sim.costs.roofline import RooflineCost
from sim.costs.roofline_params import fitted_params
from sim.engine.fleet.request_path import triton_path
from sim.specs.models import get_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
import validate_independent as vi  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "sim" / "data"
OUT = DATA / "ttft_residual.json"


def _replayed() -> pd.DataFrame:
    rows = pd.DataFrame(json.loads((DATA / "independent_check.json").read_text())["rows"])
    return rows[rows.metric == "ttft_p50"].set_index("run_id")["predicted"]


def residuals(runs: pd.DataFrame | None = None, predicted: pd.Series | None = None):
    """One row per concurrency-1 run: the residual and every candidate (module docstring)."""
    runs = vi.load_runs() if runs is None else runs
    predicted = _replayed() if predicted is None else predicted
    path = triton_path()
    out = []
    for r in runs[runs.concurrency == 1].itertuples():
        mean_in = r.total_input_tokens / r.num_prompts
        layers = get_model(r.model).num_hidden_layers
        eager = fitted_params(RooflineCost(r.model, r.gpu).gpu_key).eager_layer_overhead_s
        req = (path.in_s + path.out_s + path.per_prompt_token_s * mean_in) * 1e3
        res = r.ttft_p50_ms - predicted[r.run_id]
        out.append({"run_id": r.run_id, "engine": r.engine, "gpu": r.gpu, "model": r.model,
                    "split": r.split, "mean_prompt": mean_in, "layers": layers,
                    "measured_ms": r.ttft_p50_ms, "roofline_ms": predicted[r.run_id],
                    "residual_ms": res, "request_path_ms": req, "first_step_wait_ms": 0.0,
                    "speculative_ms": 0.0, "eager_priced_ms": layers * eager * 1e3,
                    "unexplained_ms": res - req,
                    "unexplained_per_layer_ms": (res - req) / layers})
    return pd.DataFrame(out)


def slopes(res: pd.DataFrame) -> pd.DataFrame:
    """Per model with two prompt lengths among its concurrency-1 ``fit`` rows: the measured
    and the roofline's rise, and each two-point line's intercept (TTFT at 0 prompt tokens)."""
    out = []
    for model, g in res[res.split == "fit"].groupby("model"):
        g = g.sort_values(["mean_prompt", "run_id"])
        if g.mean_prompt.nunique() < 2:
            continue
        lo, hi = g.iloc[0], g.iloc[-1]
        out.append({"model": model, "gpu": lo.gpu, "prompt_lo": lo.mean_prompt,
                    "prompt_hi": hi.mean_prompt,
                    "measured_rise_ms": hi.measured_ms - lo.measured_ms,
                    "roofline_rise_ms": hi.roofline_ms - lo.roofline_ms})
        d = hi.mean_prompt - lo.mean_prompt
        out[-1].update({f"{k}_intercept_ms": lo[f"{k}_ms"] - lo.mean_prompt * out[-1][
            f"{k}_rise_ms"] / d for k in ("measured", "roofline")})
    return pd.DataFrame(out)


def batching(runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per ShareGPT page: measured TTFT P50 at the lowest and the highest concurrency."""
    runs = vi.load_runs() if runs is None else runs
    out = []
    for model, g in runs[runs.lengths == "sharegpt-scaled"].groupby("model"):
        g = g.sort_values("concurrency")
        lo, hi = g.iloc[0], g.iloc[-1]
        out.append({"model": model, "gpu": lo.gpu, "concurrency_lo": int(lo.concurrency),
                    "concurrency_hi": int(hi.concurrency), "ttft_p50_lo_ms": lo.ttft_p50_ms,
                    "ttft_p50_hi_ms": hi.ttft_p50_ms})
    return pd.DataFrame(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help=f"store the tables in {OUT}")
    args = ap.parse_args(argv)
    runs = vi.load_runs()
    res = residuals(runs)
    parts = {"residuals": res, "slopes": slopes(res), "batching": batching(runs)}
    with pd.option_context("display.width", 200):
        for name, t in parts.items():
            print(f"\n{name}\n{t.round(2).to_string(index=False)}")
    if args.write:
        OUT.write_text(json.dumps({k: vi._records(t) for k, t in parts.items()}, indent=1)
                       + "\n")
    return parts


if __name__ == "__main__":
    main()
