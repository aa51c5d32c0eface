"""Validation: does the simulation predict what actually runs?

1. **Executed run** - the engine schedules a workload as usual, but each iteration's cost is the
   wall time of executing that very batch for real (:class:`~sim.executor.ExecutedCost`: GEMMs
   at the profile's model dims and attention over the true paged KV contents).
2. **Simulated run** - the same workload and scheduler priced by the calibrated cost model.
3. Compare: per-iteration error (the calibrated price of each executed batch vs its measured
   time) and the TTFT / E2E / ITL percentiles of the two runs.

The arrival rate defaults to the one at which the calibrated simulation keeps the replica ~60%
busy, so the comparison includes queueing without saturating.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .calibrate import ENGINE, CalibratedCost, engine_workload, rate_for_load
from .engine import run
from .executor import ExecutedCost, Executor
from .kernels import array_module
from .models import ModelConfig

METRICS = ["ttft_p50", "ttft_p90", "ttft_p99", "e2e_p50", "e2e_p90", "e2e_p99", "itl_p50",
           "itl_p99", "tpot_p50", "request_throughput"]


def validate(profile, *, n=1000, rate=None, target_load=0.5, repeats=3,
             scheduler=ENGINE["scheduler"], chunk_size=ENGINE["chunk_size"],
             max_batch_size=ENGINE["max_batch_size"], kv_blocks=ENGINE["kv_blocks"], seed=0,
             device="cpu") -> dict:
    """Execute the workload ``repeats`` times and simulate it once; compare.

    Returns a dict with ``table`` (executed median over repeats, its min-max spread, the
    simulation and the error in %), ``iteration_error`` (calibrated price of each executed
    batch vs its measured time) and the runs themselves. The spread between repeats of the
    same executed schedule is the noise floor of this machine.
    """
    if isinstance(profile, CalibratedCost):
        cost = profile
    elif isinstance(profile, dict):
        cost = CalibratedCost(profile)
    else:
        cost = CalibratedCost.from_file(profile)
    prof = cost.profile
    engine = dict(scheduler=scheduler, chunk_size=chunk_size, max_batch_size=max_batch_size,
                  kv_blocks=kv_blocks, block_size=prof["block_size"], seed=seed)
    if rate is None:
        rate = rate_for_load(cost, n, target_load, **engine)
    df = engine_workload(n, rate, seed)
    xp, device_name = array_module(device)
    model = ModelConfig(**dict(prof["model"]))
    runs, records = [], []
    for k in range(repeats):
        ex = Executor(model, num_blocks=kv_blocks + 64, block_size=prof["block_size"], xp=xp,
                      dtype=prof["dtype"], seed=seed + k)
        ex.execute([("warm", 64, 0)], [])  # first-call costs (allocation, BLAS start-up)
        ex.release("warm")
        executed_cost = ExecutedCost(ex, predictor=cost if k == 0 else None)
        runs.append(run(df, cost_model=executed_cost, **engine))
        if k == 0:
            records = np.asarray(executed_cost.records)
    simulated = run(df, cost_model=cost, **engine)
    ss = simulated.summary()
    per_run = pd.DataFrame([r.summary() for r in runs])[METRICS]
    table = pd.DataFrame({"executed": per_run.median(), "executed_min": per_run.min(),
                          "executed_max": per_run.max(),
                          "simulated": [ss[m] for m in METRICS]}, index=METRICS)
    table["error_pct"] = (table["simulated"] / table["executed"] - 1) * 100
    table["noise_pct"] = (table["executed_max"] - table["executed_min"]) / table["executed"] * 50
    ape = np.abs(records[:, 1] / records[:, 0] - 1) * 100
    return {"table": table, "rate": rate, "requests": n, "repeats": repeats,
            "device": device_name, "profile_device": prof["device"],
            "iterations_executed": len(records),
            "iteration_error": {"median_ape_pct": float(np.median(ape)),
                                "p90_ape_pct": float(np.percentile(ape, 90)),
                                "total_time_error_pct": float((records[:, 1].sum()
                                                               / records[:, 0].sum() - 1) * 100)},
            "busy_fraction_executed": float(np.median([r.summary()["busy_fraction"]
                                                       for r in runs])),
            "executed": runs, "simulated": simulated,
            "per_iteration": runs[0].iterations.assign(predicted=records[:, 1])}


def add_cli(sub):
    p = sub.add_parser("validate", help="simulated vs executed TTFT/E2E on this device")
    p.add_argument("--profile", default=None,
                   help="calibration profile (default: calibrate on this device first)")
    p.add_argument("--budget", type=float, default=60.0,
                   help="calibration seconds when no --profile is given (default 60)")
    p.add_argument("--requests", "-n", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rate", type=float, default=None)
    p.add_argument("--device", choices=["cpu", "gpu", "auto"], default="cpu")
    p.add_argument("--output", "-o", default=None, help="write validation.csv here")
    p.set_defaults(func=_cmd)


def shipped_cpu_profile():
    from importlib import resources
    return resources.files("sim").joinpath("data/profiles/cpu_calibration.json")


def _cmd(args) -> int:
    import json
    from pathlib import Path
    if args.profile:
        profile = json.loads(Path(args.profile).read_text())
    else:  # calibrate now: the machine's speed drifts, so compare against a fresh profile
        from .calibrate import calibrate
        print(f"calibrating on this device for {args.budget:g} s ...")
        profile = calibrate(budget_s=args.budget, device=args.device)
    out = validate(profile, n=args.requests, rate=args.rate, repeats=args.repeats,
                   device=args.device)
    print(f"device {out['device']} (profile from {out['profile_device']}); {out['requests']} "
          f"requests at {out['rate']:.3g} req/s, executed {out['repeats']} times "
          f"({out['iterations_executed']} iterations each), replica busy "
          f"{out['busy_fraction_executed']:.0%}")
    e = out["iteration_error"]
    print(f"per-iteration error: median {e['median_ape_pct']:.1f}%, P90 {e['p90_ape_pct']:.1f}%, "
          f"total time {e['total_time_error_pct']:+.1f}%")
    with pd.option_context("display.float_format", "{:.4g}".format):
        print(out["table"].to_string())
    if args.output:
        Path(args.output).mkdir(parents=True, exist_ok=True)
        out["table"].to_csv(Path(args.output) / "validation.csv")
    return 0
