"""The machinery every figure of :mod:`sim.results.plots` shares: pyplot imported on first
use, saving, the check of a table's columns and the title that says what was simulated.

Invariants: this is the only module that imports matplotlib (tests/test_layout.py), and only
inside :func:`pyplot`, so importing any figure module loads no matplotlib; with a ``path`` a
figure is saved (110 dpi, the format from the suffix) and closed (:func:`finish`), so batch runs
do not accumulate open figures, and without one it stays open for a notebook; every figure
function returns its figure. Saving first selects the non-interactive Agg backend
(``matplotlib.use("Agg", force=False)``): that is process-wide, so in a notebook it replaces the
inline backend for later plots too. A table without the columns a figure needs raises
``ValueError`` naming them (:func:`need_columns`).
"""

from __future__ import annotations

import os

import numpy as np


def pyplot(headless):
    """pyplot, imported here (never at module import); ``headless``: switch to Agg first."""
    import matplotlib
    if headless:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    return plt


def finish(fig, path, plt):
    """``fig`` saved to ``path`` and closed when a path is given; ``fig`` either way."""
    if path is not None:
        from ..atomic import atomic_path
        try:
            if isinstance(path, (str, os.PathLike)):
                with atomic_path(path) as tmp:  # (a full disk: the previous figure stays)
                    fig.savefig(tmp, dpi=110)
            else:  # a file object (the report's inline figures)
                fig.savefig(path, dpi=110)
        finally:
            plt.close(fig)
    return fig


def need_columns(df, columns, what) -> None:
    """``ValueError`` naming ``what`` and the columns of ``columns`` that ``df`` lacks."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what}: missing column(s) {missing}")


def _name(x, default):
    if x is None:
        return default
    return x if isinstance(x, str) else getattr(x, "name", str(x))


def run_facts(result) -> dict:
    """What was simulated, in words: ``hardware`` (model on GPU, or the cost model when it is
    neither the roofline nor tied to a model), ``fleet`` (``4 replicas``, ``2P:1D`` prefill and
    decode replicas; None for one replica), ``scheduler``, ``rate`` (the workload's mean
    arrival rate, (n - 1) / arrival span; a closed loop's users and think time instead: its
    arrivals follow the completions) and ``n`` (requests)."""
    cfg = result.config
    if cfg.cost_model is None or cfg.model is not None or cfg.gpu is not None:
        hw = f"{_name(cfg.model, 'llama-3.1-8b')} on {_name(cfg.gpu, 'h100')}"
        if getattr(cfg, "tensor_parallel", 1) > 1:
            hw += f" x{cfg.tensor_parallel} (TP)"
        if getattr(cfg, "attention_dp", 1) > 1:  # (a replica of tp x attention_dp GPUs)
            hw += f" x{cfg.attention_dp} (DP attention)"
    else:
        hw = f"cost model {result.cost_model_name}"
    disagg, replicas = getattr(cfg, "disaggregation", None), getattr(cfg, "replicas", 1)
    fleet = (f"{disagg.prefill_replicas}P:{disagg.decode_replicas}D" if disagg is not None
             else f"{replicas} replicas" if replicas > 1 else None)
    loop = getattr(cfg, "closed_loop", None)
    t = np.sort(result.requests["arrival_time"].to_numpy(dtype=np.float64))
    rate = f"{(len(t) - 1) / (t[-1] - t[0]):.3g} req/s" if len(t) > 1 and t[-1] > t[0] else None
    if loop is not None:
        rate = f"{loop.num_users} users" + (f", think {loop.think_time:g} s"
                                            if loop.think_time else "")
    return {"hardware": hw, "fleet": fleet, "scheduler": result.scheduler_name, "rate": rate,
            "n": f"n={len(result.requests):,}"}


def run_title(results) -> str:
    """The facts of :func:`run_facts` shared by every Result of ``results`` (one Result or a
    dict), joined: e.g. ``llama-3.1-8b on h100 · chunked · 4 req/s · n=200``."""
    facts = [run_facts(r) for r in (results.values() if isinstance(results, dict) else [results])]
    keep = [v for k, v in facts[0].items()
            if v is not None and all(f[k] == v for f in facts[1:])]
    return " · ".join(keep)

