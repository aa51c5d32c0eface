"""Statistics and a picture of a workload."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .arrivals import interarrival_cv
from .generators import ideal_prefix_hit_ratio
from .schema import validate


def describe(df: pd.DataFrame) -> dict:
    """Rate, burstiness (inter-arrival CV), length percentiles and the ideal prefix-hit ratio."""
    df = validate(df)
    t = df["arrival_time"].to_numpy()
    span = float(t[-1] - t[0]) if len(t) else 0.0
    out = {"name": df.attrs.get("name", ""), "num_requests": len(df), "span_s": span,
           "mean_rate": (len(df) - 1) / span if span > 0 else float("nan"),
           "interarrival_cv": interarrival_cv(t)}
    per_min = np.bincount(((t - t[0]) // 60).astype(np.int64)) if len(t) else np.zeros(1)
    out["req_per_min_max"] = int(per_min.max())
    for col, short in (("num_prompt_tokens", "prompt"), ("num_output_tokens", "output")):
        v = df[col].to_numpy()
        out[f"{short}_mean"] = float(v.mean()) if len(v) else float("nan")
        for q in (50, 90, 99):
            out[f"{short}_p{q}"] = float(np.percentile(v, q)) if len(v) else float("nan")
        out[f"{short}_max"] = int(v.max()) if len(v) else 0
    if "hash_ids" in df.columns:
        out["block_size"] = df.attrs.get("block_size")
        out["ideal_prefix_hit_ratio"] = ideal_prefix_hit_ratio(df)
    return out


def plot_workload(df: pd.DataFrame, path=None, bin_seconds=None):
    """Arrival rate over time and the prompt/output length histograms (matplotlib, lazy)."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    df = validate(df)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    t = df["arrival_time"].to_numpy()
    span = max(float(t[-1] - t[0]), 1e-9) if len(t) else 1.0
    width = bin_seconds or max(span / 100, 1e-3)
    edges = np.arange(t[0], t[-1] + width, width) if len(t) else np.array([0, 1])
    counts, edges = np.histogram(t, bins=edges)
    axes[0].plot(edges[:-1], counts / width)
    axes[0].set(xlabel="time (s)", ylabel="requests/s", title="arrival rate")
    for ax, col in zip(axes[1:], ("num_prompt_tokens", "num_output_tokens")):
        ax.hist(df[col], bins=60)
        ax.set(xlabel="tokens", ylabel="requests", title=col)
    fig.suptitle(str(df.attrs.get("name", "workload")))
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return fig
