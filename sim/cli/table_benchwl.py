"""Settings of the workloads that benchmark tools generate, appended to the settings table.

``-w vllm-random`` and ``-w vllm-sharegpt`` (:mod:`workloads.vllm_bench`); the rows join
:data:`sim.cli.table.SETTINGS`.

Each flag is ``vllm bench serve``'s own and goes to ``workloads.load`` under its name in snake
case, so a published command line reads across; the table's ``-n`` and ``--rate`` take the
tool's names too (``--num-prompts``, ``--request-rate``; no rate: inf, all requests at t = 0),
and ``--seed`` is ``--seed``. Given with any other workload, each is an error naming it.
"""

from __future__ import annotations

import math

from .arguments import at_least_zero, count, count_or_zero, name_any_case
from .setting import Setting as S


def _burstiness(shown, value):
    """> 0, or inf (the tool's constant gaps of 1/rate)."""
    if value == math.inf:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{shown} must be > 0 or inf, got {value}")  # (nan fails > 0 too)
    return float(value)


ROWS = (
    S("vllm_formula", ("--vllm-formula",), ("workload",), parse=str.lower,
      choices=("current", "legacy"), metavar="FORM", check=name_any_case,
      help="vllm-random, vllm-sharegpt: current (vllm bench serve, 2025 on) or legacy (vLLM "
           "0.6-0.7's benchmarks/benchmark_serving.py: random lengths in [len*R, len] with R "
           "1 by default, the first request at 0, no rescaling of the arrivals, no "
           "oversampling)", default_help="default current"),
    S("random_input_len", ("--random-input-len",), ("workload",), parse=int, metavar="TOKENS",
      check=count, help="vllm-random: vLLM's --random-input-len, the mean sampled input "
                        "tokens (the tokenizer's BOS included), >= 1",
      default_help="default 1024"),
    S("random_output_len", ("--random-output-len",), ("workload",), parse=int,
      metavar="TOKENS", check=count,
      help="vllm-random: vLLM's --random-output-len, the mean output tokens, >= 1",
      default_help="default 128"),
    S("random_range_ratio", ("--random-range-ratio",), ("workload",), parse=float,
      metavar="R", check=at_least_zero,
      help="vllm-random: vLLM's --random-range-ratio, lengths uniform in [len*(1-R), "
           "len*(1+R)], R in [0, 1)", default_help="default 0: fixed lengths"),
    S("random_prefix_len", ("--random-prefix-len",), ("workload",), parse=int,
      metavar="TOKENS", check=count_or_zero,
      help="vllm-random: vLLM's --random-prefix-len, random tokens every prompt starts with "
           "(shared hash_ids: prefix-cache hits), >= 0", default_help="default 0"),
    S("sharegpt_output_len", ("--sharegpt-output-len",), ("workload",), parse=int,
      metavar="TOKENS", check=count,
      help="vllm-sharegpt: vLLM's --sharegpt-output-len, every request's output tokens, >= 1",
      default_help="default: each conversation's answer"),
    S("max_concurrency", ("--max-concurrency",), ("closed_loop",), "num_users", parse=int,
      metavar="N", check=count,
      help="vLLM's --max-concurrency: at most N requests in flight, each sent at its arrival "
           "time or when one of those finishes (at --rate: the client's semaphore; without "
           "--rate: a closed loop of N users), >= 1", default_help="default: no cap"),
    S("burstiness", ("--burstiness",), ("workload",), parse=float, metavar="B",
      check=_burstiness,
      help="vllm-random, vllm-sharegpt: vLLM's --burstiness, gamma inter-arrivals of shape B "
           "(CV 1/sqrt(B); 1: Poisson; inf: constant) at --rate, > 0",
      default_help="default 1"),
)
