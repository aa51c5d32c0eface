"""``sim calibrate`` (time the kernels on this device, write a profile) and ``sim validate``
(simulated vs executed latencies on this device).

Both check their inputs before the minutes of timing start: the flag values, ``--device gpu``
(a usable CUDA GPU through CuPy), the profile file and that the output can be written."""

from __future__ import annotations

import sys
from pathlib import Path

from ..checks import plural
from .arguments import number, output_file, output_folder, preset, read_profile


def check_device(device) -> None:
    """``--device gpu`` on a machine without a usable CUDA GPU is a user error, not a crash."""
    if device != "gpu":
        return
    from ..costs.kernels import array_module
    try:
        array_module("gpu")
    except RuntimeError:
        raise ValueError("--device gpu: no CUDA GPU is usable through CuPy on this machine "
                         "(install the 'gpu' extra on a machine with an NVIDIA GPU, or use "
                         "--device cpu or auto)") from None


def progress_line(p) -> str:
    """The line ``sim calibrate`` (and ``sim validate``, calibrating) prints on stderr for a
    :class:`~sim.tools.calibration.CalibrationProgress`: after each timing pass, and as the
    in-engine fit begins."""
    if p.stage == "engine":
        return (f"calibrating: {plural(p.passes, 'pass', 'passes')} timed in "
                f"{p.elapsed_s:.1f} s; fitting the weights on an executed engine run of "
                f"{plural(p.num_requests, 'request')} ...")
    return (f"calibrating: pass {p.passes}: {plural(p.num_ops, 'op')} timed, "
            f"{p.elapsed_s:.1f} s of the {p.budget_s:g} s budget")


def print_progress(p) -> None:
    print(progress_line(p), file=sys.stderr, flush=True)


def cmd_calibrate(args) -> int:
    """``sim calibrate``: time, fit, check the quality gate, write the profile (with the gate's
    verdict). Exit status 1 when the gate fails, unless ``--accept`` (then recorded as
    accepted)."""
    from ..costs.timing import save_profile
    from ..tools.calibration import calibrate
    check_device(args.device)
    output_file(args.output, "--output")
    if args.model is not None:
        from ..specs.models import get_model
        preset(get_model, args.model, "--model")
    profile = calibrate(args.model, budget_s=args.budget, device=args.device, dtype=args.dtype,
                        on_progress=print_progress)
    q = profile["quality"]
    q["accepted"] = bool(args.accept and not q["passed"])
    save_profile(profile, args.output)
    print(f"device {profile['device']} ({profile['array_library']}), model "
          f"{profile['model']['name']}, {plural(profile['passes'], 'pass', 'passes')} in "
          f"{profile['seconds']} s")
    for op, e in profile["heldout_error"].items():
        print(f"  {op:<18} held-out error: median {e['median_ape_pct']:.1f}%  "
              f"P90 {e['p90_ape_pct']:.1f}%  ({plural(e['points'], 'point')})")
    e, w = profile["iteration_error"], profile["weights"]
    print(f"  {'engine iterations':<18} error: median {e['median_ape_pct']:.1f}%  P90 "
          f"{e['p90_ape_pct']:.1f}%")
    print("  weights in engine iterations: " + ", ".join(f"{k} {v:.3g}" for k, v in w.items()))
    print(f"wrote {args.output}")
    if q["passed"]:
        print(f"quality gate passed (held-out median <= {q['max_heldout_median_ape_pct']:g}%, "
              f"in-engine median <= {q['max_iteration_median_ape_pct']:g}%)")
        return 0
    print("quality gate FAILED: " + "; ".join(q["failures"]), file=sys.stderr)
    if args.accept:
        print("accepted (--accept); the profile records it", file=sys.stderr)
        return 0
    print("the profile records the failure; recalibrate on an idle machine (or a larger "
          "--budget), or pass --accept to keep it", file=sys.stderr)
    return 1


def cmd_validate(args) -> int:
    """``sim validate``: calibrate (or read ``--profile``), then execute and simulate the same
    workload and print the errors; ``--output`` gets ``validation.csv``."""
    import pandas as pd

    from ..tools.validation import validate_profile
    check_device(args.device)
    if args.output:
        output_folder(args.output, "--output")
    if args.profile:
        profile = read_profile(args.profile)
    else:  # calibrate now: the machine's speed drifts, so compare against a fresh profile
        from ..tools.calibration import calibrate
        print(f"calibrating on this device for {args.budget:g} s ...")
        profile = calibrate(budget_s=args.budget, device=args.device,
                            on_progress=print_progress)
    out = validate_profile(profile, n=args.requests, rate=args.rate, repeats=args.repeats,
                           device=args.device)
    print(f"device {out['device']} (profile from {out['profile_device']}); {out['requests']} "
          f"requests at {out['rate']:.3g} req/s, executed {plural(out['repeats'], 'time')} "
          f"({plural(out['iterations_executed'], 'iteration')} each), replica busy "
          f"{out['busy_fraction_executed']:.0%}")
    e = out["iteration_error"]
    print(f"per-iteration error: median {e['median_ape_pct']:.1f}%, P90 {e['p90_ape_pct']:.1f}%, "
          f"total time {e['total_time_error_pct']:+.1f}%")
    with pd.option_context("display.float_format", "{:.4g}".format):
        print(out["table"].to_string())
    if args.output:
        Path(args.output).mkdir(parents=True, exist_ok=True)
        out["table"].to_csv(Path(args.output) / "validation.csv")
        print(f"wrote {Path(args.output) / 'validation.csv'}")
    return 0


def add_parsers(sub):
    p = sub.add_parser("calibrate", help="time the real kernels on this device; write a profile")
    p.add_argument("--budget", type=number(float), default=120.0, metavar="SECONDS",
                   help="time to spend timing the kernels, > 0 (default 120); at least 3 "
                        "passes over them, so longer where a pass takes more than a third of "
                        "it (a loaded machine), then an engine run to fit the weights")
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto",
                   help="where to time (default auto: a GPU with CuPy if present, else the CPU)")
    p.add_argument("--model", default=None,
                   help="model preset such as llama-3.1-8b (default: a small 2-layer CPU "
                        "model)")
    p.add_argument("--dtype", default=None, help="array dtype (default float32)")
    p.add_argument("--output", "-o", default="profile.json", metavar="JSON",
                   help="the profile file to write (default profile.json)")
    p.add_argument("--accept", action="store_true",
                   help="exit 0 even when the quality gate fails; the profile records it "
                        "(default: exit 1)")
    p.set_defaults(func=cmd_calibrate)
    p = sub.add_parser("validate", help="simulated vs executed TTFT/E2E on this device")
    p.add_argument("--profile", default=None, metavar="JSON",
                   help="calibration profile (default: calibrate on this device first)")
    p.add_argument("--budget", type=number(float), default=60.0, metavar="SECONDS",
                   help="calibration seconds when no --profile is given, > 0 (default 60)")
    p.add_argument("--requests", "-n", type=number(int), default=1000,
                   help="requests in the workload, >= 1 (default 1000)")
    p.add_argument("--repeats", type=number(int), default=3,
                   help="executed runs, >= 1 (default 3)")
    p.add_argument("--rate", type=number(float), default=None, metavar="REQ_PER_S",
                   help="requests/s, > 0 (default: the rate keeping the replica ~50%% busy)")
    p.add_argument("--device", choices=["cpu", "gpu", "auto"], default="cpu",
                   help="where to execute (default cpu)")
    p.add_argument("--output", "-o", default=None, metavar="FOLDER",
                   help="write validation.csv into this folder (default: print only)")
    p.set_defaults(func=cmd_validate)
