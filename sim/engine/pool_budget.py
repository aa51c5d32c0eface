"""The KV pool a config gets from the memory budget of its model on its GPU: the blocks left
once the weights (and a speculative draft model's, which shares the GPUs) and the engine's
other terms are taken, in the scheduler's own memory accounting (vLLM's, SGLang's or
TensorRT-LLM's: :mod:`sim.specs.memory_terms`).

A model that does not fit is an error carrying the budget's advice (quantize, add GPUs); a
block too large for what is left names ``block_size``, not the weights. With a draft model
each block also holds the draft's KV of its tokens (one block table per request, as vLLM
allocates them). Pure: reads the config, returns a count.

:func:`layer_pool_fields` gives a model with sliding-window, chunked-local or linear-attention
layers its per-layer-kind pool (:mod:`sim.engine.kv.layer_groups`): the same blocks, each request
holding its window's blocks in the local layers and a fixed state in the linear ones.

With data-parallel attention (``attention_dp`` ranks of ``tensor_parallel`` GPUs, experts over
all of them: :mod:`sim.costs.dp_attention`) the budget is one GPU's of a rank and the replica's
pool is ``attention_dp`` ranks' blocks.
"""

from __future__ import annotations

DEFAULT_MODEL, DEFAULT_GPU = "llama-3.1-8b", "h100"  # for the roofline and the memory budget


def budget_kv_blocks(config, policy, accounting, draft) -> int:
    """The pool's blocks for ``config`` (its ``block_size`` resolved) from the memory budget;
    ``policy`` and ``accounting`` as :meth:`SimConfig._accounting` gives them, ``draft`` the
    speculative draft model (a name or config) or None."""
    from ..specs.gpus import get_gpu, scaleup_domain
    from ..specs.memory import bytes_per_value, kv_cache_bytes, memory_budget
    from ..specs.models import get_model
    model, gpu = config.model or DEFAULT_MODEL, config.gpu or DEFAULT_GPU
    tp = config.tensor_parallel
    draft_weights = 0.0  # a draft model's weights and KV share the GPUs (vLLM)
    if draft is not None:
        draft = get_model(draft)
        draft_weights = (draft.total_params() / tp
                         * bytes_per_value("weight_dtype", config.weight_dtype) / 1e9)
    lora = getattr(config, "lora", None)  # LoRA slots, preallocated (kv.lora.LoRAConfig)
    lora_gb = 0.0 if lora is None else lora.slot_bytes(
        get_model(model), bytes_per_value("weight_dtype", config.weight_dtype), tp) / 1e9
    util = config.gpu_memory_utilization  # (None: SGLang's / TensorRT-LLM's do not use it)
    trt = {}  # TensorRT-LLM's: its fraction, activations sized for its max_num_tokens
    if accounting == "tensorrt-llm":
        tokens = (config.token_budget if isinstance(config.scheduler, str)
                  else getattr(policy, "max_num_tokens", None))
        trt = {"free_gpu_memory_fraction": (
                   config.free_gpu_memory_fraction if isinstance(config.scheduler, str)
                   else getattr(policy, "free_gpu_memory_fraction", None)),
               **({"max_num_batched_tokens": tokens} if tokens else {})}
    terms = dict(tensor_parallel=tp, weight_dtype=config.weight_dtype, kv_dtype=config.kv_dtype,
                 gpu_memory_utilization=util, block_size=config.block_size,
                 expert_parallel=config.expert_parallel,
                 expert_weight_dtype=config.expert_weight_dtype, accounting=accounting, **trt)
    memory_gb = get_gpu(gpu).memory_gb
    domain = scaleup_domain(gpu)  # (the advice's largest tensor_parallel: one domain's GPUs)
    terms["max_tensor_parallel"] = None if domain is None else domain[0]
    budget = memory_budget(model, memory_gb, overhead_gb=draft_weights + lora_gb, **terms)
    if not budget.fits and draft is not None:  # the draft's fault only if the model alone fits
        alone = memory_budget(model, memory_gb, overhead_gb=lora_gb, **terms)
        if not alone.fits:
            budget, draft = alone, None
    if not budget.fits and draft is not None:
        raise ValueError(f"draft_model {draft.name!r} ({draft_weights:.1f} GB of "
                         f"weights per GPU at {config.weight_dtype}) beside model "
                         f"{model!r} on gpu {gpu!r} leaves no room for the KV cache: "
                         f"use a smaller draft model, quantize (weight_dtype) or add "
                         f"GPUs (tensor_parallel)")
    if not budget.fits and budget.max_kv_tokens >= 1:  # the block, not the weights
        raise ValueError(budget.advice)
    if not budget.fits:
        raise ValueError(f"model {model!r} on gpu {gpu!r} with {config.weight_dtype} "
                         f"weights: {budget.advice}")
    if draft is None:  # data-parallel attention: each rank's pool (costs.dp_attention)
        return budget.kv_blocks * config.attention_dp
    # each block holds the draft's KV of its tokens too (one block table per request)
    per_block = budget.kv_block_bytes_per_gpu + kv_cache_bytes(
        config.block_size, model=draft, dtype=config.kv_dtype, tensor_parallel=tp)
    blocks = int(budget.kv_bytes_per_gpu // per_block)
    if blocks < 1:
        raise ValueError(f"draft_model {draft.name!r} beside model {model!r} on gpu "
                         f"{gpu!r} leaves no room for a KV block: use a smaller draft "
                         f"model, quantize (weight_dtype) or add GPUs "
                         f"(tensor_parallel)")
    return blocks


def layer_pool_fields(config) -> dict | None:
    """The fields of the :class:`~sim.engine.kv.layer_groups.LayerPool` of ``config``'s model
    (its ``block_size``, ``tensor_parallel`` and ``kv_dtype`` resolved), or None: every layer full
    attention (one block per ``block_size`` tokens), or a run whose pool keys, shares or
    looks ahead by block (prefix caching, speculative decoding), where every attention layer
    counts for every token (an over-estimate for the local layers, as vLLM with its hybrid
    allocator disabled)."""
    if config.prefix_caching or config.speculative is not None or callable(config.model):
        return None
    from ..specs import layers
    from ..specs.memory import STATE_BYTES, bytes_per_value
    from ..specs.models import get_model
    m = get_model(config.resolved_model())
    if not m.has_local_layers:
        return None
    tp, bs = config.tensor_parallel, config.block_size
    counts = m.layer_counts()
    page = bs * m.kv_values_per_token_per_layer(tp) * bytes_per_value("kv_dtype",
                                                                        config.kv_dtype)
    linear = counts.get(layers.LINEAR, 0)
    state = linear * layers.linear_state_values(m, tp) * STATE_BYTES
    local = counts.get(layers.SLIDING, 0) + counts.get(layers.CHUNKED, 0)
    return dict(block_size=bs, full=counts.get(layers.FULL, 0), local=local,
                window=m.sliding_window if local else 0,
                chunk=m.attention_chunk_size if local and not m.sliding_window else 0,
                state_pages=int(-(-state // page)))
