"""The summary's keys of a run with a KV offload tier (``SimConfig.kv_offload``).

- ``offload_hit_rate``: prompt tokens of the finished requests loaded from the tier at first
  admission over their prompt tokens (the tier's share of ``prefix_hit_rate``, which counts
  them as cached: GPU hit + tier hit);
- ``offload_bytes_stored`` / ``offload_bytes_loaded``: bytes written to the tier (GPU
  evictions) and read from it (loads), all replicas, per GPU's share of a block;
- ``load_time_mean`` / ``load_time_p99``: seconds a finished request waited for loads (0
  for those that loaded nothing); the per-request ``load_time`` column has them all.
"""

from __future__ import annotations

import numpy as np


def offload_metrics(req, fin, prompt, traffic) -> dict:
    """The keys above from the requests (``req``), the finished ones (``fin``), their prompt
    tokens and the tiers' ``(stored, loaded)`` bytes (None: not recorded)."""
    loads = fin["load_time"].to_numpy()
    stored, loaded = traffic if traffic is not None else (float("nan"), float("nan"))
    return {
        "offload_hit_rate": (float(fin["num_offload_tokens"].sum()) / prompt
                             if prompt else float("nan")),
        "offload_bytes_stored": float(stored),
        "offload_bytes_loaded": float(loaded),
        "load_time_mean": float(loads.mean()) if loads.size else float("nan"),
        "load_time_p99": float(np.percentile(loads, 99)) if loads.size else float("nan"),
    }
