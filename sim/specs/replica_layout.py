"""How one serving replica lays out over its GPUs: how many GPUs it holds, and how many weight
bytes each of them loads.

A replica runs on ``tensor_parallel`` GPUs, or, with data-parallel attention under expert
parallelism (SGLang's ``--enable-dp-attention``, vLLM's ``--data-parallel-size`` with
``--enable-expert-parallel``: :mod:`sim.costs.dp_attention`), on ``tensor_parallel x
attention_dp`` GPUs: ``attention_dp`` ranks of ``tensor_parallel`` GPUs each, the MoE experts
spread over all of them (``expert_parallel`` is that same count, never extra GPUs). Every
count of a replica's GPUs (a run's fleet, its dollars and watts, an autoscaled day's GPU-hours,
the planner's and capacity search's GPUs) reads :func:`replica_gpus`.

Each GPU holds ``1 / tensor_parallel`` of the weights outside the routed experts (replicated
over the data-parallel ranks) and ``1 / expert_parallel`` of the routed experts, in their own
precision where the checkpoint has one (gpt-oss: MXFP4 beside bf16):
:func:`weight_bytes_per_gpu`, the memory budget's ``weights`` term before rounding
(:func:`sim.specs.memory.memory_budget`) and what a starting replica loads per GPU
(:func:`sim.engine.fleet.autoscaler.load_time`). :func:`more_gpus_advice`: how many GPUs a
model that does not fit would need, as the memory budget's advice says it (never more than
one scale-up domain holds).

Invariants (tests/test_replica_layout.py): ``replica_gpus(tp)`` is ``tp``; the weight bytes
of a dense model are ``params x bytes / tp`` (the same float operations as before this module
held them); the replica's GPUs hold every weight at least once.
"""

from __future__ import annotations

from .models import ModelConfig


def replica_gpus(tensor_parallel: int, attention_dp: int = 1) -> int:
    """The GPUs one replica runs on: ``tensor_parallel`` x ``attention_dp`` (see the module
    docstring)."""
    return tensor_parallel * attention_dp


def routed_expert_params(model: ModelConfig) -> int:
    """The routed experts' parameters over all MoE layers (the shared experts not counted:
    they sit with the other weights, over the TP GPUs)."""
    return (model.num_hidden_layers - model.num_dense_layers) * model.num_local_experts \
        * model.mlp_params_per_expert()


def weight_bytes_per_gpu(model: ModelConfig, tensor_parallel: int, weight_bytes: float,
                         expert_parallel: int = 1, expert_bytes: float | None = None) -> float:
    """Weight bytes on each GPU of a replica (unrounded; see the module docstring):
    ``weight_bytes`` per value, the routed experts ``expert_bytes`` (None: ``weight_bytes``)
    over ``expert_parallel`` GPUs (1: over the ``tensor_parallel`` GPUs)."""
    tp, ep = tensor_parallel, expert_parallel
    if ep == 1 and expert_bytes is None:
        return model.total_params() * weight_bytes / tp
    experts = routed_expert_params(model)
    if expert_bytes is None:  # the experts whole, E / ep of them per GPU; the rest over TP
        return ((model.total_params() - experts) / tp + experts / ep) * weight_bytes
    n = ep if ep > 1 else tp  # the routed experts in their own precision, over EP or TP
    return (model.total_params() - experts) / tp * weight_bytes + experts / n * expert_bytes


def more_gpus_advice(numbers_for, tp, wbytes, limit) -> str:
    """The memory advice's last sentence (``numbers_for(n=, w=)``: the KV numbers of ``n``
    GPUs at ``w`` bytes per weight, blocks last): the fewest GPUs (doubling ``tp``, at most ``limit``: one
    scale-up domain; None: 1,024) that fit at the weights' precision, else quantized to 8 then
    4 bits ('' where that is what the sentence before said)."""
    top = 1024 if limit is None else limit
    for bits, w in ((None, wbytes), (8, 1.0), (4, 0.5)):
        n = tp * 2 if bits is None else tp
        while bits is None or w < wbytes:
            if n > top or numbers_for(n=n, w=w)[-1] >= 1:
                break
            n *= 2
        if n <= top and (bits is None or w < wbytes):
            tail = "." if limit is None else f": more than {limit} leave one scale-up domain."
            return (f"Or add GPUs: {n} GPUs with tensor parallelism (tensor_parallel={n})."
                    if bits is None else "" if n == tp else
                    f"Or {bits}-bit weights on {n} GPUs with tensor parallelism "
                    f"(tensor_parallel={n}){tail}")
    return ("" if limit is None else f"No tensor_parallel up to {limit} (one scale-up domain "
            f"of this GPU) fits, even with 4-bit weights: use a GPU with more memory.")
