"""A day of Azure conversation traffic on Llama-3.1-70B, a fixed fleet against an autoscaled
one: GPU-hours, dollars and SLO attainment over the day.

    python experiments/autoscaled_day.py [-o DIR] [--quick] [--hours 24] [--scale 1]
                                         [--model llama-3.1-70b] [--gpu h100] [--tp 2]
                                         [--peak-to-trough 3] [--ttft 1.0] [--target 16]

The day: the Azure LLM inference trace 2023's conversation hour (``azure-conv``, Splitwise,
19,366 requests in 58 min: 5.53 req/s) taken as the peak hour of a diurnal curve
(:func:`workloads.diurnal`, peak at 14:00, ``--peak-to-trough`` 3 by assumption: the trace
covers one hour, not a day; ``--scale`` multiplies its rate), so the mean rate is
``peak x (k + 1) / 2k`` (3.69 req/s, 319,000 requests a day); each arrival takes
the prompt and output lengths of a request of the trace drawn at random (pairs kept). The
fleet (``--model`` Llama-3.1-70B on ``--gpu`` H100s, ``--tp`` 2 per replica, roofline costs,
vLLM's default scheduler):

- **fixed**: the fewest replicas whose day meets the SLO (TTFT <= ``--ttft`` for
  ``--attainment`` of the requests), all paid all day (searched on the busiest hour first,
  then checked over the day);
- **autoscaled**: :class:`sim.Autoscaler` on concurrency (``--target`` requests per replica,
  as the HPA on a KEDA metric), from one replica up to the fixed fleet's size plus one, each
  new replica paid from its start and serving after loading its weights (70 GB per GPU at
  2 GB/s: 35 s), scale-down after 5 minutes of lower demand.

Writes to ``DIR``: ``autoscaled_day.csv`` (one row per fleet: GPU-hours, dollars, cold
starts, peak and mean replicas, attainment), ``over_time.csv`` (per window: rate, replicas
paid, attainment, for both) and ``autoscaled_day.png`` (replicas and rate above, attainment
below). ``--quick``: a day compressed to 15 minutes (the test's size).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

import sim
import workloads

COLUMNS = ["replicas", "gpu_hours", "usd", "cold_start_usd", "peak_replicas", "mean_replicas",
           "slo_attainment", "ttft_p99", "num_finished", "num_rejected"]


def azure_day(hours=24.0, peak_to_trough=3.0, period_hours=24.0, scale=1.0,
              seed=0) -> pd.DataFrame:
    """The day's requests (see the module docstring): :func:`workloads.day_like`."""
    trace = workloads.load("azure-conv")
    return workloads.day_like(trace, hours, peak_rate=scale * workloads.own_rate(trace),
                              peak_to_trough=peak_to_trough,
                              peak_hour=14.0 * period_hours / 24.0,
                              period_hours=period_hours, seed=seed)


def size_fixed(day, config, slo, attainment, most=16):
    """``(replicas, run)``: the fewest fixed replicas whose day meets ``slo``: searched up from
    one on the busiest hour's requests alone (cheap), then up from there over the whole day."""
    t = day["arrival_time"].to_numpy()
    hour = min(3600.0, float(t[-1] - t[0]) / 4)
    counts = np.searchsorted(t, t + hour) - np.arange(len(t))
    start = int(np.argmax(counts))
    busiest = day.iloc[start:start + int(counts[start])].copy()
    busiest["arrival_time"] -= busiest["arrival_time"].iloc[0]
    first = 1
    for first in range(1, most + 1):
        if _fixed(busiest, config, first).summary(slo=slo)["slo_attainment"] >= attainment:
            break
    for n in range(first, most + 1):
        run = _fixed(day, config, n)
        if run.summary(slo=slo)["slo_attainment"] >= attainment:
            return n, run
    raise ValueError(f"no fixed fleet of up to {most} replicas meets {slo}")


def _fixed(df, config, n):
    return sim.run_autoscaled(df, config, sim.Autoscaler(min_replicas=n, max_replicas=n))


def compare(day, config, ttft=1.0, attainment=0.99, target=16.0, scale_down_delay_s=300.0):
    """``(table, {name: AutoscaledRun})``: the fixed fleet and the autoscaled one."""
    slo = {"ttft": ttft}
    n, fixed = size_fixed(day, config, slo, attainment)
    auto = sim.run_autoscaled(day, config, sim.Autoscaler(
        target=target, min_replicas=1, max_replicas=n + 1,
        scale_down_delay_s=scale_down_delay_s))
    runs = {f"fixed {n}": fixed, "autoscaled": auto}
    rows = []
    for name, run in runs.items():
        s = run.summary(slo=slo)
        rows.append({"fleet": name, "replicas": f"{run.policy.min_replicas}-"
                     f"{run.policy.max_replicas}", **{k: s[k] for k in COLUMNS[1:]}})
    return pd.DataFrame(rows).set_index("fleet"), runs


def plot(runs, slo, path, window_s):
    from sim.results.plots.figure import finish, pyplot
    plt = pyplot(True)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    for i, (name, run) in enumerate(runs.items()):
        over = run.over_time(slo, window_s)
        mid = (over["start"] + window_s / 2) / 3600.0
        paid = run.timeline["paid"].to_numpy()  # (a step function: held to the run's end)
        top.step(np.append(run.timeline["time"], run.end) / 3600.0, np.append(paid, paid[-1]),
                 where="post", color=f"C{i}", label=f"{name}: replicas paid")
        bottom.plot(mid, over["slo_attainment"], "-o", ms=3, color=f"C{i}", label=name)
        if i == 0:
            rate = top.twinx()
            rate.plot(mid, over["rate"], color="#888", lw=1)
            rate.set_ylabel("arrivals, req/s (grey)")
    top.set_ylabel("replicas")
    top.legend(loc="upper left", fontsize=8)
    bottom.set_ylim(0, 1.02)
    bottom.set_ylabel(f"share with TTFT <= {slo['ttft']:g} s")
    bottom.set_xlabel("time (h)")
    bottom.legend(fontsize=8)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return finish(fig, path, plt)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", default="autoscaled_day-out", help="output folder")
    ap.add_argument("--quick", action="store_true", help="a day compressed to 15 minutes")
    ap.add_argument("--hours", type=float, default=24.0, help="the day's length (default 24)")
    ap.add_argument("--model", default="llama-3.1-70b", help="default llama-3.1-70b")
    ap.add_argument("--gpu", default="h100", help="GPU of every replica (default h100)")
    ap.add_argument("--tp", type=int, default=2, help="GPUs per replica (default 2)")
    ap.add_argument("--peak-to-trough", type=float, default=3.0, help="default 3")
    ap.add_argument("--scale", type=float, default=1.0, help="x the trace's rate (default 1)")
    ap.add_argument("--ttft", type=float, default=1.0, help="TTFT limit, s (default 1)")
    ap.add_argument("--attainment", type=float, default=0.99, help="default 0.99")
    ap.add_argument("--target", type=float, default=16.0,
                    help="autoscaler: requests in flight per replica (default 16)")
    args = ap.parse_args(argv)
    hours = 0.25 if args.quick else args.hours
    period = hours if args.quick else 24.0
    day = azure_day(hours, args.peak_to_trough, period_hours=period, scale=args.scale)
    config = sim.SimConfig(model=args.model, gpu=args.gpu, tensor_parallel=args.tp)
    table, runs = compare(day, config, args.ttft, args.attainment, args.target,
                          scale_down_delay_s=60.0 if args.quick else 300.0)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "autoscaled_day.csv")
    window = hours * 3600.0 / 48
    slo = {"ttft": args.ttft}
    pd.concat([r.over_time(slo, window).assign(fleet=name) for name, r in runs.items()]
              ).to_csv(out / "over_time.csv", index=False)
    plot(runs, slo, out / "autoscaled_day.png", window)
    with pd.option_context("display.float_format", "{:.4g}".format, "display.width", 200):
        print(f"{len(day)} requests over {hours:g} h, {args.model} on {args.gpu} x {args.tp}\n{table.to_string()}")
    print(f"\nwrote autoscaled_day.csv, over_time.csv, autoscaled_day.png to {out}/")
    return table, runs


if __name__ == "__main__":
    main()
