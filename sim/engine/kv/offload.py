"""A KV offload tier under the GPU prefix cache (vLLM's native CPU offload, LMCache's CPU tier).

:class:`KVTier` is the setting (``SimConfig.kv_offload``): capacity in bytes, read and write
bandwidth, a base latency per load, LRU eviction. :class:`OffloadTier` is one replica's tier:
the keys of the prefix blocks it holds, least recently used first.
:class:`OffloadingBlockManager` is the block prefix cache (``prefix_caching="block"``) whose
evictions store into the tier.

The model (tests/test_offload.py):
- **Store on eviction.** A cached block evicted from the GPU pool (its key reaches the LRU
  queue's head) is stored in the tier, unless the tier already holds it (then it is only made
  most recent); the tier evicts its least recently used keys past its capacity
  (``capacity // bytes per block`` blocks). Stores are asynchronous and never stall an
  iteration: only their bytes are counted (``bytes_stored``; a deviation: the copy-out's link
  time is not modelled, nor its contention with loads).
- **Load on admission.** The blocks of a request's prompt that follow its GPU hit and that the
  tier holds, consecutively, are a tier hit: at admission the request takes GPU blocks for
  them and waits ``latency + bytes / read bandwidth`` off the batch (iterations go on without
  it), then continues its prefill from there with those tokens cached; the tier keeps them
  (a copy, made most recent). Loads of several requests do not share the link (a deviation).
- A tier of capacity 0 holds nothing: results are bit-identical to no tier.

Invariant: ``len(keys) <= capacity_blocks``; every key it holds was evicted from the GPU pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .prefix_cache import PrefixCachingBlockManager


def _number(name, value, *, positive=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise TypeError(f"kv_offload.{name} must be a number, got {value!r}")
    if value < 0 or positive and value == 0:
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"kv_offload.{name} must be {bound}, got {value!r}")
    return value


@dataclass(frozen=True)
class KVTier:
    """One offload tier below the GPU's KV pool (per GPU: a replica of ``tensor_parallel``
    GPUs has that many, each holding its GPUs' share of a block, loaded in parallel).

    ``capacity_gb``: its size (GB, 1e9 bytes; ``math.inf``: unlimited, 0: holds nothing);
    ``read_gbps`` / ``write_gbps``: load and store bandwidth (GB/s, > 0; ``math.inf``: free);
    ``latency``: seconds added to every load (>= 0); ``eviction``: ``"lru"`` or ``"arc"``
    (:mod:`sim.engine.kv.tier_stores`; ARC runs as a one-tier
    :class:`~sim.engine.kv.tiers.KVTierChain`). Defaults: a host-memory tier over PCIe 5
    x16 (~50 GB/s each way in practice, of 64 GB/s nominal)."""

    capacity_gb: float = 0.0
    read_gbps: float = 50.0
    write_gbps: float = 50.0
    latency: float = 0.0
    eviction: str = "lru"

    def __post_init__(self):
        _number("capacity_gb", self.capacity_gb)
        _number("read_gbps", self.read_gbps, positive=True)
        _number("write_gbps", self.write_gbps, positive=True)
        _number("latency", self.latency)
        if math.isinf(self.latency):
            raise ValueError(f"kv_offload.latency must be finite, got {self.latency!r}")
        if self.eviction not in ("lru", "arc"):
            raise ValueError(f"kv_offload.eviction must be 'lru' or 'arc', got "
                             f"{self.eviction!r}")

    def load_seconds(self, num_bytes: float) -> float:
        """Seconds to load ``num_bytes`` from the tier: latency + bytes / read bandwidth."""
        return self.latency + num_bytes / (self.read_gbps * 1e9)


class OffloadTier:
    """One replica's tier: the keys it holds (a dict in LRU order, oldest first) and its
    traffic (``bytes_stored``, ``bytes_loaded``; ``blocks_loaded``)."""

    __slots__ = ("setting", "block_bytes", "capacity_blocks", "keys", "bytes_stored",
                 "bytes_loaded", "blocks_loaded")

    def __init__(self, setting: KVTier, block_bytes: float):
        self.setting = setting
        self.block_bytes = block_bytes
        cap = setting.capacity_gb * 1e9 / block_bytes
        self.capacity_blocks = math.inf if math.isinf(cap) else int(cap)
        self.keys = {}
        self.bytes_stored = 0.0
        self.bytes_loaded = 0.0
        self.blocks_loaded = 0

    def store(self, evicted) -> None:
        """Blocks just evicted from the GPU pool (ids, in eviction order) enter the tier."""
        if not self.capacity_blocks:
            return
        keys = self.keys
        new = 0
        for k in evicted.tolist() if hasattr(evicted, "tolist") else evicted:
            if keys.pop(k, None) is None:
                new += 1
            keys[k] = None
        self.bytes_stored += new * self.block_bytes
        extra = len(keys) - self.capacity_blocks
        if extra > 0:
            for k in list(_first(keys, extra)):
                del keys[k]

    def hits(self, keys, start: int, limit: int) -> int:
        """How many of ``keys[start:limit]`` the tier holds, consecutively from ``start``."""
        held = self.keys
        if not held:
            return 0
        n = 0
        for k in keys[start:limit].tolist():
            if k not in held:
                break
            n += 1
        return n

    def load(self, keys, now: float = 0.0) -> float:
        """Load the blocks ``keys`` (a hit: made most recent); returns the seconds it takes
        (``now``: unused, loads do not queue)."""
        held = self.keys
        for k in keys.tolist():
            del held[k]
            held[k] = None
        num_bytes = len(keys) * self.block_bytes
        self.bytes_loaded += num_bytes
        self.blocks_loaded += len(keys)
        return self.setting.load_seconds(num_bytes)


def _first(d, n):
    it = iter(d)
    for _ in range(n):
        yield next(it)


class OffloadingBlockManager(PrefixCachingBlockManager):
    """The block prefix cache whose evicted blocks are stored in ``tier``."""

    __slots__ = ("tier",)

    def __init__(self, num_blocks: int, block_size: int, tier: OffloadTier):
        super().__init__(num_blocks, block_size)
        self.tier = tier

    def _logged(self, evicted) -> None:
        super()._logged(evicted)
        self.tier.store(evicted)
