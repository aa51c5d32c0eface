"""What a mixture-of-experts layer does to its tokens, as expectations under uniform routing.

A MoE layer sends each of ``tokens`` tokens to ``k`` distinct experts of ``E``. Under uniform
routing (every expert equally likely, as with the random router logits of vLLM's and SGLang's
MoE kernel benchmarks) each token picks expert ``e`` with probability ``k / E``, independently of
the other tokens, so the load of one expert (the rows its GEMMs multiply) is exactly
``Binomial(tokens, k / E)``; the loads sum to ``tokens x k``.

- :func:`expected_touched`: experts with at least one token, ``E (1 - (1 - k/E)^tokens)``; each
  is read from memory once per layer, the rest are not.
- :func:`expected_busiest`: the expected load of the busiest expert, ``sum_m (1 - F(m)^E)`` with
  ``F`` the binomial CDF, and at least 1 row. It treats the loads as independent; they are
  negatively associated (a fixed total), so ``P(max <= m) <= F(m)^E`` and this is a lower
  bound: against a seeded Monte-Carlo of the real routing (``tests/test_moe.py``) within 10 %
  below 4 tokens (exact at 1) and 5 % from 4 tokens up, the gap shrinking as the tokens grow. It is what an expert-
  parallel layer waits for; under tensor parallelism every GPU holds a slice of every expert
  and a grouped GEMM spreads all experts' tiles over the SMs, so the roofline does not price it
  (the kernel measurements of ``sim/data/moe_kernels.csv`` cannot tell it from the aggregate,
  see :mod:`sim.costs.roofline_ops`).
- :func:`moe_work`: ``(FLOPs, bytes)`` per op of the routed experts and the routing around
  them, on one GPU of a tensor-parallel group of ``tp``: the router GEMM (``hidden x E``,
  replicated), the top-k softmax over the router's fp32 logits, the permutation of the tokens
  into expert order (TensorRT-LLM's ``expandInputRows``: read ``tokens x hidden``, write
  ``tokens x k x hidden``), the two expert GEMMs (the FLOPs of ``tokens x k`` rows, the weights
  of the touched experts), the activation, and the un-permutation (``finalizeMoeRouting`` /
  vLLM's ``moe_sum``: read ``tokens x k x hidden``, write ``tokens x hidden``).

Invariants: every value is finite and >= 0 for ``tokens`` >= 0; ``expected_touched <= min(E,
tokens x k)``; ``1 <= expected_busiest <= tokens`` for ``tokens`` >= 1; no
routing term depends on anything but ``tokens``, so the roofline's per-token-count memo holds.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

ACT_BYTES = 2  # activations in fp16/bf16
LOGIT_BYTES = 4  # the router's logits and the top-k weights, fp32
INDEX_BYTES = 4  # an int32 expert id


def expected_touched(tokens, k: int, num_experts: int):
    """Expected number of experts with at least one of ``tokens`` tokens (scalars or arrays)."""
    return num_experts * (1.0 - (1.0 - k / num_experts) ** tokens)


def _binomial_pmf(n: int, p: float) -> np.ndarray:
    """``P(X = 0..n)`` for ``X ~ Binomial(n, p)``, from the ratio of consecutive terms in log
    space (numpy only; no overflow at n in the tens of thousands)."""
    if p >= 1.0:
        out = np.zeros(n + 1)
        out[n] = 1.0
        return out
    j = np.arange(n, dtype=np.float64)
    log_ratio = np.log((n - j) / (j + 1.0)) + np.log(p) - np.log1p(-p)
    log_pmf = n * np.log1p(-p) + np.concatenate(([0.0], np.cumsum(log_ratio)))
    pmf = np.exp(log_pmf - log_pmf.max())
    return pmf / pmf.sum()


@lru_cache(maxsize=4096)
def expected_busiest(tokens: int, k: int, num_experts: int) -> float:
    """Expected load (rows) of the busiest of ``num_experts`` experts when ``tokens`` tokens
    each pick ``k`` distinct experts uniformly: ``sum_{m >= 0} (1 - F(m)^E)``, at least 1 (see
    the module docstring for the approximation and its bound)."""
    tokens = int(tokens)
    if tokens <= 0:
        return 0.0
    if k == num_experts:
        return float(tokens)
    cdf = np.minimum(np.cumsum(_binomial_pmf(tokens, k / num_experts)), 1.0)
    return max(1.0, float(np.sum(1.0 - cdf[:-1] ** num_experts)))


def moe_work(tokens, *, hidden: int, width: float, num_experts: int, k: int, gate: int,
             weight_bytes: float, router_weight_bytes: float | None = None) -> dict:
    """Per op, ``(FLOPs, bytes)`` of the routed part of one MoE layer on one GPU for ``tokens``
    tokens (scalars or arrays): ``width`` is one expert's MLP width on this GPU (the full width
    over the tensor-parallel degree), ``gate`` 2 for a gated MLP (gate+up, SwiGLU) else 1,
    ``weight_bytes`` per expert weight (``router_weight_bytes``, default the same, per router
    weight: gpt-oss keeps its router in bf16 beside MXFP4 experts). Ops: ``moe_router``, ``mlp_up_proj``, ``mlp_down_proj`` (GEMMs),
    ``moe_topk``, ``moe_permute``, ``moe_unpermute`` (memory-bound); the activation is the
    caller's (it may share it with shared experts)."""
    h, e = hidden, num_experts
    rows = tokens * k
    touched = expected_touched(tokens, k, e)
    up_n = gate * width
    router = weight_bytes if router_weight_bytes is None else router_weight_bytes
    return {
        "moe_router": (2.0 * tokens * h * e,
                       h * e * router + tokens * (h * ACT_BYTES + e * LOGIT_BYTES)),
        "moe_topk": (0.0, tokens * (e * LOGIT_BYTES + k * (LOGIT_BYTES + INDEX_BYTES))),
        "moe_permute": (0.0, (tokens + rows) * h * ACT_BYTES),
        "mlp_up_proj": (2.0 * rows * h * up_n,
                        touched * h * up_n * weight_bytes + rows * (h + up_n) * ACT_BYTES),
        "mlp_down_proj": (2.0 * rows * width * h,
                          touched * width * h * weight_bytes + rows * (width + h) * ACT_BYTES),
        "moe_unpermute": (0.0, (rows + tokens) * h * ACT_BYTES),
    }
