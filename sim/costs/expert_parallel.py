"""Expert parallelism (EP): a MoE model's experts spread over ``ep`` GPUs, each holding
``num_local_experts / ep`` whole experts, with attention tensor-parallel over the same GPUs
(``ep == tensor_parallel``: vLLM's ``--enable-expert-parallel`` at data-parallel size 1, SGLang's
``--ep-size`` equal to ``--tp-size``), or as ``attention_dp`` data-parallel ranks of
``tensor_parallel`` GPUs each (``ep == tensor_parallel x attention_dp``;
:mod:`sim.costs.dp_attention`, whose ranks each run the attention on their own tokens). A MoE
layer then costs, on the slowest GPU:

- **dispatch and combine**, two all-to-alls: each GPU takes ``1 / ep`` of the iteration's
  tokens (the attention all-reduce done as a reduce-scatter, the all-gather after the combine:
  together an all-reduce, which the roofline already prices) and sends each token's hidden
  state (``ACT_BYTES`` per value) to the GPUs of its ``k`` experts, ``(ep - 1) / ep`` of them
  elsewhere under uniform placement; the combine returns as many. Each costs
  ``allreduce_latency_s`` (the roofline's collective latency) plus the bytes a GPU sends over
  its scale-up link at the efficiency DeepEP measured: its intranode normal kernels moved 153
  GB/s (dispatch) and 158 GB/s (combine) per GPU at EP 8 on H800, whose NVLink is 200 GB/s per
  direction (DeepEP README, "Normal kernels with NVLink and RDMA forwarding",
  https://github.com/deepseek-ai/DeepEP, read 2026-12-02; 4,096 tokens, hidden 7,168, top-8):
  ``DISPATCH_EFF = 153 / 200``, ``COMBINE_EFF = 158 / 200``. Assumed for every GPU with a
  scale-up link; a GPU without one (PCIe) uses 32 GB/s, as the ring all-reduce does. The link
  is the group's own, as for the all-reduce: on a switched fabric (NVSwitch) the GPU's whole
  scale-up bandwidth, on a fully connected board (xGMI, ``sim/data/scaleup_fabric.csv``) the
  ``ep - 1`` peer links among the group (each GPU sends each peer its share over that peer's
  link: EP 2 on MI300X moves at one 64 GB/s link, not the board's 448);
- **the busiest GPU's experts**: its rows (token-expert pairs) are the largest of the ``ep``
  GPUs' loads, :func:`busiest_rank_rows`; its GEMMs read the weights of its touched experts
  (``E / ep`` experts, each touched with probability ``1 - (1 - k / E)^tokens``) at full width,
  priced by the roofline's own GEMM rule (:meth:`RooflineOps._times`) in place of the tensor-
  parallel expert GEMMs (each expert's ``1 / tp`` slice, every row). Shared experts stay
  tensor-parallel.

Routing: uniform (each of the ``tokens x k`` token-expert pairs on a GPU with probability
``1 / ep``: the busiest of ``ep`` binomial loads, :func:`sim.costs.moe.expected_busiest`), or
skewed: expert ``i`` (from 1) chosen with probability ``i^-s / H(E, s)`` (Zipf, exponent
``expert_skew`` = ``s``), the experts placed on the GPUs in order (GPU 0 holds the hottest ``E /
ep``: no load balancer such as DeepSeek's EPLB), the busiest load ``tokens x k x`` GPU 0's share
(the expectation; at least the uniform busiest load).

Invariants (tests/test_expert_parallel.py): ``ep == 1`` adds nothing; every term is >= 0 and
depends only on the token count (so the roofline's per-token-count memo holds); the busiest load
is at least the mean ``tokens x k / ep`` and at most ``tokens x k``.
"""

from __future__ import annotations

import numpy as np

from .moe import ACT_BYTES, expected_busiest
from .roofline_collectives import group_link_bytes_per_s

DISPATCH_EFF = 153 / 200  # DeepEP intranode EP 8, H800: 153 GB/s of 200 GB/s per direction
COMBINE_EFF = 158 / 200
PCIE_BYTES_PER_S = 32e9  # no scale-up link: PCIe Gen4 x16 per direction (the ring model's)


def zipf_share(num_experts: int, ep: int, skew: float) -> float:
    """The routing probability GPU 0 gets: the hottest ``E / ep`` experts' share under Zipf
    popularity ``i^-skew`` (``skew`` 0: ``1 / ep``)."""
    w = np.arange(1, num_experts + 1, dtype=np.float64) ** -float(skew)
    return float(w[:num_experts // ep].sum() / w.sum())


def busiest_rank_rows(tokens: int, k: int, num_experts: int, ep: int,
                      skew: float = 0.0) -> float:
    """Expected rows (token-expert pairs) of the busiest of ``ep`` GPUs for ``tokens`` tokens
    each routed to ``k`` experts (see the module docstring)."""
    if tokens <= 0:
        return 0.0
    pairs = int(tokens) * k
    uniform = expected_busiest(pairs, 1, ep) if ep > 1 else float(pairs)
    if not skew:
        return uniform
    return max(uniform, pairs * zipf_share(num_experts, ep, skew))


def check_expert_parallel(model, ep, tensor_parallel, skew=0.0, attention_dp=1) -> int:
    """``ep`` checked against the model, the tensor-parallel size and the attention's data-
    parallel degree (one-line errors naming the field); returns it as an int. ``attention_dp``
    > 1 (:mod:`sim.costs.dp_attention`): ``ep == tensor_parallel x attention_dp``."""
    from ..checks import positive_int
    ep = positive_int("expert_parallel", ep)
    dp = positive_int("attention_dp", attention_dp)
    if not float(skew) >= 0 or not np.isfinite(float(skew)):
        raise ValueError(f"expert_skew must be a Zipf exponent >= 0, got {skew!r}")
    if (ep > 1 or dp > 1) and not model.is_moe:  # (first: not sent to give another ep)
        raise ValueError(f"expert_parallel {ep} needs a mixture-of-experts model; "
                         f"{model.name!r} is dense" if ep > 1 else
                         f"attention_dp {dp} needs a mixture-of-experts model (the experts "
                         f"spread over its ranks); {model.name!r} is dense")
    if dp > 1 and ep != tensor_parallel * dp:
        raise ValueError(f"attention_dp {dp} needs expert_parallel {tensor_parallel * dp} "
                         f"(tensor_parallel {tensor_parallel} x {dp} ranks), got {ep}: the "
                         f"experts spread over every GPU of the attention's data-parallel "
                         f"ranks")
    if ep == 1:
        if skew:
            raise ValueError(f"expert_skew {skew!r} needs expert_parallel > 1 (under tensor "
                             f"parallelism every GPU holds a slice of every expert)")
        return ep
    if model.num_local_experts % ep:
        raise ValueError(f"expert_parallel {ep} must divide the {model.num_local_experts} "
                         f"experts of {model.name!r}")
    if dp == 1 and ep != tensor_parallel:
        raise ValueError(f"expert_parallel {ep} must equal tensor_parallel {tensor_parallel}: "
                         f"experts spread over the attention's tensor-parallel GPUs (or give "
                         f"attention_dp = expert_parallel / tensor_parallel: data-parallel "
                         f"attention)")
    return ep


def check_attention_dp(config) -> None:
    """A run's config (``sim.SimConfig``) with ``attention_dp`` > 1: the roofline's, on one
    replica of ``expert_parallel`` GPUs; a setting this module does not model is refused."""
    for knob, why in (("speculative", "speculative decoding"), ("lora", "LoRA adapters"),
                      ("disaggregation", "disaggregated pools"),
                      ("cost_model", "a cost model that does not split the attention")):
        if getattr(config, knob) is not None and not (knob == "cost_model" and getattr(
                config.cost_model, "attention_dp", 1) == config.attention_dp):
            raise ValueError(f"attention_dp={config.attention_dp} with {why} ({knob}) is not "
                             f"modelled")
    if callable(config.model):
        raise ValueError(f"attention_dp={config.attention_dp} needs a MoE model's config, got "
                         f"model {config.model!r}")


def check_moe_settings(config, weight_dtypes) -> dict:
    """A run's MoE knobs (``sim.SimConfig``'s ``expert_parallel``, ``expert_skew``,
    ``attention_dp``, ``expert_weight_dtype``; ``weight_dtypes`` the dtypes it takes) checked
    against its model: the values to store, each resolved (``"checkpoint"``: the model's own
    expert precision)."""
    from ..checks import positive_int
    from ..specs.memory_terms import resolve_expert_dtype
    from ..specs.models import get_model
    dp = positive_int("attention_dp", config.attention_dp)
    if dp > 1:
        check_attention_dp(config)
    if callable(config.model):  # (a model given as a callable: nothing to check it against)
        return {"attention_dp": dp}
    model = get_model(config.resolved_model())
    experts = resolve_expert_dtype(model, config.expert_weight_dtype, weight_dtypes)
    if experts is not None and config.cost_model is not None and getattr(
            config.cost_model, "expert_weight_dtype", None) != experts:  # (the roofline's)
        raise ValueError(f"expert_weight_dtype={experts!r} is not used by cost_model "
                         f"{config.cost_model!r}: give a roofline of the same expert dtype")
    return {"attention_dp": dp,
            "expert_parallel": check_expert_parallel(model, config.expert_parallel,
                                                     config.tensor_parallel,
                                                     config.expert_skew, dp),
            "expert_weight_dtype": experts}


class ExpertParallel:
    """A mixin of :class:`~sim.costs.roofline.RooflineCost`: the seconds EP adds to (or saves
    from) an iteration's MoE layers. Reads the host's ``model``, ``gpu``, ``params``, ``wb``,
    ``tp`` and its :class:`~sim.costs.roofline_ops.RooflineOps` (``op_work``, ``_times``)."""

    def _init_expert_parallel(self, ep, skew, attention_dp=1) -> None:
        self.ep = check_expert_parallel(self.model, ep, self.tp, skew, attention_dp)
        self.expert_skew = float(skew)
        self.attention_dp = int(attention_dp)  # 1: attention tensor-parallel over the EP GPUs

    def all_to_all_time(self, tokens, eff) -> float:
        """One all-to-all of a MoE layer for ``tokens`` tokens: each GPU sends ``tokens / ep``
        tokens' ``k`` hidden states, ``(ep - 1) / ep`` of them to other GPUs, over the links the
        ``ep`` GPUs have among them (:func:`~sim.costs.roofline_collectives.group_link_bytes_per_s`:
        the whole scale-up link on a switched fabric, ``ep - 1`` peer links on a full mesh)."""
        m, ep = self.model, self.ep
        nbytes = tokens / ep * m.num_experts_per_tok * (ep - 1) / ep * m.hidden_size * ACT_BYTES
        link = group_link_bytes_per_s(self.gpu, ep) or PCIE_BYTES_PER_S
        return self.params.allreduce_latency_s + nbytes / (link * eff)

    def expert_gemms_ep(self, tokens, rank_tokens=None) -> tuple:
        """``(FLOPs, bytes)`` of the busiest GPU's expert up- and down-projections;
        ``rank_tokens`` (default ``tokens``): the tokens of one attention rank, which its
        tensor-parallel shared experts compute."""
        m, wb, ewb = self.model, self.wb, self.ewb  # (routed experts: their own precision)
        h, width, e, k = m.hidden_size, m.intermediate_size, m.num_local_experts, \
            m.num_experts_per_tok
        gate = 2 if m.gated_mlp else 1
        rows = busiest_rank_rows(tokens, k, e, self.ep, self.expert_skew)
        touched = e / self.ep * (1.0 - (1.0 - k / e) ** tokens)
        up = (2.0 * rows * h * gate * width,
              touched * h * gate * width * ewb + rows * (h + gate * width) * ACT_BYTES)
        down = (2.0 * rows * width * h,
                touched * width * h * ewb + rows * (width + h) * ACT_BYTES)
        if m.n_shared_experts:  # shared experts stay tensor-parallel (as op_work prices them)
            shared, tp = m.n_shared_experts * width, self.tp
            tokens = tokens if rank_tokens is None else rank_tokens
            up = (up[0] + 2.0 * tokens * h * gate * shared / tp,
                  up[1] + h * gate * shared / tp * wb
                  + tokens * (h + gate * shared / tp) * ACT_BYTES)
            down = (down[0] + 2.0 * tokens * shared / tp * h,
                    down[1] + shared / tp * h * wb + tokens * (shared / tp + h) * ACT_BYTES)
        return up, down

    def expert_parallel_layer_time(self, tokens: int) -> float:
        """Seconds EP adds to ONE MoE layer of an iteration of ``tokens`` tokens: dispatch and
        combine, plus the busiest GPU's expert GEMMs minus the tensor-parallel ones the
        roofline's ops price (over one attention rank's ``tokens / attention_dp``)."""
        if self.ep == 1 or tokens <= 0:
            return 0.0
        t = float(tokens)
        rank = t if self.attention_dp == 1 else t / self.attention_dp
        tp_ops = self._times(self.op_work(rank))
        up, down = self.expert_gemms_ep(t, rank)
        ep_ops = self._times({"moe_router": (0.0, 0.0), "mlp_up_proj": up,
                              "mlp_down_proj": down, "add": (0.0, 0.0)})
        gemms = (ep_ops["mlp_up_proj"] + ep_ops["mlp_down_proj"]
                 - tp_ops["mlp_up_proj"] - tp_ops["mlp_down_proj"])
        return (self.all_to_all_time(t, DISPATCH_EFF) + self.all_to_all_time(t, COMBINE_EFF)
                + gemms)

    def expert_parallel_times(self, counts) -> np.ndarray:
        """EP's seconds for iterations of each token count in ``counts``: every MoE layer's
        :meth:`expert_parallel_layer_time`."""
        moe_layers = self.model.num_hidden_layers - self.model.num_dense_layers
        return np.array([moe_layers * self.expert_parallel_layer_time(int(c))
                         for c in np.asarray(counts).tolist()])
