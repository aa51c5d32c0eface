"""The batched LoRA GEMMs' cost (Punica's SGMV, S-LoRA's MBGMM/MBGMV) over a base cost model.

:class:`LoRACost` wraps any cost model: an iteration costs the base model's price plus

- the **LoRA GEMMs**: ``max(bytes / HBM bandwidth, flops / peak)``, where ``bytes`` is the
  weights of every distinct adapter the running requests use (each read once per iteration:
  the per-adapter term, which grows with the number of distinct adapters in the batch, as
  Punica's SGMV and S-LoRA's kernels do) and ``flops = 2 * tokens * max rank * values per
  rank`` (every token of the batch through the shrink and expand matrices, at the batch's
  largest rank: an upper bound, base-model tokens included, as vLLM's punica kernels pad);
- the **adapter loads** of this iteration's admissions (vLLM's worker loads a step's adapters
  before its forward pass): the adapter state's pending seconds
  (:meth:`~sim.engine.kv.lora.AdapterSlots.take_pending`).

The adapter state (``slots``) is duck-typed: ``active`` (adapter -> users), ``lora.rank(a)``,
``bytes_per_rank``, ``dtype_bytes``, ``take_pending()``, ``observe(distinct)``. Stateful (it
drains the pending loads), so the engine steps every iteration (no ``pure_decode_cost``).
Sources of the check against published numbers: ``sim/data/lora_anchors.csv``.
"""

from __future__ import annotations


class LoRACost:
    """``base(batch)`` plus the LoRA GEMMs and loads of ``slots``' adapters (module docstring);
    ``hbm_gbps`` and ``peak_tflops``: the GPU's memory bandwidth and dense 16-bit peak."""

    def __init__(self, base, slots, hbm_gbps, peak_tflops):
        self.base, self.slots = base, slots
        self.hbm = hbm_gbps * 1e9
        self.peak = peak_tflops * 1e12
        self.needs_decode_lengths = bool(getattr(base, "needs_decode_lengths", False))

    def gemm_seconds(self, tokens: int) -> float:
        """The LoRA GEMMs of an iteration of ``tokens`` tokens with the current adapters."""
        slots = self.slots
        active = slots.active
        if not active:
            return 0.0
        ranks = [slots.lora.rank(a) for a in active]
        bytes_read = sum(ranks) * slots.bytes_per_rank
        flops = 2.0 * tokens * max(ranks) * slots.bytes_per_rank / slots.dtype_bytes
        return max(bytes_read / self.hbm, flops / self.peak)

    def __call__(self, batch) -> float:
        slots = self.slots
        slots.observe(len(slots.active))
        tokens = batch.num_prefill_tokens + batch.num_decode_tokens
        return self.base(batch) + self.gemm_seconds(tokens) + slots.take_pending()

    def __repr__(self):
        return f"LoRACost({self.base!r})"
