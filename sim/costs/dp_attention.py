"""Data-parallel attention under expert parallelism: a MoE model on ``ep`` GPUs whose attention
runs as ``attention_dp`` data-parallel ranks of ``tensor_parallel`` GPUs each (``ep ==
tensor_parallel x attention_dp``), the experts spread over all ``ep`` GPUs.

This is SGLang's ``--enable-dp-attention`` (``--tp 8 --dp 8``: attention TP 8 / 8 = 1 per rank,
each rank with its own requests and KV cache; "DP, DPA and SGLang DP Router",
https://docs.sglang.io/advanced_features/dp_dpa_smg_guide.html, read 2026-12-02) and vLLM's
``--data-parallel-size`` with ``--enable-expert-parallel`` (each DP rank a separate engine core
with its own scheduler; "forward passes must be aligned", the expert layers synchronise every
forward pass and idle ranks run dummy passes; the EP size is DP x TP: "Data Parallel
Deployment" and "Expert Parallel Deployment",
https://docs.vllm.ai/en/latest/serving/data_parallel_deployment/ and
.../expert_parallel_deployment/, read 2026-12-02).

What the simulator models (one replica = the whole group of ``ep`` GPUs, one scheduler):

- **memory** (:func:`sim.specs.memory.memory_budget` with ``tensor_parallel`` the attention's
  TP and ``expert_parallel`` = ep): every GPU holds ``1 / tensor_parallel`` of the attention,
  embedding, dense-layer and shared-expert weights (replicated over the ranks) and ``E / ep``
  whole experts; its KV cache holds its rank's requests with ``1 / tensor_parallel`` of the KV
  heads (an MLA latent whole). The replica's pool is ``attention_dp`` ranks' blocks
  (:func:`sim.engine.pool_budget.budget_kv_blocks`);
- **step time** (:class:`DPAttentionCost`): the iteration's sequences spread over the ranks as
  evenly as whole sequences allow (a balancing DP controller; SGLang's default is round robin).
  Every per-token op outside the experts (projections, norms, routing, the TP all-reduces, the
  LM head over its sequences) runs on one rank's ``tokens / attention_dp`` tokens; attention
  costs the busiest rank's: the larger of the batch's attention over ``attention_dp`` and the
  largest single prefill chunk's (a chunk is never split over ranks), at least the kernel
  floor; the experts and the dispatch / combine all-to-alls are
  :mod:`sim.costs.expert_parallel`'s over all the iteration's tokens (each GPU sends ``tokens /
  ep`` tokens either way).

Not modelled: the ranks' separate queues and pools (the replica's one scheduler sees the
``attention_dp`` pools as one, so a rank never runs out of blocks while another has some);
``max_batch_size`` and the token budget are the whole group's (give ``attention_dp`` x the
per-rank setting); attention imbalance beyond whole prefill chunks.

Invariants (tests/test_dp_attention.py): the price is the roofline's with ``attention_dp`` 1
(the base class's); it is at least the batch's attention over ``attention_dp`` plus the non-
attention terms; :meth:`DPAttentionCost.pure_decode_cost` (the engine's fast-forward of pure-
decode iterations, :mod:`sim.engine.core.batch`'s contract) equals the price of a batch of
decodes bit for bit: the same floats added, subtracted and divided in the same order (a model
with sliding-window, chunked or linear-attention layers has none, as the roofline's).
"""

from __future__ import annotations

from .roofline import RooflineCost


class _OnePrefill:
    """A batch of one prefill chunk: what the base price reads of a batch."""

    __slots__ = ("prefills", "num_prefill_tokens")
    num_decode_tokens = 0
    decode_context_tokens = 0
    num_spec_tokens = 0

    def __init__(self, new, cached):
        self.prefills = ((new, cached),)
        self.num_prefill_tokens = new

    def decode_context_lengths(self):
        return ()


class DPAttentionCost(RooflineCost):
    """The roofline with data-parallel attention (see the module docstring):
    ``DPAttentionCost(model, gpu, expert_parallel=8, attention_dp=8)``, the keywords
    :class:`~sim.costs.roofline.RooflineCost`'s."""

    splits_attention = True

    def non_attention_time(self, batch) -> float:
        """The base price's terms other than attention: linear ops, LM head, fixed costs."""
        spec = getattr(batch, "num_spec_tokens", 0)
        q = batch.num_decode_tokens * (1 + spec)
        key = (batch.num_prefill_tokens + q, q + len(batch.prefills))
        t = self.linear_time(*key) + self._fixed_s + self._per_seq_s * key[1]
        return t + self._eager_s if batch.prefills or q > self._graph_max else t

    def attention_time(self, batch) -> float:
        """The whole batch's attention, all layers, as if on one rank."""
        return RooflineCost.__call__(self, batch) - self.non_attention_time(batch)

    def busiest_rank_attention(self, batch) -> float:
        """The busiest rank's attention: the batch's over ``attention_dp``, or the largest
        prefill chunk's, at least the kernel floor."""
        share = self.attention_time(batch) / self.attention_dp
        for new, cached in batch.prefills:
            one = _OnePrefill(new, cached)
            share = max(share, self.attention_time(one))
        return max(share, self._attn_floor)

    def __call__(self, batch) -> float:
        return self.non_attention_time(batch) + self.busiest_rank_attention(batch)

    def pure_decode_cost(self, num_decodes: int):
        """The price of ``num_decodes`` decodes and nothing else as ``f(context_tokens)``,
        bit for bit :meth:`__call__`'s: the base price's terms (as
        :meth:`RooflineCost.pure_decode_cost` adds them) less the non-attention terms (as
        :meth:`non_attention_time` adds them), over ``attention_dp``, at least the floor."""
        key = (num_decodes, num_decodes)
        linear = self.linear_time(*key)
        other = linear + self._fixed_s + self._per_seq_s * num_decodes  # non_attention_time
        base = linear + (self._fixed_s + self._per_seq_s * num_decodes)  # RooflineCost's
        if num_decodes > self._graph_max:
            other += self._eager_s
            base += self._eager_s
        per_ctx, floor, dp = self._decode_s_per_ctx, self._attn_floor, self.attention_dp

        def price(context_tokens):
            d = context_tokens * per_ctx
            whole = base + (d if d > floor else floor)
            return other + max((whole - other) / dp, floor)
        return price
