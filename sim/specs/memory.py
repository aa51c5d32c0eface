"""KV-cache sizes and the GPU memory budget of a model.

Units: bytes, and GB = 10**9 bytes (the unit of published GPU capacities and of "N billion
parameters x bytes"). Bytes per value: 2 fp16/bf16, 1 fp8/int8, 0.5 int4.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import fraction, positive_float, positive_int
from ..constants import KV_BLOCK_SIZE
from .models import ModelConfig, get_model

DTYPE_BYTES = {"fp32": 4.0, "float32": 4.0, "fp16": 2.0, "float16": 2.0, "bf16": 2.0,
               "bfloat16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5, "fp4": 0.5}
GB = 1e9


def bytes_per_value(name: str, dtype) -> float:
    """Bytes per value from a number (2, 1, 0.5) or a dtype name ("fp16", "int8", "int4")."""
    if isinstance(dtype, str):
        key = dtype.strip().lower()
        if key not in DTYPE_BYTES:
            raise ValueError(f"{name} must be one of {sorted(DTYPE_BYTES)} or bytes per value, "
                             f"got {dtype!r}")
        return DTYPE_BYTES[key]
    return positive_float(name, dtype)


def kv_cache_bytes(N, n_layers, n_heads_kv, d_head, dtype=2):
    """Bytes of K and V for ``N`` tokens: ``2 * N * n_layers * n_heads_kv * d_head * dtype``."""
    for name, value in (("N", N), ("n_layers", n_layers), ("n_heads_kv", n_heads_kv),
                        ("d_head", d_head)):
        positive_int(name, value)
    dtype = bytes_per_value("dtype", dtype)
    total = 2 * N * n_layers * n_heads_kv * d_head * dtype
    return int(total) if float(total).is_integer() else total


def blocks_needed(tokens, block_size=KV_BLOCK_SIZE) -> int:
    """Paged-KV blocks holding ``tokens`` tokens: ``ceil(tokens / block_size)`` (0 tokens: 0)."""
    tokens = positive_int("tokens", tokens, allow_zero=True)
    block_size = positive_int("block_size", block_size)
    return -(-tokens // block_size)


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """Where a GPU's memory goes: weights, reserved overhead, and the KV cache that remains.

    Sizes are totals over the ``tensor_parallel`` GPUs (weights and KV heads are sharded evenly).
    """

    model: ModelConfig
    gpu_memory_gb: float
    tensor_parallel: int
    gpu_memory_utilization: float
    weight_bytes_per_value: float
    kv_bytes_per_value: float
    block_size: int
    usable_bytes: float
    weights_bytes: float
    overhead_bytes: float
    kv_bytes_per_token: float
    kv_budget_bytes: float
    max_kv_tokens: int
    kv_blocks: int
    fits: bool
    advice: str

    def max_batch_size(self, seq_len) -> int:
        """How many sequences of ``seq_len`` tokens fit in the KV blocks at once."""
        need = blocks_needed(positive_int("seq_len", seq_len), self.block_size)
        return self.kv_blocks // need


def _budget_numbers(model, gpu_memory_gb, tp, util, wbytes, kvbytes, overhead_gb, block_size):
    usable = gpu_memory_gb * GB * tp * util
    weights = model.total_params() * wbytes
    overhead = overhead_gb * GB * tp
    per_token = kv_cache_bytes(1, model.num_hidden_layers, model.num_key_value_heads,
                               model.head_dim, kvbytes)
    budget = max(0.0, usable - weights - overhead)
    tokens = int(budget // per_token)
    blocks = tokens // block_size
    return usable, weights, overhead, per_token, budget, tokens, blocks


def memory_budget(config, gpu_memory_gb, *, weight_dtype=2, kv_dtype=2, tensor_parallel=1,
                  gpu_memory_utilization=0.9, overhead_gb=0.0, block_size=KV_BLOCK_SIZE,
                  advice_seq_len=4096) -> MemoryBudget:
    """How much KV cache a model leaves on ``tensor_parallel`` GPUs of ``gpu_memory_gb`` each.

    ``weight_dtype``/``kv_dtype``: bytes per value or a dtype name (quantization).
    ``gpu_memory_utilization``: fraction of each GPU the server may use (vLLM's default 0.9).
    ``overhead_gb``: per-GPU memory reserved for activations, CUDA graphs, etc.
    ``fits`` is True when the weights and overhead fit with room for at least one KV block;
    otherwise ``advice`` says by how much memory falls short and what would fit: the widest
    weight precision that fits, or how many GPUs with tensor parallelism.
    """
    model = get_model(config)
    gpu_memory_gb = positive_float("gpu_memory_gb", gpu_memory_gb)
    tp = positive_int("tensor_parallel", tensor_parallel)
    util = fraction("gpu_memory_utilization", gpu_memory_utilization)
    wbytes = bytes_per_value("weight_dtype", weight_dtype)
    kvbytes = bytes_per_value("kv_dtype", kv_dtype)
    overhead_gb = positive_float("overhead_gb", overhead_gb, allow_zero=True)
    block_size = positive_int("block_size", block_size)
    advice_seq_len = positive_int("advice_seq_len", advice_seq_len)

    def numbers_for(w=wbytes, n=tp):
        return _budget_numbers(model, gpu_memory_gb, n, util, w, kvbytes, overhead_gb, block_size)

    usable, weights, overhead, per_token, budget, tokens, blocks = numbers_for()
    fits = blocks >= 1
    if fits:
        seqs = blocks // blocks_needed(advice_seq_len, block_size)
        advice = (f"fits: weights take {weights / GB:.1f} GB of {usable / GB:.1f} GB usable; the KV "
                  f"cache gets {budget / GB:.1f} GB = {tokens:,} tokens ({blocks:,} blocks of "
                  f"{block_size}), room for {seqs:,} sequences of {advice_seq_len:,} tokens.")
    else:
        short = weights + overhead + per_token * block_size - usable
        parts = [f"does not fit: the weights need {weights / GB:.1f} GB but only "
                 f"{(usable - overhead) / GB:.1f} GB is usable on {tp} GPU(s) of "
                 f"{gpu_memory_gb:g} GB; short by {short / GB:.1f} GB."]
        for bits, w in ((8, 1.0), (4, 0.5)):
            if w < wbytes and numbers_for(w=w)[-1] >= 1:
                parts.append(f"Quantize the weights to {bits} bits "
                             f"({model.total_params() * w / GB:.1f} GB) to fit.")
                break
        else:
            parts.append("Even 4-bit weights do not fit.")
        n = tp
        while n < 1024 and numbers_for(n=n)[-1] < 1:
            n *= 2
        if n < 1024:
            parts.append(f"Or add GPUs: {n} GPUs with tensor parallelism (tensor_parallel={n}).")
        advice = " ".join(parts)
    return MemoryBudget(model=model, gpu_memory_gb=gpu_memory_gb, tensor_parallel=tp,
                        gpu_memory_utilization=util, weight_bytes_per_value=wbytes,
                        kv_bytes_per_value=kvbytes, block_size=block_size, usable_bytes=usable,
                        weights_bytes=weights, overhead_bytes=overhead,
                        kv_bytes_per_token=per_token, kv_budget_bytes=budget,
                        max_kv_tokens=tokens, kv_blocks=blocks, fits=fits, advice=advice)


