"""The CLI's rows for KV offload tier chains (:mod:`sim.engine.kv.tiers`), appended to the
table (:mod:`sim.cli.table`).

Any of them makes the run's ``kv_offload`` a :class:`~sim.engine.kv.tiers.KVTierChain`
(:mod:`sim.cli.build_tiers`): ``offload_preset``'s (``sim.offload_preset``) or one of the
first tier the ``offload_*`` rows of the table set, plus a second tier of ``offload_lower_gb``;
the chain's fields given here override the preset's. ``offload_gb`` (the first tier's
capacity) is then required. Loads nothing beyond the standard library.
"""

from __future__ import annotations

from .arguments import at_least_zero, count, count_or_zero, name_any_case, positive, typed
from .setting import Setting as S

OFFLOAD_PRESETS = ("vllm", "lmcache", "hicache")  # sim.engine.presets.offload's (tested)
WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")  # kv.tiers'
EVICTIONS = ("lru", "arc")
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")  # kv.tiers' (tested)

ROWS = (
    S("offload_preset", ("--offload-preset",), ("kv_tiers",), "preset", parse=str.lower,
      choices=OFFLOAD_PRESETS, check=name_any_case, metavar="NAME",
      help="offload tiers as a framework sets them up (sim/data/offload_presets.csv, sources "
           "cited): vllm (native CPU offload), lmcache (CPU, then local disk; 256-token "
           "chunks), hicache (SGLang: host memory, then L3 storage); needs --offload-gb",
      default_help="default: one tier as the --offload-* flags set it"),
    S("offload_lower_gb", ("--offload-lower-gb",), ("kv_tiers",), "lower_gb", parse=float,
      metavar="GB", check=at_least_zero,
      help="a second offload tier below the first, its capacity per GPU in GB, >= 0 (a "
           "preset's: LMCache's disk, HiCache's L3; else a tier of --offload-* defaults)",
      default_help="default: none"),
    S("offload_eviction", ("--offload-eviction",), ("kv_offload",), "eviction", parse=str.lower,
      choices=EVICTIONS, check=name_any_case,
      help="offload tier: its eviction policy, lru or arc (adaptive replacement)",
      default_help="default lru"),
    S("offload_write_policy", ("--offload-write-policy",), ("kv_tiers",), "write_policy",
      parse=str.lower, choices=WRITE_POLICIES, check=name_any_case,
      help="offload tiers: when a GPU block is stored: write_back (when the GPU evicts it), "
           "write_through (when computed), write_through_selective (once used "
           "--offload-write-threshold times)",
      default_help="default: the preset's, else write_back"),
    S("offload_write_threshold", ("--offload-write-threshold",), ("kv_tiers",),
      "write_threshold", parse=int, metavar="N", check=count,
      help="offload tiers, write_through_selective: uses of a block before it is stored, >= 1",
      default_help="default 2"),
    S("offload_link_bandwidth", ("--offload-link-bandwidth",), ("kv_tiers",), "link_gbps",
      parse=float, metavar="GB_S", check=positive,
      help="offload tiers: the GPU-host link every load crosses, one at a time, GB/s > 0",
      default_help="default: the preset's, else unlimited"),
    S("offload_layer_overlap", ("--offload-layer-overlap",), ("kv_tiers",), "layer_overlap",
      parse=bool, check=typed(bool, "true or false"),
      help="offload tiers (SGLang HiCache's; radix or block cache): a load overlaps the "
           "request's prefill layer by layer, so it waits only what the prefill's compute "
           "cannot hide", default_help="default: off"),
    S("offload_prefetch_policy", ("--offload-prefetch-policy",), ("kv_tiers",),
      "prefetch_policy", parse=str.lower, choices=PREFETCH_POLICIES, check=name_any_case,
      help="offload tiers under the radix cache (SGLang HiCache's storage prefetch policy): a "
           "request whose hit reaches the lower tier, prefetched from its arrival, starts "
           "with what arrived (best_effort), waits for all (wait_complete) or at most "
           "--offload-prefetch-timeout s plus 0.25 s per 1,024 tokens (timeout)",
      default_help="default: none (the lower tier read at admission, waited for)"),
    S("offload_prefetch_timeout", ("--offload-prefetch-timeout",), ("kv_tiers",),
      "prefetch_timeout_base", parse=float, metavar="S", check=at_least_zero,
      help="offload tiers, --offload-prefetch-policy timeout: the base wait in seconds, >= 0",
      default_help="default 1 (HiCache's prefetch_timeout_base)"),
    S("offload_prefetch_threshold", ("--offload-prefetch-threshold",), ("kv_tiers",),
      "prefetch_threshold", parse=int, metavar="N", check=count_or_zero,
      help="offload tiers under the radix cache (SGLang HiCache's prefetch_threshold): a hit "
           "reaches the lower tier only when at least N tokens of the prompt lie past its GPU "
           "and first-tier match, an integer >= 0 (0: always)",
      default_help="default: the preset's (hicache 256), else 0"),
)
