"""Roofline cost model from published GPU specs, with efficiencies fitted to measured kernels.

Per iteration, per layer, each op costs ``max(FLOPs / (peak x compute_eff), bytes /
(bandwidth x memory_eff), kernel_floor)``. :class:`RooflineCost` adds up, per iteration:

- the linear and elementwise ops of every layer (GEMMs, a MoE layer's router, routing and
  experts, norms, RoPE, the activation, residual adds): :mod:`sim.costs.roofline_ops`;
- attention, prefill chunks over their cached context and decodes over theirs (MLA as vLLM
  runs it): :mod:`sim.costs.roofline_attention`; sliding-window, chunked and linear-attention
  layers over their window or fixed state: :mod:`sim.costs.roofline_layers`;
- tensor parallelism's all-reduces, two per layer (NCCL's measured times, a ring model, or the
  custom kernel on NVLink): :mod:`sim.costs.roofline_collectives`; expert parallelism's
  dispatch and combine and its busiest GPU's experts: :mod:`sim.costs.expert_parallel`;
- the LM head once per iteration for the tokens that sample;
- fixed costs the kernel timings miss (:meth:`RooflineCost.fixed_time`): ``overhead_s`` per
  iteration (the engine's CPU work: scheduling, input preparation, sampler launch),
  ``overhead_per_seq_s`` per sequence in the batch (output processing; 0 by default: engines
  since vLLM 0.6 overlap it with the GPU) and ``eager_layer_overhead_s`` per layer when the
  iteration launches its kernels one by one (the gaps between kernels that per-kernel timings
  miss): every batch with a prefill, and decode-only batches of more than
  ``cuda_graph_max_batch`` sequences; smaller decode batches replay a CUDA graph and pay no
  per-layer term (vLLM captures graphs for decode batches up to 512 by default).

Compute peak by weight dtype (``compute_dtype``): fp8 weights run FP8 GEMMs at the FP8 peak
with their own fitted efficiency (``fp8_gemm_compute_eff``); int8 at the INT8 peak; fp4 at the
FP4 peak only on a GPU that has one (Blackwell), with the FP8 efficiency (no FP4 measurement
yet); everything else, fp4 on a GPU without FP4 tensor cores and int4 included, dequantises the
weights and computes at the fp16 peak (``compute_note`` says so). int4 weights also read one fp16
scale and one fp16 zero per ``int4_group_size`` weights (AWQ/GPTQ: 128; gpt-fast: 32).

The efficiencies per GPU come from ``sim/data/roofline_fit.json``, fitted by
``experiments/fit_roofline.py`` to Vidur's measured A100/H100 per-layer timings; the fixed costs,
the FP8 efficiency and the decode attention's bandwidth efficiency to published end-to-end
measurements (``sim/data/cpu_overheads.csv``, ``sim/data/published_latency.csv``, every row
sourced); the prefill attention's efficiency curves to published FlashAttention-2/-3 forward
benchmarks, FP16 and FP8 (``sim/data/attention_kernels.csv``). The terms
and their fitted values live in :mod:`sim.costs.roofline_params`.

Invariants (this module's: the memoised token-count path and the hot path): linear-op time
depends only on the number of tokens, so it is memoised per token count
(:meth:`RooflineCost.layers_time`, priced ``LAYERS_BLOCK`` counts at a time; the hot path is a
dict lookup); ``cost(batch)`` and :meth:`RooflineCost.pure_decode_cost` add the same terms in
the same order, so they agree bit for bit; the price reads only the batch snapshot.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..checks import positive_int
from ..specs.gpus import check_scaleup_domain, get_gpu
from ..specs.memory import bytes_per_value
from ..specs.memory_terms import check_tensor_parallel
from ..specs.models import get_model
from .expert_parallel import ExpertParallel
from .roofline_attention import RooflineAttention
from .roofline_collectives import RooflineCollectives
from .roofline_layers import RooflineLayers
from .roofline_ops import ACT_BYTES, RooflineOps
from .roofline_params import (ELEMENTWISE_OPS, GEMM_OPS, MOE_GEMM_OPS, MOE_STREAM_OPS,
                              RooflineParams, compute_peak, fitted_gpus, fitted_params,
                              profiled_gpus)
from .roofline_price import DecodePrice

__all__ = ["ELEMENTWISE_OPS", "GEMM_OPS", "MOE_GEMM_OPS", "MOE_STREAM_OPS", "RooflineCost",
           "RooflineParams", "fitted_params", "shared_roofline"]

_GPU_KEYS = {"A100-80GB-SXM": "a100", "H100-80GB-SXM": "h100", "H200-141GB-SXM": "h200",
             "L40S": "l40s", "B200-HGX": "b200", "MI300X": "mi300x", "B300-HGX": "b300"}


class RooflineCost(RooflineOps, RooflineCollectives, RooflineAttention, RooflineLayers,
                   ExpertParallel):
    """``cost(batch) -> seconds`` for ``model`` on ``gpu`` (see the module docstring; the
    terms are the three mixins')."""

    name = "roofline"
    splits_attention = False  # DPAttentionCost prices each data-parallel rank's share
    # costs.roofline_price.batch_pricer may price it from a batch's fields (a subclass
    # re-pricing __call__ does not inherit the promise: checks.declared_with)
    fields_priced = True

    def __init__(self, model="llama-3.1-8b", gpu="h100", *, tensor_parallel=1,
                 weight_dtype="fp16", kv_dtype="fp16", params: RooflineParams | None = None,
                 activation_dtype=None, expert_parallel=1, expert_skew=0.0, attention_dp=1,
                 expert_weight_dtype=None):
        if attention_dp != 1 and not self.splits_attention:
            raise ValueError(f"attention_dp {attention_dp!r}: data-parallel attention prices "
                             f"each rank's share of the batch, "
                             f"sim.costs.dp_attention.DPAttentionCost")
        self.model = get_model(model)
        self.gpu = get_gpu(gpu)
        self.gpu_key = _GPU_KEYS.get(self.gpu.name, self.gpu.name.lower())
        self.tp = check_scaleup_domain(self.gpu, check_tensor_parallel(
            self.model, positive_int("tensor_parallel", tensor_parallel)))
        self.weight_dtype = weight_dtype
        self.kvb = bytes_per_value("kv_dtype", kv_dtype)
        self.kv_dtype = kv_dtype
        self.params = params or fitted_params(self.gpu_key)
        # whether this GPU's efficiency terms were fitted to its own kernels (per-op profiles,
        # or published GEMM / all-reduce timings), or assumed (the mean of the profiled GPUs'
        # terms, roofline_params.mean_terms); a GPU with only published kernel timings has
        # some of each (roofline_terms.provenance says which)
        self.terms_fitted = self.gpu_key in fitted_gpus()
        self.terms_profiled = self.gpu_key in profiled_gpus()
        donors = ", ".join(profiled_gpus())
        if self.terms_profiled:
            self.terms_note = f"efficiency terms fitted to {self.gpu.name} kernel timings"
        elif self.terms_fitted:
            from .roofline_terms import fitted_terms
            self.terms_note = (f"efficiency terms partly fitted to {self.gpu.name}'s published "
                               f"kernel timings ({', '.join(fitted_terms(self.gpu_key))}), the "
                               f"rest assumed: the mean of the profiled GPUs' ({donors})")
        else:
            self.terms_note = (f"efficiency terms assumed for {self.gpu.name}: the mean of the "
                               f"fitted GPUs' ({donors})")
        self.wb = self._gemm_weight_bytes("weight_dtype", weight_dtype)
        g = self.gpu
        self.bw = g.memory_bandwidth_gbps * 1e9
        self.peak_fp16 = g.fp16_tflops * 1e12
        self.compute_dtype, self.peak, self.compute_note = compute_peak(
            weight_dtype, self.wb, g, activation_dtype)
        p = self.params
        self._gemm_ce = self._gemm_efficiency(self.compute_dtype)
        self._init_expert_dtype(expert_weight_dtype, activation_dtype)
        self._linear_cache = {}
        self._layers_rows = {}  # token count // LAYERS_BLOCK -> layers_time of the block
        m = self.model
        layers = m.num_hidden_layers
        self._fixed_s = p.overhead_s
        self._eager_s = layers * p.eager_layer_overhead_s
        self._per_seq_s = p.overhead_per_seq_s
        self._graph_max = p.cuda_graph_max_batch
        self._allreduces_per_layer = p.parallel_block_allreduces if m.parallel_attn else 2
        self._init_attention()
        self._init_layers()  # sliding/chunked/linear layers (none: the prices above alone)
        self._init_expert_parallel(expert_parallel, expert_skew,  # (1: nothing added)
                                   attention_dp)

    def _init_expert_dtype(self, dtype, activation_dtype) -> None:
        """The routed experts' own precision (gpt-oss: mxfp4 beside bf16): ``ewb`` bytes per
        weight their GEMMs read and ``_expert_rate`` FLOP/s (the peak ``compute_peak`` gives
        that dtype, at its fitted efficiency); None: the other weights' (``wb``, ``peak``)."""
        from ..specs.memory import DTYPE_BYTES  # (checked; "checkpoint": the model's own)
        from ..specs.memory_terms import resolve_expert_dtype
        self.expert_weight_dtype = dtype = resolve_expert_dtype(self.model, dtype,
                                                                tuple(DTYPE_BYTES))
        self.ewb, self._expert_rate = self.wb, None
        if dtype is None:
            return
        self.ewb = self._gemm_weight_bytes("expert_weight_dtype", dtype)
        kind, peak, _ = compute_peak(dtype, self.ewb, self.gpu, activation_dtype)
        self._expert_rate = peak * self._gemm_efficiency(kind)

    def _gemm_weight_bytes(self, field, dtype) -> float:
        """Bytes a GEMM reads per weight of ``dtype`` (``field``: the setting, for its error);
        int4 adds its groups' fp16 scale and zero."""
        wb = bytes_per_value(field, dtype)
        if str(dtype).lower() == "int4":
            wb += 2 * ACT_BYTES / self.params.int4_group_size
        return wb

    def _gemm_efficiency(self, kind) -> float:
        """The fitted GEMM compute efficiency for a GEMM computing in ``kind``
        (``compute_peak``'s): the FP8 one for fp8 and fp4 where fitted, else the fp16 one."""
        p = self.params
        return ((p.fp8_gemm_compute_eff or p.gemm_compute_eff) if kind in ("fp8", "fp4")
                else p.gemm_compute_eff)

    LAYERS_BLOCK = 512  # token counts priced at once on a linear-time memo miss

    def layers_time(self, tokens: int) -> float:
        """All layers' linear ops and all-reduces for an iteration of ``tokens`` tokens (no
        sampling). Priced ``LAYERS_BLOCK`` token counts at a time through :meth:`op_times`'
        array path (one vectorised pass where a miss of an iteration's varying token count
        cost ~40 us of scalar Python, measured): elementwise, the same IEEE operations in the
        same order as the scalar path, so the same floats bit for bit (tests/test_roofline.py
        checks every preset against the scalar sum); the all-reduces too
        (``allreduce_times``, bit for bit ``allreduce_time`` of each)."""
        block, j = divmod(tokens - 1, self.LAYERS_BLOCK)
        row = self._layers_rows.get(block) if tokens > 0 else None
        if row is None:
            if tokens < 1:  # (no token: priced alone, not memoised)
                return self._layers_times(np.array([tokens]))[0]
            row = self._layers_rows[block] = self._layers_times(
                np.arange(block * self.LAYERS_BLOCK + 1, (block + 1) * self.LAYERS_BLOCK + 1))
        return row[j]

    def _layers_times(self, counts) -> list:
        """:meth:`layers_time` of each token count in the int array ``counts``; with data-
        parallel attention the layers' own ops and all-reduces run on one rank's ``counts /
        attention_dp`` tokens (:mod:`sim.costs.dp_attention`)."""
        rank = counts if self.attention_dp == 1 else counts / self.attention_dp
        ops = self.op_times(rank)
        layer = sum(ops.values()) + ops["add"]  # two residual adds per layer
        if self.tp > 1:
            nbytes = self.model.hidden_size * ACT_BYTES
            layer += self._allreduces_per_layer * self.allreduce_times(rank * nbytes)
        if self.ep > 1:  # expert parallelism's all-to-alls and busiest GPU (expert_parallel)
            return (self.model.num_hidden_layers * layer
                    + self.expert_parallel_times(counts)).tolist()
        return (self.model.num_hidden_layers * layer).tolist()

    def linear_time(self, tokens, sampled) -> float:
        """Everything but attention and overhead for an iteration of ``tokens`` tokens."""
        key = (tokens, sampled)
        t = self._linear_cache.get(key)
        if t is None:
            t = self.layers_time(tokens)
            if sampled:
                t += self.lm_head_time(sampled if self.attention_dp == 1
                                       else sampled / self.attention_dp)
            self._linear_cache[key] = t
        return t

    def lm_head_time(self, sampled, maximum=max) -> float:
        """The LM head (``hidden x vocab / tp``) for ``sampled`` sampling rows (with data-
        parallel attention, one rank's share); ``maximum=np.maximum``: of each of an array."""
        p, h, v = self.params, self.model.hidden_size, self.model.vocab_size / self.tp
        return maximum(maximum(2.0 * sampled * h * v / (self.peak * self._gemm_ce),
                               (h * v * self.wb + sampled * (h + v) * ACT_BYTES)
                               / (self.bw * p.gemm_memory_eff)), p.kernel_floor_s)

    def fixed_time(self, num_seqs, *, graphed=False) -> float:
        """The fixed costs of an iteration of ``num_seqs`` sequences (see the module docstring);
        ``graphed``: a decode-only batch that replays a CUDA graph."""
        t = self._fixed_s + self._per_seq_s * num_seqs
        return t if graphed else t + self._eager_s

    def __call__(self, batch) -> float:
        # hot path (one call per iteration): a memo lookup plus closed forms; measured ~2x
        # faster than calling the per-op helpers
        n_dec = batch.num_decode_tokens
        prefills = batch.prefills
        spec = getattr(batch, "num_spec_tokens", 0)  # speculation: 1 + spec queries per decode
        q = n_dec * (1 + spec) if spec else n_dec
        key = (batch.num_prefill_tokens + q, q + len(prefills))
        t = self._linear_cache.get(key)
        if t is None:
            t = self.linear_time(*key)
        t += self._fixed_s + self._per_seq_s * key[1]  # fixed costs (fixed_time)
        if prefills or q > self._graph_max:  # graphs are captured per query-token count
            t += self._eager_s
        if n_dec:
            per_ctx = self._decode_s_per_ctx if not spec else max(
                (1 + spec) * self._decode_flops_s_per_ctx, self._decode_bytes_s_per_ctx)
            d = batch.decode_context_tokens * per_ctx
            t += d if d > self._attn_floor else self._attn_floor
        if prefills:
            a, b, c = self._prefill_coeffs
            floor, half = self._attn_floor, self._attn_half
            for new, cached in prefills:
                x = a * new * (cached + 0.5 * new)
                if half:  # efficiency saturating in the context (prefill_attention_eff)
                    x *= 1.0 + half / (cached + new)
                y = b * (cached + new) + c * new
                x = x if x > y else y
                t += x if x > floor else floor
            if self._upproj:
                for _, cached in prefills:
                    if cached:
                        t += self._upproj_time(cached)
        if self._extra_layers:  # local/linear attention layers (roofline_layers)
            t += self.extra_layers_time(batch)
        return t

    def pure_decode_cost(self, num_decodes: int):
        """The price of a batch of ``num_decodes`` decodes and nothing else (no prefill, no
        speculation) as a function of the tokens they attend over: ``f(context_tokens)``
        equals ``self(batch)`` bit for bit (the same terms added in the same order), for the
        engine's fast-forward of pure-decode iterations."""
        key = (num_decodes, num_decodes)
        t = self._linear_cache.get(key)
        if t is None:
            t = self.linear_time(*key)
        t += self._fixed_s + self._per_seq_s * num_decodes
        if num_decodes > self._graph_max:
            t += self._eager_s
        return DecodePrice(t, self._decode_s_per_ctx, self._attn_floor)

    def pure_decode_costs(self, num_decodes, context_tokens):
        """``pure_decode_cost(b)(c)`` for each ``b`` of the int array ``num_decodes`` and ``c``
        of ``context_tokens``, as an array: the same IEEE operations elementwise, in the same
        order, so the same floats bit for bit (the planner's decode bound prices every batch
        size at once; tests/test_roofline.py)."""
        b, ctx = np.asarray(num_decodes), np.asarray(context_tokens)
        blocks, j = np.divmod(b - 1, self.LAYERS_BLOCK)
        for block in np.unique(blocks).tolist():
            self.layers_time(block * self.LAYERS_BLOCK + 1)  # (memoises the block's row)
        rows = np.array([self._layers_rows[k] for k in range(int(blocks.max()) + 1)])
        t = rows[blocks, j] + self.lm_head_time(b if self.attention_dp == 1
                                                else b / self.attention_dp, np.maximum)
        t = t + (self._fixed_s + self._per_seq_s * b)
        t = np.where(b > self._graph_max, t + self._eager_s, t)
        d = ctx * self._decode_s_per_ctx
        return t + np.where(d > self._attn_floor, d, self._attn_floor)

    def least_prefill_time(self, prompts, max_tokens=None) -> float:
        """A floor under the time any schedule spends prefilling prompts of the lengths
        ``prompts`` (ints, nothing cached), for the planner's bound (:mod:`sim.tools.
        plan_bounds`), valid for any chunking and batching:

        - attention: a chunk of ``n`` new tokens over ``p`` cached costs at least ``a n (p +
          n/2)`` (the compute side of its max; the saturation factor is at least 1), which
          sums to ``a L^2 / 2`` over a prompt's chunks however it is cut;
        - the rest: an iteration of ``T`` prefill tokens costs at least ``c(T)``: the layers
          of ``T`` tokens, the LM head of one row and the fixed costs of one eager sequence.
          ``c`` never falls as ``T`` grows (tile rounding makes it a staircase;
          tests/test_roofline.py checks every GPU), so on a grid ``T_0 < T_1 < ...`` (ratio
          at most 1.01) no iteration of ``T_j <= T <= T_{j+1}`` tokens does more than
          ``T_{j+1} / c(T_j)`` tokens a second; the prompts' tokens take at least their sum
          over the most of that, for iterations of up to ``max_tokens`` (default: the
          prompts' sum, all of them in one iteration).

        The shortest prompts' own shape (many tiny prefills) is no floor: each pays a sampled
        row and the per-sequence costs, which a long prompt's chunks share."""
        L = np.asarray(prompts, dtype=float)
        top = max(int(L.sum() if max_tokens is None else max_tokens), 1)
        return float(L.sum()) / self._prefill_speed(top) + \
            self._prefill_coeffs[0] * float((L * L).sum()) / 2

    def _prefill_speed(self, top) -> float:
        """The most prompt tokens a second of iterations of up to ``top`` tokens (see
        :meth:`least_prefill_time`), memoised per ``top``."""
        memo = self.__dict__.setdefault("_prefill_speeds", {})
        if top not in memo:
            grid = np.unique(np.round(np.geomspace(1, top, int(np.log(top) / np.log(1.01)) + 2))
                             .astype(np.int64))
            one = 1 if self.attention_dp == 1 else 1 / self.attention_dp
            c = (np.array(self._layers_times(grid)) + self.lm_head_time(one)
                 + (self._fixed_s + self._per_seq_s + self._eager_s))
            memo[top] = max(float((grid[1:] / c[:-1]).max()) if len(grid) > 1 else 0.0,
                            float(grid[-1] / c[-1]))
        return memo[top]

    def __repr__(self):  # what prices differ by (a sweep keys grid values by repr)
        kv = f", kv={self.kv_dtype}" if self.kvb != 2 else ""
        fitted = fitted_params(self.gpu_key)
        own = ", ".join(f"{f.name}={getattr(self.params, f.name)!r}"
                        for f in dataclasses.fields(self.params)
                        if getattr(self.params, f.name) != getattr(fitted, f.name))
        ep = f", ep={self.ep}" + (f", skew={self.expert_skew:g}" if self.expert_skew else "") \
            + (f", dp_attention={self.attention_dp}" if self.attention_dp > 1 else "") \
            if self.ep > 1 else ""
        if self.expert_weight_dtype is not None:
            kv = f", experts={self.expert_weight_dtype}{kv}"
        return (f"RooflineCost({self.model.name!r}, {self.gpu.name!r}, tp={self.tp}{ep}, "
                f"weights={self.weight_dtype}{kv}" + (f", params({own})" if own else "") + ")")


def shared_roofline(cls, model, gpu, **kwargs):
    """``cls(model, gpu, **kwargs)`` (:class:`RooflineCost` or a subclass), one instance per
    distinct model, GPU and settings in this process: a run's default cost model, so its memo
    of token counts fills once, not once per run (a capacity search's trials, a plan's
    candidates of one model, GPU and precision; a run of 400 requests spent ~8 ms of ~40 ms
    refilling it). Sharing changes no price: a memoised value is what the instance computes
    for its arguments whenever asked, bit for bit. Keyed by the resolved model and GPU (equal
    values, not names: a ``config.json`` edited since is another model) and the GPU's fitted
    terms as they read now (a fit rerun in this process, or patched by a test, is another
    key); a key that does not hash builds a fresh instance."""
    spec = get_gpu(gpu)
    params = kwargs.pop("params", None) or fitted_params(_GPU_KEYS.get(spec.name,
                                                                       spec.name.lower()))
    key = (cls, get_model(model), spec, repr(params), tuple(sorted(kwargs.items())))
    try:
        cost = _SHARED.pop(key, None)
    except TypeError:  # (an unhashable setting: priced by an instance of its own)
        return cls(model, gpu, params=params, **kwargs)
    if cost is None:
        cost = cls(model, gpu, params=params, **kwargs)
        while len(_SHARED) >= SHARED_MAX:
            _SHARED.pop(next(iter(_SHARED)))  # (the least recently used)
    _SHARED[key] = cost  # (last: the most recently used)
    return cost


SHARED_MAX = 32  # shared roofline instances kept (each holds its memo of token counts)
_SHARED = {}  # key -> instance, least recently used first
