"""The summary's keys of a run with KV offload tiers (``SimConfig.kv_offload``).

- ``offload_hit_rate``: prompt tokens of the finished requests loaded from the tiers at first
  admission over their prompt tokens (the tiers' share of ``prefix_hit_rate``, which counts
  them as cached: GPU hit + tier hit);
- ``offload_bytes_stored`` / ``offload_bytes_loaded``: bytes written to the tiers (GPU
  evictions or write-through, demotions and promotions between tiers) and read from them
  into the GPU (loads), all replicas, per GPU's share of a block;
- a chain (:class:`~sim.engine.kv.tiers.KVTierChain`), per tier ``k`` (0: the first under the
  GPU): ``offload_tier{k}_hit_rate`` (tokens loaded from it, every load, over the finished
  requests' prompt tokens), ``offload_tier{k}_bytes_written`` / ``..._bytes_read``;
- ``load_time_mean`` / ``load_time_p99``: seconds a finished request waited for loads (0
  for those that loaded nothing); the per-request ``load_time`` column has them all;
- the TTFT of the finished requests split, in the mean, into ``ttft_queue_mean`` (arrival to
  first admission: ``queueing_delay``), ``ttft_load_mean`` (``load_time``) and
  ``ttft_prefill_mean`` (the rest: prefill iterations, waits between chunks); the three sum to
  ``ttft_mean``.
"""

from __future__ import annotations

import numpy as np


def offload_metrics(req, fin, prompt, traffic) -> dict:
    """The keys above from the requests (``req``), the finished ones (``fin``), their prompt
    tokens and the tiers' ``(stored, loaded[, per tier])`` bytes (None: not recorded)."""
    loads = fin["load_time"].to_numpy()
    stored, loaded = traffic[:2] if traffic is not None else (float("nan"), float("nan"))
    out = {
        "offload_hit_rate": (float(fin["num_offload_tokens"].sum()) / prompt
                             if prompt else float("nan")),
        "offload_bytes_stored": float(stored),
        "offload_bytes_loaded": float(loaded),
        "load_time_mean": float(loads.mean()) if loads.size else float("nan"),
        "load_time_p99": float(np.percentile(loads, 99)) if loads.size else float("nan"),
    }
    for k, (written, read, tokens) in enumerate(traffic[2] if traffic is not None and
                                                len(traffic) > 2 else ()):
        out[f"offload_tier{k}_hit_rate"] = tokens / prompt if prompt else float("nan")
        out[f"offload_tier{k}_bytes_written"] = float(written)
        out[f"offload_tier{k}_bytes_read"] = float(read)
    nan = float("nan")
    queue = fin["queueing_delay"].to_numpy()
    ttft = fin["ttft"].to_numpy()
    out["ttft_queue_mean"] = float(queue.mean()) if queue.size else nan
    out["ttft_load_mean"] = out["load_time_mean"]
    out["ttft_prefill_mean"] = float((ttft - queue - loads).mean()) if ttft.size else nan
    return out
