"""The terms vLLM, SGLang and TensorRT-LLM subtract from a GPU's memory before the KV cache gets
the rest.

Every size is bytes on ONE GPU of a tensor-parallel group (weights, activations and KV heads are
sharded; each GPU keeps the same number of KV blocks). The servers measure these terms on the
device at start-up; the simulator cannot, so each term below is either the server's own
arithmetic or an estimate fitted to published start-up logs, and says which.

**vLLM** (v1 engine, ``vllm/v1/worker/gpu_worker.py`` ``Worker.determine_available_memory`` with
``vllm/utils/mem_utils.py`` ``memory_profiling``, vllm-project/vllm, Apache-2.0)::

    requested  = gpu_memory_utilization x total device memory        (Worker.init_device)
    kv_cache   = requested - weights - torch peak increase during profile_run
                 - non-torch increase since start-up                 (non_kv_cache_memory)

``profile_run`` (``vllm/v1/worker/gpu_model_runner.py``) runs one forward pass of
``max_num_batched_tokens`` dummy tokens split over ``min(max_num_seqs, max_num_batched_tokens)``
requests, then the sampler on one row of logits per request. CUDA graphs are captured after the
KV cache is allocated (``compile_or_warm_up_model``) and live in the ``1 - utilization``
headroom, so they are not a term. vLLM reads the total from ``cudaMemGetInfo``, which on the
H100 in the llm-d logs below is 79.18 GiB, 0.47 GiB under nvidia-smi's 81,559 MiB: the
simulator's device figure (nvidia-smi) leaves vLLM ~0.9 x that much more KV per GPU than a
real server gets.

**SGLang** (``python/sglang/srt/model_executor/model_runner.py`` ``profile_max_num_token``,
sgl-project/sglang, Apache-2.0): the KV pool is what is left of ``mem_fraction_static`` x the
free memory before the weights load (taken here as the device memory) once the weights are in:
``kv_cache = mem_fraction_static x device - weights``. Activations, CUDA graphs and NCCL live in
the ``1 - mem_fraction_static`` that :func:`sglang_mem_fraction_static` reserves.

**TensorRT-LLM** gives the KV cache a fraction of the memory still FREE once everything else is
on the device (NVIDIA/TensorRT-LLM, Apache-2.0)::

    kv_cache = free_gpu_memory_fraction x (device - weights - activations - non_torch)

C++ runtime (0.14 behind Triton, 0.17 engines): ``TrtGptModelInflightBatching`` loads the engine
(weights), creates the execution context (the engine's activation memory, fixed at build time
for ``max_num_tokens``), the runtime and decoder buffers, then
``BaseKVCacheManager::calculateFreeMemBytes`` takes ``cudaMemGetInfo``'s free memory x the
fraction (``cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp`` and
``kvCacheManager.cpp`` @ b35ac1b64368513d215c57d2ed01d62d910df8da). PyTorch backend (1.0):
``KvCacheCreator.estimate_max_tokens`` runs a dummy forward pass of ``max_num_tokens`` tokens
after the weights load and takes ``(total - peak) x fraction``, the peak being torch's
(weights + activations) plus the memory used outside torch
(``tensorrt_llm/_torch/pyexecutor/_util.py`` @ d8ae02caed59708512e5aa578a09bb09f365bfed).
Defaults: the fraction is 0.9 when not given (``KvCacheConfig::kDefaultGpuMemFraction`` in the
C++ executor; ``_get_free_gpu_memory_fraction`` in the PyTorch backend; ``trtllm-bench
throughput --kv_cache_free_gpu_mem_fraction`` ``default=.90``,
``tensorrt_llm/bench/benchmark/throughput.py`` @ 000a01de66f0eab4ab05640711f0253f50f5209c), and
must be below 1. The published trtllm-bench runs raise it: "In majority of cases, we also use a
higher KV cache percentage by setting ``--kv_cache_free_gpu_mem_fraction 0.95`` [...] We fall back
to 0.90 if we hit an out of memory issue" (``docs/source/performance/perf-overview.md`` @
258c7540c03517def55d9a5aadfa9288af474e1b, v0.17; "In many cases" and the same 0.95 @
00f37686aa854010d68bcbd0f4ab000221541ca6, v1.0). The activation term is
:func:`forward_peak_bytes` of ``max_num_tokens`` tokens (8,192 by default in ``trtllm-build``
and the LLM API): TensorRT sizes the activations at build time from the largest shapes, "close to
max number of input tokens * some constant factor", and reuses one decoder block's memory for
all layers (``docs/source/reference/memory.md`` @ 7ff5302377eb3063d2c056746f686eebb23184bc).
That file's example start-up log (Llama-2-7B, 8-bit weights and KV, 80 GB GPU) gives the
execution context as 1,134 MiB, where this estimate gives 644 MiB at 8,192 tokens (its build's
``max_num_tokens`` is not shown); :data:`TRTLLM_NON_TORCH_BYTES` is the rest of that log. The
device term is nvidia-smi's, as for vLLM above: the ~0.5 GiB that ``cudaMemGetInfo`` does not
report is not subtracted, so the KV cache here is that fraction of it too large.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import fraction
from .models import ModelConfig

GiB = 1 << 30
MiB = 1 << 20
ACTIVATION_BYTES = 2  # bf16/fp16 activations, whatever the weight or KV precision

# vLLM's profile_run sizes when the caller gives none: 8,192 tokens is `vllm serve`'s
# max_num_batched_tokens on GPUs of >= 70 GiB other than the A100 (2,048 on those; vllm
# vllm/engine/arg_utils.py EngineArgs.get_batch_defaults); 256 sequences is its max_num_seqs on
# the A100 and smaller GPUs (1,024 on the others) and the simulator's default max_batch_size.
VLLM_MAX_NUM_BATCHED_TOKENS = 8192
VLLM_MAX_NUM_SEQS = 256

# Sampler working set per logit (one sequence x one vocabulary entry) in vLLM v1's dummy sampler
# run (temperature, top-k, top-p: float32 logits, a sort with int64 indices, softmax, cumsum,
# masks, probabilities and exponential noise). Fitted to the torch peak increase that llm-d
# measured with vLLM on an H100 (llm-d/llm-d-benchmark config_explorer/
# empirical-vllm-memory-results.md; 8,192 tokens, 1,024 sequences), after taking off the
# [8192, hidden] bf16 hidden states still alive: Llama-3.1-8B 4.76 GiB -> 38.41 B,
# Qwen3-0.6B 5.56 -> 38.26, Qwen3-32B 5.64 -> 38.39, Llama-3.3-70B-FP8 TP2 4.84 -> 38.55.
SAMPLER_BYTES_PER_LOGIT = 38.4

# Non-torch memory that appears during vLLM's profiling (NCCL and custom all-reduce buffers,
# cuBLAS workspaces, attention-backend buffers): llm-d's H100 logs above give 0.13 GiB
# (Llama-3.1-8B, Qwen3-0.6B, gpt-oss-20b) and 0.14 GiB (Qwen3-32B) on one GPU, 0.55 GiB with
# TP 2 (Llama-3.3-70B-FP8). Larger TP groups were not measured: the TP 2 figure is used.
VLLM_NON_TORCH_BYTES_TP1 = round(0.13 * GiB)
VLLM_NON_TORCH_BYTES_TP = round(0.55 * GiB)

# vLLM's gpu_memory_utilization when none is given (its EngineArgs default)
VLLM_GPU_MEMORY_UTILIZATION = 0.9

# TensorRT-LLM's KV fraction when none is given (module docstring), and max_num_tokens, the
# tokens its engine's activations are sized for (trtllm-build's and the LLM API's default)
TRTLLM_FREE_GPU_MEMORY_FRACTION = 0.9
TRTLLM_MAX_NUM_TOKENS = 8192

# Memory in use before TensorRT-LLM sizes the KV cache besides the engine's weights and its
# execution context (activations): the CUDA context, cuBLAS workspace, runtime and decoder
# buffers. From the start-up log in docs/source/reference/memory.md (above): "total: 79.10 GiB,
# available: 70.48 GiB" less "Loaded engine size: 6695 MiB" and "Allocated 1134.01 MiB for
# execution context memory" = 0.98 GiB (of which "43.29 MB [...] runtime buffers" and
# "180.30 MB [...] decoder"). One GPU; with tensor parallelism NCCL's and the all-reduce
# buffers come on top: the increment llm-d measured for them with vLLM (TP 2 less TP 1, above).
TRTLLM_NON_TORCH_BYTES = round((79.10 - 70.48) * GiB - 6695 * MiB - 1134.01 * MiB)


@dataclass(frozen=True, slots=True)
class MemoryTerm:
    """One line of the accounting: ``bytes`` on one GPU, signed (the terms add up to the KV
    cache), and where the number comes from."""

    name: str
    bytes: int
    source: str


def resolve_expert_dtype(model: ModelConfig, value, dtypes) -> str | None:
    """A run's ``expert_weight_dtype``: None (the experts at ``weight_dtype``), one of
    ``dtypes``, or "checkpoint": the model's own ``expert_dtype`` (gpt-oss: mxfp4). A dense
    model, or "checkpoint" for a model whose config gives none, is a ``ValueError``."""
    if value is None:
        return None
    key = str(value).strip().lower()
    if key not in dtypes + ("checkpoint",):
        raise ValueError(f"expert_weight_dtype must be one of {dtypes + ('checkpoint',)}, got "
                         f"{value!r}")
    if not model.is_moe:
        raise ValueError(f"expert_weight_dtype {value!r} needs a mixture-of-experts model; "
                         f"{model.name!r} is dense")
    if key == "checkpoint" and not model.expert_dtype:
        raise ValueError(f"expert_weight_dtype 'checkpoint': {model.name!r} ships its experts "
                         f"in the precision of its other weights (give a dtype)")
    return model.expert_dtype if key == "checkpoint" else key


def check_tensor_parallel(model: ModelConfig, tp: int) -> int:
    """``tp`` if ``model`` can be split over that many GPUs: it must divide the attention heads
    (each GPU computes whole query heads: vLLM's ``verify_with_parallel_config`` refuses
    another TP) and divide the KV heads or be a multiple of them (each GPU holds whole heads,
    or a replica of one); else a ``ValueError`` naming both. The one rule for the memory budget
    and the roofline: a budget for 3 GPUs of Llama-3.1-8B's 8 KV heads was computed as if each
    held 2 of them, and 64 GPUs of its 32 query heads ran, half a head each, "faster"."""
    if model.num_key_value_heads % tp and tp % model.num_key_value_heads:
        raise ValueError(f"tensor_parallel {tp} must divide or be a multiple of "
                         f"num_key_value_heads {model.num_key_value_heads}")
    if model.num_attention_heads % tp:
        raise ValueError(f"tensor_parallel {tp} must divide num_attention_heads "
                         f"{model.num_attention_heads} of model {model.name!r}: each GPU "
                         f"computes whole attention heads (vLLM refuses it too)")
    return tp


def kv_heads_per_gpu(model: ModelConfig, tp: int) -> int:
    """KV heads on each GPU: sharded, or replicated when TP exceeds them (vLLM's and SGLang's
    ``get_num_kv_heads``: ``max(1, num_key_value_heads // tp)``). An MLA model caches one
    latent instead (:meth:`~sim.specs.models.ModelConfig.kv_cache_values_per_token`)."""
    return max(1, model.num_key_value_heads // tp)


def forward_peak_bytes(model: ModelConfig, num_tokens: int, tp: int) -> int:
    """Largest live set of one decoder layer's forward pass over ``num_tokens`` tokens on one GPU
    (an estimate from vLLM's Llama layer, ``vllm/model_executor/models/llama.py``; the llm-d
    peaks above are all sampler-bound and do not test it). Each layer frees its intermediates,
    so the peak is the larger of:

    - attention: residual + normed input ``2 h`` + fused QKV ``(heads + 2 kv_heads) d / tp``
      + attention output ``heads d / tp`` (MLA, vLLM's prefill path: the Q and KV latents
      ``q_lora + kv_lora + rope``, Q ``heads qk_head / tp``, the up-projected K-nope and V
      ``heads (nope + v) / tp``, the assembled K ``heads qk_head / tp`` and the output
      ``heads v / tp``);
    - MLP: residual + normed input ``2 h`` + gate_up ``2 I / tp`` + SiLU-and-mul ``I / tp``
      (non-gated: fc1 ``I / tp`` + activation ``I / tp``; MoE: per routed expert ``3 I / tp``
      plus its ``h`` output, the fused-MoE caches, and the shared experts; a DeepSeek-style
      model's dense layers count too); a parallel block (GPT-J, Falcon) still holds the
      attention output ``h`` while its MLP runs;

    times ``num_tokens`` x 2 bytes."""
    h, d = model.hidden_size, model.head_dim
    inter = model.intermediate_size // tp
    heads = model.num_attention_heads // tp
    if model.is_mla:
        attention = (2 * h + model.q_lora_rank + model.kv_latent_size + 2 * heads * d
                     + heads * (model.qk_nope_head_dim + model.v_head_dim)
                     + heads * model.v_head_dim)
    else:
        attention = 2 * h + (heads + 2 * kv_heads_per_gpu(model, tp)) * d + heads * d
    act = 3 if model.gated_mlp else 2  # values per MLP unit: gate_up + act, or fc1 + act
    if model.is_moe:
        mlp = 2 * h + model.num_experts_per_tok * (act * inter + h)
        if model.n_shared_experts:
            mlp += act * model.n_shared_experts * inter
        if model.num_dense_layers:
            mlp = max(mlp, 2 * h + act * (model.dense_width // tp))
    else:
        mlp = 2 * h + act * inter
    if model.parallel_attn:
        mlp += h
    return num_tokens * max(attention, mlp) * ACTIVATION_BYTES


def sampler_peak_bytes(model: ModelConfig, num_tokens: int, num_seqs: int) -> int:
    """Peak of vLLM's dummy sampler run: the ``[num_tokens, h]`` hidden states of the forward pass
    (still referenced) plus :data:`SAMPLER_BYTES_PER_LOGIT` per logit for one row per request,
    ``min(num_seqs, num_tokens)`` rows of the full vocabulary (the LM head gathers them)."""
    rows = min(num_seqs, num_tokens)
    return (num_tokens * model.hidden_size * ACTIVATION_BYTES
            + round(rows * model.vocab_size * SAMPLER_BYTES_PER_LOGIT))


def vllm_activation_peak_bytes(model: ModelConfig, max_num_batched_tokens: int,
                               max_num_seqs: int, tp: int) -> int:
    """vLLM's "torch peak increase" of ``profile_run``: the forward pass or the sampler after it,
    whichever holds more (:func:`forward_peak_bytes`, :func:`sampler_peak_bytes`)."""
    return max(forward_peak_bytes(model, max_num_batched_tokens, tp),
               sampler_peak_bytes(model, max_num_batched_tokens, max_num_seqs))


def vllm_non_torch_bytes(tp: int) -> int:
    """Non-torch memory vLLM's profiling adds (see :data:`VLLM_NON_TORCH_BYTES_TP1`)."""
    return VLLM_NON_TORCH_BYTES_TP1 if tp == 1 else VLLM_NON_TORCH_BYTES_TP


def check_free_gpu_memory_fraction(value) -> float:
    """TensorRT-LLM's ``free_gpu_memory_fraction``, checked: in (0, 1), as TensorRT-LLM refuses
    1.0 (nothing would be left for anything else)."""
    f = fraction("free_gpu_memory_fraction", value)
    if f == 1:
        raise ValueError("free_gpu_memory_fraction must be below 1 (TensorRT-LLM refuses 1.0), "
                         "got 1.0")
    return f


def trtllm_non_torch_bytes(tp: int) -> int:
    """Memory TensorRT-LLM has in use outside the weights and activations when it sizes the KV
    cache (:data:`TRTLLM_NON_TORCH_BYTES`, plus NCCL's buffers when ``tp > 1``)."""
    return TRTLLM_NON_TORCH_BYTES + (0 if tp == 1 else
                                     VLLM_NON_TORCH_BYTES_TP - VLLM_NON_TORCH_BYTES_TP1)


def sglang_defaults(gpu_memory_mib: float, tp: int) -> tuple[int, int]:
    """SGLang's ``(chunked_prefill_size, cuda_graph_max_bs)`` for a GPU of this capacity (MiB, as
    nvidia-smi reports it) on CUDA: ``ServerArgs._handle_gpu_memory_settings``
    (``python/sglang/srt/server_args.py``, 2025 releases)."""
    small = tp < 4
    if gpu_memory_mib < 20 * 1024:
        return 2048, 8
    if gpu_memory_mib < 35 * 1024:
        return 2048, 24 if small else 80
    if gpu_memory_mib < 60 * 1024:
        return 4096, 32 if small else 160
    if gpu_memory_mib < 160 * 1024:
        return 8192, 256 if small else 512
    return 16384, 512


def sglang_mem_fraction_static(gpu_memory_mib: float, tp: int, chunked_prefill_size=None,
                               cuda_graph_max_bs=None) -> float:
    """SGLang's default ``mem_fraction_static`` (same function; dense model, no data-parallel
    attention, no speculative decoding, one pipeline stage): reserve, in MiB,
    ``512 + 1.5 max(chunked_prefill_size, 2048) + 2 cuda_graph_max_bs + 1024 tp / 8`` (at least
    10 GiB on GPUs above 60 GiB), and keep ``round((capacity - reserve) / capacity, 3)``."""
    chunk, graph_bs = sglang_defaults(gpu_memory_mib, tp)
    chunk = chunk if chunked_prefill_size is None else chunked_prefill_size
    graph_bs = graph_bs if cuda_graph_max_bs is None else cuda_graph_max_bs
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp / 8 * 1024
    if gpu_memory_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_memory_mib - reserved) / gpu_memory_mib, 3)
