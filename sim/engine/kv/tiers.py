"""A chain of KV offload tiers under the prefix cache (GPU -> CPU -> disk/remote).

:class:`KVTierChain` is the setting (``SimConfig.kv_offload``): an ordered tuple of
:class:`~sim.engine.kv.offload.KVTier` (fastest first, each with its capacity, read/write
bandwidth, base latency and eviction policy, LRU or ARC), a write policy, a shared link and a
hit granularity. :class:`TierChain` is one replica's chain; :class:`TieredBlockManager` the
block prefix cache that feeds it (the radix tree's: :mod:`sim.engine.kv.radix_tiers`). The
model (tests/test_tiers.py):

- **Write policies** (SGLang HiCache's ``--hicache-write-policy``): ``write_back``: a block the
  GPU evicts is stored in the first tier (vLLM's native offload, as
  :class:`~sim.engine.kv.offload.OffloadTier`); ``write_through``: every block is stored in
  the first tier when it is computed (its prompt blocks at registration, its answer's when it
  finishes; an eviction then stores nothing); ``write_through_selective``: a block is stored
  once it has been used ``write_threshold`` times (its computation counts one, each GPU hit
  one: HiCache's hit count), else it is lost on eviction.
- **Demotion.** A tier's evictions are stored in the next tier (the last tier's are lost).
- **Hits.** The blocks after a request's GPU hit that some tier holds, consecutively, are a
  tier hit (rounded down to whole ``chunk_tokens`` chunks of the prompt when set: LMCache
  stores and retrieves 256-token chunks); each block is read from the first tier holding it
  (touched there); one read from a lower tier is also copied into the first (promotion,
  HiCache's L3 -> L2 prefetch). A hit of fewer than ``load_threshold`` tokens is recomputed
  instead (HiCache's load-back threshold: a short load is not worth its transfer).
- **Loads are asynchronous and share the link.** A replica's loads are served one after the
  other (FIFO) on its link: a load starts when the link is free, occupies it for
  ``sum(bytes_k / min(read_k, link))`` over the tiers it reads and lands ``max(latency_k)``
  after that; the request waits off the batch meanwhile (iterations go on). Stores never
  stall anything and only their bytes are counted (a deviation: their link time, a separate
  direction of a full-duplex link, is not modelled, nor a block's readiness before its copy
  lands).
- A chain whose tiers all have capacity 0 holds nothing: bit-identical to no tier.

Traffic per direction: ``bytes_written[k]`` (into tier k: stores, demotions, promotions),
``bytes_read[k]`` (tier k -> GPU); ``blocks_read[k]``. Invariant: each tier holds at most its
capacity; a key a tier holds was computed on the GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .offload import KVTier, OffloadingBlockManager, _number
from .tier_stores import STORES

WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")  # SGLang HiCache's


@dataclass(frozen=True)
class KVTierChain:
    """Offload tiers under the GPU pool, fastest first (see the module docstring).

    ``tiers``: :class:`KVTier` objects (capacity per GPU, bandwidths, latency, eviction);
    ``write_policy``: one of ``WRITE_POLICIES``; ``write_threshold``: uses before a block is
    stored under ``write_through_selective`` (>= 1; SGLang's default 2); ``link_gbps``: the
    GPU <-> host link every load crosses, GB/s per direction (``math.inf``: no limit beyond
    the tiers'); ``chunk_tokens``: hits in whole chunks of this many tokens (0: blocks; a
    multiple of the block size); ``load_threshold``: tier hits shorter than this many tokens
    are recomputed, not loaded (0: every hit loads); ``layer_overlap``: a load overlaps the
    request's prefill layer by layer (HiCache's: the request waits only
    ``max(latency, load - prefill of the rest alone)``, radix and block mode alike:
    :mod:`sim.engine.kv.radix_tiers`); ``name``: a label (a preset's);
    ``prefetch_policy``: how a request whose hit reaches below the first tier waits for its
    prefetch into the first tier, started at its arrival (SGLang HiCache's
    ``--hicache-storage-prefetch-policy``; radix mode only; None: it reads them at admission
    through the first tier, the whole read waited for): ``best_effort`` (starts at admission
    with what arrived), ``wait_complete``, ``timeout`` (waits at most ``prefetch_timeout_base
    + prefetch_timeout_per_ki_token * tokens / 1024`` seconds, HiCache's defaults 1 and
    0.25); ``prefetch_threshold``: a hit reaches below the first tier only when at least
    this many of the prompt's tokens lie past its GPU and first-tier match (radix mode;
    HiCache's ``prefetch_threshold``, 256 in its preset: ``prefetch_from_storage`` skips a
    shorter L3 prefetch; 0: always)."""

    tiers: tuple = ()
    write_policy: str = "write_back"
    write_threshold: int = 2
    link_gbps: float = math.inf
    chunk_tokens: int = 0
    load_threshold: int = 0
    layer_overlap: bool = False
    name: str = "custom"
    prefetch_policy: str | None = None
    prefetch_timeout_base: float = 1.0
    prefetch_timeout_per_ki_token: float = 0.25
    prefetch_threshold: int = 0

    def __post_init__(self):
        tiers = tuple(self.tiers) if isinstance(self.tiers, (list, tuple)) else None
        if not tiers or not all(isinstance(t, KVTier) for t in tiers):
            raise TypeError(f"kv_offload.tiers must be a non-empty tuple of sim.KVTier, got "
                            f"{self.tiers!r}")
        object.__setattr__(self, "tiers", tiers)
        if self.write_policy not in WRITE_POLICIES:
            raise ValueError(f"kv_offload.write_policy must be one of "
                             f"{', '.join(WRITE_POLICIES)}, got {self.write_policy!r}")
        for name, value in (("write_threshold", self.write_threshold),
                            ("chunk_tokens", self.chunk_tokens),
                            ("load_threshold", self.load_threshold),
                            ("prefetch_threshold", self.prefetch_threshold)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0 or \
                    name == "write_threshold" and value < 1:
                bound = ">= 1" if name == "write_threshold" else ">= 0"
                raise ValueError(f"kv_offload.{name} must be an integer {bound}, got {value!r}")
        _number("link_gbps", self.link_gbps, positive=True)
        if self.prefetch_policy is not None and self.prefetch_policy not in PREFETCH_POLICIES:
            raise ValueError(f"kv_offload.prefetch_policy must be one of "
                             f"{', '.join(PREFETCH_POLICIES)} (or None), got "
                             f"{self.prefetch_policy!r}")
        _number("prefetch_timeout_base", self.prefetch_timeout_base)
        _number("prefetch_timeout_per_ki_token", self.prefetch_timeout_per_ki_token)
        if not isinstance(self.layer_overlap, bool):
            raise TypeError(f"kv_offload.layer_overlap must be True or False, got "
                            f"{self.layer_overlap!r}")

    @property
    def capacity_gb(self) -> float:
        """All tiers' capacity in all (GB per GPU)."""
        return sum(t.capacity_gb for t in self.tiers)


class TierChain:
    """One replica's chain of tiers (see the module docstring); the interface of
    :class:`~sim.engine.kv.offload.OffloadTier`: ``store``, ``hits``, ``load``, and the block
    manager's hooks ``computed`` and ``used``."""

    def __init__(self, setting: KVTierChain, block_bytes: float, block_size: int,
                 prefill=None):
        self.setting = setting
        # prefill(r, tokens) -> seconds: the rest of r's prefill priced alone (layer overlap)
        self.prefill = prefill if getattr(setting, "layer_overlap", False) else None
        self.block_bytes = block_bytes
        self.block_size = block_size
        self.tiers = setting.tiers
        self.stores = []
        for t in self.tiers:
            cap = t.capacity_gb * 1e9 / block_bytes
            self.stores.append(STORES[t.eviction](math.inf if math.isinf(cap) else int(cap)))
        self.empty = not any(s.capacity for s in self.stores)
        n = len(self.tiers)
        self.bytes_written = [0.0] * n
        self.bytes_read = [0.0] * n
        self.blocks_read = [0] * n
        self.policy = setting.write_policy
        self.threshold = 1 if self.policy == "write_through" else setting.write_threshold
        self.uses = {}  # write_through_selective: key -> uses so far (not yet stored)
        chunk = setting.chunk_tokens
        if chunk % block_size:
            raise ValueError(f"kv_offload.chunk_tokens must be a multiple of the block size "
                             f"{block_size}, got {chunk}")
        self.chunk_blocks = chunk // block_size
        self.min_blocks = -(-setting.load_threshold // block_size)  # a hit's fewest blocks
        # the secs one block occupies the link reading from tier k
        self._secs = [block_bytes / (min(t.read_gbps, setting.link_gbps) * 1e9)
                      for t in self.tiers]
        self.link_free = 0.0  # when the link's queued loads are done

    @property
    def bytes_stored(self) -> float:
        return sum(self.bytes_written)

    @property
    def bytes_loaded(self) -> float:
        return sum(self.bytes_read)

    def _put(self, k: int, keys) -> None:
        """``keys`` enter tier ``k``; its evictions go on down the chain."""
        while keys and k < len(self.stores):
            new, keys = self.stores[k].insert(keys)
            self.bytes_written[k] += new * self.block_bytes
            k += 1

    def store(self, evicted) -> None:
        """Blocks just evicted from the GPU pool (write-back: they enter the first tier)."""
        if self.policy == "write_back" and not self.empty:
            self._put(0, evicted.tolist() if hasattr(evicted, "tolist") else list(evicted))

    def computed(self, keys) -> None:
        """Blocks just computed and cached on the GPU (their first use)."""
        if self.policy != "write_back" and len(keys) and not self.empty:
            self.used(keys)

    def used(self, keys) -> None:
        """Blocks used (computed, or a GPU hit): stored once used ``threshold`` times."""
        if self.policy == "write_back" or self.empty or not len(keys):
            return
        keys = keys.tolist() if hasattr(keys, "tolist") else list(keys)
        first = self.stores[0]
        if self.threshold == 1:
            self._put(0, [k for k in keys if k not in first])
            return
        uses, due = self.uses, []
        for k in keys:
            if k in first:
                continue
            n = uses[k] = uses.get(k, 0) + 1
            if n >= self.threshold:
                due.append(k)
        self._put(0, due)
        for k in due:  # (one the first tier refused keeps its count: tried at its next use)
            if k in first:
                del uses[k]

    def _tier_of(self, key) -> int:
        for i, s in enumerate(self.stores):
            if key in s:
                return i
        return -1

    def hits(self, keys, start: int, limit: int) -> int:
        """How many of ``keys[start:limit]`` some tier holds, consecutively from ``start``
        (whole chunks of the prompt when ``chunk_tokens`` is set)."""
        if self.empty:
            return 0
        n = 0
        for k in keys[start:limit].tolist():
            if self._tier_of(k) < 0:
                break
            n += 1
        c = self.chunk_blocks
        if c > 1:
            n = max(0, (start + n) // c * c - start)
        return n if n >= self.min_blocks else 0

    def load(self, keys, now: float = 0.0, prefetched: bool = False) -> float:
        """Load the blocks ``keys`` (each from the first tier holding it); returns the
        seconds until they land (queued on the link behind earlier loads). ``prefetched``:
        those of lower tiers were prefetched into the first: read at its speed."""
        keys = keys.tolist()
        by_tier = {}
        for k in keys:
            by_tier.setdefault(self._tier_of(k), []).append(k)
        busy, latency = 0.0, 0.0
        for i, ks in sorted(by_tier.items()):
            self.stores[i].touch(ks)
            self.bytes_read[i] += len(ks) * self.block_bytes
            self.blocks_read[i] += len(ks)
            j = 0 if prefetched else i
            busy += len(ks) * self._secs[j]
            latency = max(latency, self.tiers[j].latency)
            if i > 0:
                self._put(0, ks)  # promoted into the first tier
        start = max(now, self.link_free)
        self.link_free = start + busy
        return self.link_free + latency - now


class TieredBlockManager(OffloadingBlockManager):
    """The block prefix cache feeding a :class:`TierChain`: evictions (write-back),
    registrations (computed: a prompt's blocks, an answer's) and hits (used) reach it."""

    __slots__ = ()

    def register(self, keys):
        new = super().register(keys)
        self.tier.computed(new)
        return new

    def acquire(self, keys) -> None:
        super().acquire(keys)
        self.tier.used(keys)


TierChain.manager = TieredBlockManager  # the pool a replica with this chain uses
