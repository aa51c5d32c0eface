"""KV-cache sizes and the GPU memory budget of a model.

Units: bytes; GB = 10**9 bytes (the unit of "N billion parameters x bytes" and of the
``gpu_memory_gb`` argument), GiB = 2**30 bytes (what devices and serving engines report: an
"80 GB" A100 reports 81,920 MiB = 80 GiB = 85.9 GB). Bytes per value: 2 fp16/bf16, 1 fp8/int8,
0.5 int4; FP4 with its block scales 0.5625 (nvfp4, fp4) or 0.53125 (mxfp4): :mod:`.fp4`. :func:`memory_budget` does a serving engine's accounting (vLLM's, SGLang's or
TensorRT-LLM's), term by term; the terms and their sources are in :mod:`sim.specs.memory_terms`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import each_gpu, fraction, plural, positive_float, positive_int
from ..constants import KV_BLOCK_SIZE
from . import layers
from .fp4 import FP4_DTYPES, fp4_bytes
from . import memory_terms as terms
from .memory_terms import GiB, MemoryTerm
from .models import ModelConfig, get_model
from .replica_layout import more_gpus_advice, routed_expert_params, weight_bytes_per_gpu

DTYPE_BYTES = {"fp32": 4.0, "float32": 4.0, "fp16": 2.0, "float16": 2.0, "bf16": 2.0,
               "bfloat16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5,
               **{f: fp4_bytes(f) for f in FP4_DTYPES}}  # 4-bit values + block scales
GB = 1e9
ACCOUNTINGS = ("vllm", "sglang", "tensorrt-llm")
# memory_budget's engine knobs -> the accountings that read them (each engine's own settings;
# a knob given to another accounting would change nothing and is refused)
READ_BY = {"gpu_memory_utilization": ("vllm",), "non_torch_gb": ("vllm",),
           "max_num_seqs": ("vllm",), "max_num_batched_tokens": ("vllm", "tensorrt-llm"),
           "mem_fraction_static": ("sglang",), "free_gpu_memory_fraction": ("tensorrt-llm",)}
_HOLDS = {"vllm": "vLLM leaves", "sglang": "SGLang's static pool leaves",
          "tensorrt-llm": "TensorRT-LLM's free fraction leaves"}


def bytes_per_value(name: str, dtype) -> float:
    """Bytes per value from a number (2, 1, 0.5) or a dtype name ("fp16", "int8", "int4")."""
    if isinstance(dtype, str):
        key = dtype.strip().lower()
        if key not in DTYPE_BYTES:
            raise ValueError(f"{name} must be one of {sorted(DTYPE_BYTES)} or bytes per value, "
                             f"got {dtype!r}")
        return DTYPE_BYTES[key]
    return positive_float(name, dtype)


def kv_cache_bytes(N, n_layers=None, n_heads_kv=None, d_head=None, dtype=2, *, model=None,
                   tensor_parallel=1):
    """Bytes of the KV cache of ``N`` tokens.

    ``kv_cache_bytes(N, n_layers, n_heads_kv, d_head, dtype=2)``: K and V of every head,
    ``2 * N * n_layers * n_heads_kv * d_head * dtype`` (MHA/GQA; the cheat sheet's formula).
    ``kv_cache_bytes(N, model=m, dtype=2, tensor_parallel=1)``: from a model (a preset name,
    ``ModelConfig`` or HF config dict), on ONE GPU of a ``tensor_parallel`` group:
    ``N * dtype * m.kv_cache_values_per_token(tensor_parallel)``, i.e. the formula above with the
    GPU's KV heads, or for multi-head latent attention (DeepSeek-V2/V3) one latent of
    ``kv_lora_rank + qk_rope_head_dim`` values per token and layer, whole on every GPU.
    """
    positive_int("N", N, allow_zero=True)  # 0 tokens hold 0 bytes, as blocks_needed(0) == 0
    dtype = bytes_per_value("dtype", dtype)
    if model is not None:
        given = [k for k, v in (("n_layers", n_layers), ("n_heads_kv", n_heads_kv),
                                ("d_head", d_head)) if v is not None]
        if given:
            raise ValueError(f"give model= or {', '.join(given)}, not both")
        return kv_cache_bytes_of(N, get_model(model).kv_cache_values_per_token(tensor_parallel),
                                 dtype)
    else:
        for name, value in (("n_layers", n_layers), ("n_heads_kv", n_heads_kv),
                            ("d_head", d_head)):
            if value is None:
                raise ValueError(f"{name} is required (or give model=)")
            positive_int(name, value)
        total = 2 * N * n_layers * n_heads_kv * d_head * dtype
    return _whole(total)


def kv_cache_bytes_of(N, values_per_token, dtype) -> int | float:
    """``kv_cache_bytes(N, model=...)`` from its factors, already checked (a model's
    ``kv_cache_values_per_token`` and the dtype's bytes per value): for a caller that prices
    many token counts of one model (a KV transfer per request)."""
    return _whole(N * values_per_token * dtype)


def _whole(total):
    return int(total) if float(total).is_integer() else total


def sequence_kv_bytes(seq_len, model, dtype=2, tensor_parallel=1, block_size=None):
    """Bytes ONE sequence of ``seq_len`` tokens holds on one GPU of a ``tensor_parallel`` group,
    per layer type (:mod:`sim.specs.layers`): full-attention layers the KV of every token,
    sliding-window / chunked layers of the tokens their window keeps (it stops growing past the
    window), linear-attention layers their fixed state (in the activations' 2 bytes: vLLM's
    mamba-style cache takes the model's dtype, not the KV cache's). ``block_size``: each
    attention layer's tokens rounded up to whole blocks (the paged pool's use), else exact.
    For a model with only full layers this is ``kv_cache_bytes(seq_len, model=...)`` (rounded
    to blocks when asked)."""
    m = get_model(model)
    seq_len = positive_int("seq_len", seq_len, allow_zero=True)
    dtype = bytes_per_value("dtype", dtype)
    tp = terms.check_tensor_parallel(m, positive_int("tensor_parallel", tensor_parallel))

    def held(tokens):
        return tokens if block_size is None else blocks_needed(tokens, block_size) * block_size

    per_layer = m.kv_values_per_token_per_layer(tp) * dtype
    if not m.has_local_layers:
        return _whole(held(seq_len) * m.kv_cache_values_per_token(tp) * dtype)
    counts = m.layer_counts()
    total = counts.get(layers.FULL, 0) * held(seq_len) * per_layer
    local = counts.get(layers.SLIDING, 0) + counts.get(layers.CHUNKED, 0)
    total += local * held(layers.local_tokens(m, seq_len)) * per_layer
    if seq_len and counts.get(layers.LINEAR):
        total += counts[layers.LINEAR] * layers.linear_state_values(m, tp) * STATE_BYTES
    return _whole(total)


STATE_BYTES = 2  # a linear-attention layer's state, in the model's (activation) dtype


def blocks_needed(tokens, block_size=KV_BLOCK_SIZE) -> int:
    """Paged-KV blocks holding ``tokens`` tokens: ``ceil(tokens / block_size)`` (0 tokens: 0)."""
    tokens = positive_int("tokens", tokens, allow_zero=True)
    block_size = positive_int("block_size", block_size)
    return -(-tokens // block_size)


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """Where a GPU's memory goes, as the serving engine accounts for it (``accounting``).

    ``terms`` are :class:`~sim.specs.memory_terms.MemoryTerm` s on ONE GPU of the
    ``tensor_parallel`` group (vLLM: requested, weights, activations, non_torch, reserved;
    SGLang: static_pool, weights, reserved; TensorRT-LLM: device, weights, activations, non_torch,
    reserved, held_back); they add up to ``kv_bytes_per_gpu`` unless that
    is negative, when it is 0. Every GPU holds ``kv_blocks`` blocks of ``kv_block_bytes_per_gpu``.
    The totals ``usable_bytes``, ``weights_bytes``, ``overhead_bytes`` (every other
    deduction) and ``kv_budget_bytes`` are over the ``tensor_parallel`` GPUs;
    ``kv_bytes_per_token`` is the model's (all KV heads once; an MLA model's latent, which every
    GPU holds whole).
    """

    model: ModelConfig
    gpu_memory_gb: float
    tensor_parallel: int
    gpu_memory_utilization: float | None  # vLLM's accounting only
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
    accounting: str
    device_memory_bytes: int
    terms: tuple
    kv_bytes_per_gpu: int
    kv_block_bytes_per_gpu: float

    def term(self, name) -> int:
        """The bytes of the term called ``name`` (0 when the accounting has no such term)."""
        return sum(t.bytes for t in self.terms if t.name == name)

    def max_batch_size(self, seq_len) -> int:
        """How many sequences of ``seq_len`` tokens fit in the KV blocks at once. A model with
        sliding-window, chunked or linear-attention layers: the KV bytes per GPU over one
        sequence's :func:`sequence_kv_bytes` in whole blocks (each local layer holding its
        window, each linear layer its state), as vLLM's hybrid KV cache manager frees the
        blocks behind a window (the engine's pool does the same: :mod:`sim.engine.kv.layer_groups`,
        there each request's pages rounded to whole blocks)."""
        need = blocks_needed(positive_int("seq_len", seq_len), self.block_size)
        if not self.model.has_local_layers:
            return self.kv_blocks // need
        per_seq = sequence_kv_bytes(seq_len, self.model, self.kv_bytes_per_value,
                                    self.tensor_parallel, block_size=self.block_size)
        return int(self.kv_bytes_per_gpu // per_seq)


def _terms(model, device, tp, wbytes, s):
    """The per-GPU terms of accounting ``s["accounting"]`` (see :mod:`.memory_terms`)."""
    ep, eb = s["expert_parallel"], s["expert_bytes"]
    experts = routed_expert_params(model)
    weights = round(weight_bytes_per_gpu(model, tp, wbytes, ep, eb))
    if ep == 1 and eb is None:
        w = MemoryTerm("weights", -weights, f"{model.total_params() / 1e9:.2f} B parameters x "
                       f"{wbytes:g} B / {plural(tp, 'GPU')}")  # (replicated norms: < 0.01%)
    elif eb is None:  # the experts whole, E / ep of them per GPU; the rest over the TP GPUs
        w = MemoryTerm("weights", -weights, f"{(model.total_params() - experts) / 1e9:.2f} B "
                       f"parameters / {plural(tp, 'GPU')} + {experts / 1e9:.2f} B of experts / "
                       f"{ep} (expert_parallel) x {wbytes:g} B")
    else:  # the routed experts in their own precision (gpt-oss's MXFP4), over EP or TP
        n = ep if ep > 1 else tp
        w = MemoryTerm("weights", -weights, f"{(model.total_params() - experts) / 1e9:.2f} B "
                       f"parameters x {wbytes:g} B / {plural(tp, 'GPU')} + {experts / 1e9:.2f} "
                       f"B of experts x {eb:g} B / {plural(n, 'GPU')}")
    reserved = round(s["overhead_gb"] * GB)
    extra = [MemoryTerm("reserved", -reserved, "overhead_gb, reserved by the caller")] \
        if reserved else []
    if s["accounting"] == "sglang":
        f = s["mem_fraction_static"]
        why = "given"
        if f is None:
            f = terms.sglang_mem_fraction_static(device / terms.MiB, tp)
            why = f"SGLang's default for {device / terms.MiB:,.0f} MiB, TP {tp}"
        pool = MemoryTerm("static_pool", round(f * device),
                          f"mem_fraction_static {f:g} ({why}) x device memory; activations, "
                          f"CUDA graphs and NCCL use the rest")
        return [pool, w] + extra
    tokens, seqs = s["max_num_batched_tokens"], s["max_num_seqs"]
    if s["accounting"] == "tensorrt-llm":
        return _trtllm_terms(model, device, tp, w, tokens, s["free_gpu_memory_fraction"], extra)
    act = terms.vllm_activation_peak_bytes(model, tokens, seqs, tp)
    which = ("forward pass" if act == terms.forward_peak_bytes(model, tokens, tp)
             else "sampler")
    non_torch = (terms.vllm_non_torch_bytes(tp) if s["non_torch_gb"] is None
                 else round(s["non_torch_gb"] * GB))
    return [MemoryTerm("requested", round(s["util"] * device),
                       f"gpu_memory_utilization {s['util']:g} x device memory"),
            w,
            MemoryTerm("activations", -act, f"profile_run peak of {tokens:,} tokens, "
                       f"{min(seqs, tokens):,} sampled sequences ({which})"),
            MemoryTerm("non_torch", -non_torch, "NCCL, cuBLAS and backend buffers (measured "
                       "by llm-d)" if s["non_torch_gb"] is None else "non_torch_gb, given")
            ] + extra


def _trtllm_terms(model, device, tp, w, tokens, f, extra):
    """TensorRT-LLM's terms: what is free after the weights, the engine's activations and the
    rest in use, of which the KV cache gets the fraction ``f`` and ``held_back`` the others."""
    why = "given"
    if f is None:
        f, why = terms.TRTLLM_FREE_GPU_MEMORY_FRACTION, "TensorRT-LLM's default"
    act = terms.forward_peak_bytes(model, tokens, tp)
    parts = [MemoryTerm("device", device, "device memory as reported"), w,
             MemoryTerm("activations", -act, f"engine activations for max_num_tokens "
                        f"{tokens:,} (one decoder layer's forward pass)"),
             MemoryTerm("non_torch", -terms.trtllm_non_torch_bytes(tp),
                        "CUDA context, runtime and decoder buffers (TensorRT-LLM's log)"
                        + (" + NCCL (measured by llm-d)" if tp > 1 else ""))] + extra
    free = max(0, sum(t.bytes for t in parts))
    return parts + [MemoryTerm("held_back", -round((1 - f) * free),
                               f"1 - free_gpu_memory_fraction {f:g} ({why}) of the "
                               f"{free / GiB:.2f} GiB free")]


def _kv_numbers(model, device, tp, wbytes, kvbytes, block_size, s):
    parts = _terms(model, device, tp, wbytes, s)
    kv = max(0, sum(t.bytes for t in parts))
    per_token = kv_cache_bytes(1, model=model, dtype=kvbytes, tensor_parallel=tp)
    tokens = int(kv // per_token)
    return parts, kv, per_token, tokens, tokens // block_size


def memory_budget(config, gpu_memory_gb, *, weight_dtype=2, kv_dtype=2, tensor_parallel=1,
                  gpu_memory_utilization=None, overhead_gb=0.0, block_size=KV_BLOCK_SIZE,
                  advice_seq_len=4096, accounting="vllm",
                  max_num_batched_tokens=terms.VLLM_MAX_NUM_BATCHED_TOKENS,
                  max_num_seqs=terms.VLLM_MAX_NUM_SEQS, non_torch_gb=None,
                  mem_fraction_static=None, free_gpu_memory_fraction=None,
                  expert_parallel=1, expert_weight_dtype=None,
                  max_tensor_parallel=None) -> MemoryBudget:
    """How much KV cache a model leaves on ``tensor_parallel`` GPUs of ``gpu_memory_gb`` each.

    ``gpu_memory_gb``: the memory each GPU reports, in GB of 10**9 bytes (a preset's
    ``get_gpu(name).memory_gb`` is nvidia-smi's total, e.g. 85.9 for an A100 "80GB").
    ``weight_dtype``/``kv_dtype``: bytes per value or a dtype name (quantization).
    ``accounting="vllm"`` (default): ``gpu_memory_utilization`` (None: vLLM's default 0.9) x device
    memory - weights - the activation peak of ``max_num_batched_tokens`` tokens over
    ``max_num_seqs`` sequences - non-torch memory (measured figures unless ``non_torch_gb`` is
    given). ``accounting="sglang"``: ``mem_fraction_static`` (default: SGLang's own for this GPU
    and TP) x device memory - weights; ``gpu_memory_utilization`` is not used.
    ``accounting="tensorrt-llm"``: ``free_gpu_memory_fraction`` (default TensorRT-LLM's 0.9;
    below 1) x (device memory - weights - the activations of ``max_num_batched_tokens`` tokens,
    its ``max_num_tokens`` - the other memory in use); ``gpu_memory_utilization`` and
    ``max_num_seqs`` are not used.
    ``expert_parallel``: the GPUs a MoE model's experts spread over, each holding ``E /
    expert_parallel`` whole experts beside ``1 / tensor_parallel`` of the other weights (more
    GPUs than ``tensor_parallel``: attention data-parallel, as SGLang's DP attention).
    ``expert_weight_dtype``: the routed experts' own bytes per value or dtype (gpt-oss ships
    them in mxfp4, the rest in bf16); None: ``weight_dtype``.
    ``overhead_gb``: a further per-GPU reserve of the caller's. Terms and sources:
    :mod:`sim.specs.memory_terms`.
    ``fits`` is True when every GPU keeps room for at least one KV block; otherwise ``advice``
    says by how much memory falls short and what would fit: the widest weight precision that
    fits, or how many GPUs with tensor parallelism (at most ``max_tensor_parallel``, one
    scale-up domain of the GPU, where given: then with quantized weights if need be).
    """
    model = get_model(config)
    gpu_memory_gb = positive_float("gpu_memory_gb", gpu_memory_gb)
    tp = terms.check_tensor_parallel(model, positive_int("tensor_parallel", tensor_parallel))
    wbytes = bytes_per_value("weight_dtype", weight_dtype)
    kvbytes = bytes_per_value("kv_dtype", kv_dtype)
    overhead_gb = positive_float("overhead_gb", overhead_gb, allow_zero=True)
    block_size = positive_int("block_size", block_size)
    advice_seq_len = positive_int("advice_seq_len", advice_seq_len)
    if accounting not in ACCOUNTINGS:
        raise ValueError(f"accounting must be one of {ACCOUNTINGS}, got {accounting!r}")
    for knob, value in (("gpu_memory_utilization", gpu_memory_utilization),
                        ("mem_fraction_static", mem_fraction_static),
                        ("non_torch_gb", non_torch_gb),
                        ("free_gpu_memory_fraction", free_gpu_memory_fraction)):
        if value is not None and accounting not in READ_BY[knob]:  # it would change nothing
            raise ValueError(f"{knob} is used by accounting={READ_BY[knob][0]!r} only, got "
                             f"{value!r} with accounting={accounting!r}")
    util = (terms.VLLM_GPU_MEMORY_UTILIZATION if gpu_memory_utilization is None
            else fraction("gpu_memory_utilization", gpu_memory_utilization))
    ep = positive_int("expert_parallel", expert_parallel)
    if ep > 1 and (not model.is_moe or model.num_local_experts % ep):
        raise ValueError(f"expert_parallel {ep} must divide the experts of a MoE model; "
                         f"{model.name!r} has {model.num_local_experts}")
    s = {"accounting": accounting, "util": util, "overhead_gb": overhead_gb,
         "expert_parallel": ep, "expert_bytes": None if expert_weight_dtype is None else
         bytes_per_value("expert_weight_dtype", expert_weight_dtype),
         "max_num_batched_tokens": positive_int("max_num_batched_tokens", max_num_batched_tokens),
         "max_num_seqs": positive_int("max_num_seqs", max_num_seqs),
         "non_torch_gb": None if non_torch_gb is None else positive_float(
             "non_torch_gb", non_torch_gb, allow_zero=True),
         "mem_fraction_static": None if mem_fraction_static is None else fraction(
             "mem_fraction_static", mem_fraction_static),
         "free_gpu_memory_fraction": None if free_gpu_memory_fraction is None else
         terms.check_free_gpu_memory_fraction(free_gpu_memory_fraction)}
    device = round(gpu_memory_gb * GB)  # the device reports whole bytes

    def numbers_for(w=wbytes, n=tp):
        return _kv_numbers(model, device, n, w, kvbytes, block_size, s)

    parts, kv, per_token, tokens, blocks = numbers_for()
    weights = -sum(t.bytes for t in parts if t.name == "weights")
    budget = sum(t.bytes for t in parts if t.bytes > 0)  # requested / static pool
    fits = blocks >= 1
    if fits:
        seqs = blocks // blocks_needed(advice_seq_len, block_size)
        advice = (f"fits: weights take {weights / GiB:.2f} GiB of {budget / GiB:.2f} GiB "
                  f"{parts[0].name} on {each_gpu(tp)}; the KV cache gets "
                  f"{kv / GiB:.2f} GiB per GPU = {blocks:,} blocks of "
                  f"{plural(block_size, 'token')} ({blocks * block_size:,} tokens; the bytes "
                  f"alone would hold {tokens:,}), room for {plural(seqs, 'sequence')} of "
                  f"{advice_seq_len:,} tokens.")
    elif tokens >= 1:  # room for KV, not for one block of this size: the block is too big
        advice = (f"block_size={block_size:,} does not fit: one KV block of "
                  f"{plural(block_size, 'token')} needs {per_token * block_size / GiB:.2f} GiB "
                  f"per GPU, but the KV cache gets {kv / GiB:.2f} GiB ({tokens:,} tokens) on "
                  f"{each_gpu(tp)}: give a smaller block_size (vLLM's is 16)")
    else:
        short = per_token * block_size - sum(t.bytes for t in parts)
        room = sum(t.bytes for t in parts) + weights
        parts_ = [f"does not fit: the weights need {weights / GiB:.2f} GiB per GPU but "
                  f"{_HOLDS[accounting]} {room / GiB:.2f} GiB for weights and KV cache on "
                  f"{each_gpu(tp)} of {device / GiB:.2f} GiB; short by {short / GiB:.2f} GiB "
                  f"per GPU."]
        knob, given = {"vllm": ("gpu_memory_utilization", gpu_memory_utilization),
                       "sglang": ("mem_fraction_static", mem_fraction_static),
                       "tensorrt-llm": ("free_gpu_memory_fraction",
                                        free_gpu_memory_fraction)}[accounting]
        if given is not None:  # the memory fraction given, not the model, may be what is short
            default = dict(s, util=terms.VLLM_GPU_MEMORY_UTILIZATION, mem_fraction_static=None,
                           free_gpu_memory_fraction=None)
            room_blocks = _kv_numbers(model, device, tp, wbytes, kvbytes, block_size, default)[-1]
            if room_blocks >= 1:
                parts_.append(f"The {knob} given ({given:g}) is what leaves no room: the "
                              f"engine's default gives {room_blocks:,} blocks.")
        for bits, w in ((8, 1.0), (4, 0.5)):
            if w < wbytes and numbers_for(w=w)[-1] >= 1:
                parts_.append(f"Quantize the weights to {bits} bits "
                              f"({model.total_params() * w / GiB:.1f} GiB) to fit.")
                break
        else:
            parts_.append("Even 4-bit weights do not fit.")
        parts_.append(more_gpus_advice(numbers_for, tp, wbytes, max_tensor_parallel))
        advice = " ".join(p for p in parts_ if p)
    return MemoryBudget(
        model=model, gpu_memory_gb=gpu_memory_gb, tensor_parallel=tp,
        gpu_memory_utilization=util if accounting == "vllm" else None,
        weight_bytes_per_value=wbytes, kv_bytes_per_value=kvbytes,
        block_size=block_size, usable_bytes=budget * tp, weights_bytes=weights * tp,
        overhead_bytes=(budget - weights - sum(t.bytes for t in parts)) * tp,
        kv_bytes_per_token=kv_cache_bytes(1, model=model, dtype=kvbytes),
        kv_budget_bytes=kv * tp, max_kv_tokens=tokens, kv_blocks=blocks, fits=fits,
        advice=advice, accounting=accounting, device_memory_bytes=device, terms=tuple(parts),
        kv_bytes_per_gpu=kv, kv_block_bytes_per_gpu=per_token * block_size)
