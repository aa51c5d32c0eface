"""Workloads: the request schema, real traces, arrival processes, length distributions,
prefix-sharing generators and benchmark tools' workloads (``vllm bench serve``'s random and
sharegpt). Everything seeded by one ``numpy.random.Generator`` (or an int)."""

from .agentic import Exponential, agentic
from .arrivals import (ClosedLoop, constant, drawn_at, gamma, interarrival_cv, own_rate, poisson,
                       scale_to_rate)
from .benchmarks import Measured, from_benchmark
from .describe import describe, plot_workload
from .diurnal import day_like, diurnal, rate_at, time_scaled
from .generators import ideal_prefix_hit_ratio, multi_turn, shared_prefix, synthetic
from .prefix import ideal_prefix_hit_rate, prefix_block_keys, unit_keys_all
from .lora import lora_mix, zipf_weights
from .lengths import Empirical, Fixed, LogNormal, Normal, Uniform, Zipf
from .schema import COLUMNS, REQUIRED, from_records, validate
from .traces import TRACES, load, load_file, save, trace_names
from .vllm_bench import MaxConcurrency, vllm_arrivals, vllm_random, vllm_sharegpt

__all__ = [
    "Exponential", "agentic",
    "ClosedLoop", "constant", "drawn_at", "gamma", "interarrival_cv", "own_rate", "poisson",
    "scale_to_rate",
    "Measured", "from_benchmark",
    "describe", "plot_workload",
    "day_like", "diurnal", "rate_at", "time_scaled",
    "ideal_prefix_hit_ratio", "ideal_prefix_hit_rate", "prefix_block_keys", "unit_keys_all", "multi_turn", "shared_prefix", "synthetic",
    "lora_mix", "zipf_weights",
    "Empirical", "Fixed", "LogNormal", "Normal", "Uniform", "Zipf",
    "COLUMNS", "REQUIRED", "from_records", "validate",
    "TRACES", "load", "load_file", "save", "trace_names",
    "MaxConcurrency", "vllm_arrivals", "vllm_random", "vllm_sharegpt",
]
