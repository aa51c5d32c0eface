"""When does speculative decoding pay? Measured speedup against the cheat sheet's formula.

    python experiments/speculative_breakeven.py [--tokens 2000] [-o DIR]

Part 1, one request alone (Llama-3.1-8B on an H100, roofline cost): for each acceptance rate
alpha, draft length k and draft cost ratio c, the decode speedup (TPOT without speculation /
with) next to ``speculative_speedup(alpha, k, c) = E / (k c + 1)``. Speculation stops paying
where the speedup falls below 1 (low alpha, costly draft, long drafts of a poor draft model).
Part 2, load: the same (alpha, k, c) at rising request rates: verification of k + 1 tokens per
request becomes compute-bound in big batches, and the gain shrinks. Writes
``speculative.csv``, ``speculative_load.csv`` and ``speculative_breakeven.png``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from sim import SpeculativeConfig, speculative_speedup
from sim.engine import run

ALPHAS = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
KS = (1, 3, 5)
RATIOS = (0.02, 0.1, 0.3)
RATES = (1.0, 10.0, 50.0, 200.0, 1000.0)


def _tpot(df, spec, seed=0, **kw):
    return run(df, scheduler="continuous", speculative=spec, seed=seed, **kw).summary()["tpot_mean"]


def alone(tokens=2000, alphas=ALPHAS, ks=KS, ratios=RATIOS):
    df = pd.DataFrame({"arrival_time": [0.0], "num_prompt_tokens": [512],
                       "num_output_tokens": [tokens]})
    base = _tpot(df, None)
    rows = []
    for a in alphas:
        for k in ks:
            for c in ratios:
                spec = SpeculativeConfig(num_speculative_tokens=k, acceptance_rate=a,
                                         draft_cost_ratio=c)
                measured = base / _tpot(df, spec)
                rows.append({"alpha": a, "k": k, "c": c, "speedup": measured,
                             "formula": speculative_speedup(a, k, c),
                             "pays": measured > 1.0})
    return pd.DataFrame(rows)


def under_load(alpha=0.8, k=4, c=0.05, rates=RATES, n=400, seed=0):
    rows = []
    rng = np.random.default_rng(seed)
    for rate in rates:
        df = pd.DataFrame({"arrival_time": np.sort(rng.uniform(0, n / rate, n)),
                           "num_prompt_tokens": 512, "num_output_tokens": 128})
        spec = SpeculativeConfig(num_speculative_tokens=k, acceptance_rate=alpha,
                                 draft_cost_ratio=c)
        off, on = _tpot(df, None), _tpot(df, spec)
        rows.append({"rate": rate, "tpot_off": off, "tpot_on": on, "speedup": off / on,
                     "formula_batch1": speculative_speedup(alpha, k, c)})
    return pd.DataFrame(rows)


def plot(table, load, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.5))
    for (k, c), g in table.groupby(["k", "c"]):
        ax1.plot(g["alpha"], g["speedup"], marker="o", label=f"k={k}, c={c}")
    ax1.axhline(1.0, color="k", lw=1, ls="--")
    ax1.set(xlabel="acceptance rate alpha", ylabel="decode speedup (measured)",
            title="one request: speedup vs acceptance\n(below the dashed line: slower)")
    ax1.legend(fontsize=6, ncol=2)
    ax2.scatter(table["formula"], table["speedup"], c=np.where(table["pays"], "C2", "C3"))
    lim = [0, max(table["formula"].max(), table["speedup"].max()) * 1.05]
    ax2.plot(lim, lim, "k:", lw=1)
    ax2.set(xlabel="speculative_speedup(alpha, k, c)", ylabel="measured",
            title="measured vs formula (red: does not pay)")
    ax3.semilogx(load["rate"], load["speedup"], marker="o", label="measured")
    ax3.axhline(load["formula_batch1"].iloc[0], color="C1", ls=":", label="formula (batch 1)")
    ax3.axhline(1.0, color="k", lw=1, ls="--")
    ax3.set(xlabel="request rate (req/s)", ylabel="TPOT speedup",
            title="under load the gain shrinks\n(verification becomes compute-bound)")
    ax3.legend()
    fig.suptitle("Speculative decoding, Llama-3.1-8B on H100 (roofline)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=2000, help="output tokens of the lone request")
    p.add_argument("-n", type=int, default=400, help="requests per load point (default 400)")
    p.add_argument("-o", "--output", default=None, help="folder for the tables and the plot")
    a = p.parse_args(argv)
    table, load = alone(a.tokens), under_load(n=a.n)
    with pd.option_context("display.float_format", "{:.3f}".format, "display.width", 200):
        print(table.to_string(index=False))
        print(load.to_string(index=False))
    if a.output:
        out = Path(a.output)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "speculative.csv", index=False)
        load.to_csv(out / "speculative_load.csv", index=False)
        plot(table, load, out / "speculative_breakeven.png")
    return table, load


if __name__ == "__main__":
    main()
