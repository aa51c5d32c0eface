"""The KV pools: how a replica's KV cache is held, shared and evicted.

Modules: ``blocks`` (:class:`~sim.engine.kv.blocks.BlockManager`: the block pool, the one
owner of KV accounting), ``prefix_cache`` (vLLM v1's block-hash prefix cache as a pool),
``radix`` (SGLang's radix tree as a pool), ``prefix_hits`` (the replica's prefix-hit lookups,
memoised per waiting request: a base class of ``Replica``), ``offload`` (a KV offload tier
under the block prefix cache: ``KVTier``, its stores on eviction, its loads), ``tiers`` (a
chain of tiers: ``KVTierChain``, write policies, demotion, loads queued on a shared link),
``radix_tiers`` (the chain under the radix tree: SGLang HiCache's nodes, stores and hits),
``tier_stores`` (what one tier holds: LRU or ARC), ``layer_groups`` (the blocks a request
holds per layer kind: sliding-window, chunked-local and linear-attention layers) and ``lora``
(LoRA adapters' GPU slots and CPU cache: ``LoRAConfig``, the admission gate, loads).

May import: ``sim.checks``, ``sim.constants`` and NumPy (``lora``, lazily: ``sim.specs`` for
the model's dims and the GPU, ``sim.costs.lora`` for the GEMMs' cost); no other part of ``sim.engine`` (the
pools know blocks, keys and token counts, not requests' states or the iteration loop).
"""
