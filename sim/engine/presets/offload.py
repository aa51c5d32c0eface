"""KV offload presets: vLLM's native CPU offload, LMCache, SGLang HiCache.

:func:`offload_preset` builds a :class:`~sim.engine.kv.tiers.KVTierChain` from the rows of
``sim/data/offload_presets.csv`` (one row per tier, each citing its source: the framework's
documented defaults - write policy, chunk size, eviction - and the medium's bandwidth and
latency). The capacities are the user's (a deployment's choice, not the framework's): the
first tier's ``gb``, and ``lower_gb`` for a preset's second tier (LMCache's local disk,
HiCache's L3 storage; 0: left out).

Invariant (tests/test_tiers.py): every preset's tiers and chain settings are those rows'.
"""

from __future__ import annotations

import csv
import io
from importlib import resources

from ..kv.offload import KVTier
from ..kv.tiers import KVTierChain


def preset_rows() -> dict:
    """``{preset: [row per tier, in order]}`` from the data file."""
    text = resources.files("sim").joinpath("data/offload_presets.csv").read_text()
    out = {}
    for row in csv.DictReader(io.StringIO(text)):
        out.setdefault(row["preset"], []).append(row)
    return out


OFFLOAD_PRESETS = ("vllm", "lmcache", "hicache")


def offload_preset(name: str, gb: float, lower_gb: float = 0.0, **chain) -> KVTierChain:
    """The chain of preset ``name`` (``OFFLOAD_PRESETS``) with a first tier of ``gb`` GB per
    GPU and, where the preset has one, a second of ``lower_gb``; ``chain``: fields of
    :class:`KVTierChain` to override (``write_policy="write_back"``)."""
    rows = preset_rows()
    if name not in rows:
        raise ValueError(f"kv_offload preset must be one of {', '.join(sorted(rows))}, got "
                         f"{name!r}")
    tiers = rows[name]
    if lower_gb and len(tiers) < 2:
        raise ValueError(f"kv_offload preset {name!r} has one tier: lower_gb must be 0, got "
                         f"{lower_gb!r}")
    made = []
    for row, capacity in zip(tiers, (gb, lower_gb)):
        if row is not tiers[0] and not capacity:
            break
        made.append(KVTier(capacity, float(row["read_gbps"]), float(row["write_gbps"]),
                           float(row["latency_s"]), row["eviction"]))
    head = tiers[0]
    fields = dict(write_policy=head["write_policy"], write_threshold=int(head["write_threshold"]),
                  link_gbps=float(head["link_gbps"]), chunk_tokens=int(head["chunk_tokens"]),
                  load_threshold=int(head["load_threshold"]),
                  prefetch_threshold=int(head["prefetch_threshold"]), name=name)
    fields.update(chain)
    return KVTierChain(tuple(made), **fields)
