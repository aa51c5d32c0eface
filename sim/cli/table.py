"""The table of settings: one row per setting of ``sim run``, ``sim capacity`` and ``sim sweep``.

A row (:class:`Setting`) says everything about one setting: its TOML key, its flag(s), where its
value goes (``to``: the ``SimConfig`` field, the field of a config object it builds - a
``ClosedLoop``, ``Disaggregation`` or ``SpeculativeConfig`` -, the workload loader's argument,
an SLO, an output), how a flag's text is parsed, the check that flag and file values alike pass,
its default and its help. From this one table the flags are generated
(:func:`sim.cli.settings.add_flags`), a TOML file's keys are checked and the config is built in
one pass (:mod:`sim.cli.settings`, :mod:`sim.cli.build`); :func:`reference_rows` gives it to
the docs (a row's type: :mod:`sim.cli.setting`). A setting has one name everywhere: its key is
the TOML key and the settings record's
(``summary.json``), the API field where the API has the same concept (``field``), and its long
flag is the key with dashes unless a shorter flag has always been its name (``--tp``).

Keys with a dot are keys of a TOML table: ``slo.ttft`` is ``ttft`` in ``[slo]``. A row whose
``check`` is ``None`` is judged by its target (``SimConfig`` checks the engine's knobs), whose
message :func:`sim.cli.build.as_written` names as the user wrote it. ``commands``: the
commands that read the setting; a command's own settings (``report``, ``grid``, ...) are kept
apart in the settings' ``extra`` (:mod:`sim.cli.settings`).

Loads no simulation (pandas, SimPy): ``sim --help`` builds its parser from this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..checks import did_you_mean
from ..constants import CHUNK_SIZE
from ..engine.config import KV_DTYPES, WEIGHT_DTYPES
from ..engine.fleet.routers import ROUTERS
from ..engine.schedulers import POLICIES
from ..engine.speculation.settings import MAX_SPECULATIVE_TOKENS
from ..engine.presets.tensorrt_llm import CAPACITY_SCHEDULER_POLICIES
from ..engine.presets.tensorrt_llm_chunking import CONTEXT_CHUNKING_POLICIES
from ..results.bench import FORMATS as BENCH_FORMATS
from ..results.metrics import SLO_KEYS
from ..specs.gpus import gpu_presets
from .arguments import (at_least_zero, bench_format, count, count_or_zero, name_any_case,
                        num_requests, number, positive, prefix_caching, repeats, typed)
from . import (table_benchwl, table_fit, table_hetero, table_lora, table_models, table_moe,
               table_offload, table_overheads, table_plan, table_plan_day)
from .setting import SHARED, TARGETS, Setting, first_line
from .arguments import request_rate  # (rate's check; a line of its own: fewer merge conflicts)

SWEEP_METRICS = ("ttft_p99", "itl_p99", "request_throughput")  # sim sweep's default metrics


def _router(shown, value):
    if not isinstance(value, str):
        raise TypeError(f"{shown} must be a router name ({', '.join(ROUTERS)}), got {value!r}")
    value = value.strip().lower()
    if value not in ROUTERS:
        raise ValueError(f"{shown} {value!r} is not a router{did_you_mean(value, list(ROUTERS))}; "
                         f"known: {', '.join(ROUTERS)}")
    return value


def _scheduler_names() -> tuple:
    return tuple(sorted(POLICIES))  # (read when a parser is built: a policy added is listed)


def _scheduler_help() -> str:
    return "; ".join(f"{name}: {first_line(cls)}" for name, cls in POLICIES.items())
FREE_GPU_MEMORY_FRACTION_HELP = ("TensorRT-LLM's free_gpu_memory_fraction: the KV cache's share of "
                                 "the memory left free, in (0, 1)")
HASH_BLOCK_TOKENS_HELP = ("tokens each hash_ids entry of a CSV/JSONL workload file stands for "
                          "(the block size the ids were made with: 512 for Mooncake), >= 1; "
                          "parquet files and bundled traces carry it")

S = Setting
SETTINGS = (
    S("workload", ("--workload", "-w"), ("workload",), "name", metavar="NAME|FILE",
      check=typed((str, Path), "a trace name or a file path"), default="azure-conv",
      help="bundled trace (see 'sim workload list') or a CSV/JSONL/parquet file",
      default_help="default azure-conv"),
    S("hash_block_tokens", ("--hash-block-tokens",), ("workload",), parse=int,
      metavar="TOKENS", check=count, help=HASH_BLOCK_TOKENS_HELP,
      default_help="default: the workload's own"),
    S("num_requests", ("--num-requests", "-n", "--num-prompts"), ("workload",), "n", parse=int,
      metavar="N",
      check=num_requests, help="the first N requests, N >= 1; more than a replayed trace holds "
                                "is an error, a length-only set is resampled",
      default_help="default: all"),
    S("rate", ("--rate", "--request-rate"), ("workload",), parse=float, metavar="REQ_PER_S",
      check=request_rate,
      help="requests/s > 0: time-scales a trace, or the Poisson rate of a length-only set such "
           "as sharegpt, where it is required", default_help="default: the trace's own timing"),
    S("scheduler", ("--scheduler", "-s"), parse=str.lower, choices=_scheduler_names,
      metavar="NAME", check=name_any_case, default="chunked", help=_scheduler_help,
      default_help="default chunked"),
    S("model", ("--model",), default="llama-3.1-8b", help="model preset such as llama-3.1-70b "
                                                          "(an unknown name lists them), or a "
                                                          "Hugging Face config.json path (sim "
                                                          "models lists the presets)",
      default_help="default llama-3.1-8b"),
    S("gpu", ("--gpu",), default="h100",
      help=f"GPU preset: {', '.join(gpu_presets())} (sim gpus lists them with sources)",
      default_help="default h100"),
    S("tensor_parallel", ("--tp",), parse=int, metavar="GPUS", default=1,
      help="tensor-parallel GPUs, >= 1: must divide the model's attention heads, and divide "
           "its KV heads or be a multiple of them", default_help="default 1"),
    S("weight_dtype", ("--weight-dtype",), parse=str.lower, choices=WEIGHT_DTYPES,
      check=name_any_case, default="fp16",
      help="weight precision, any case: sizes the weights and the KV pool and sets the "
           "roofline's bytes and peak", default_help="default fp16"),
    S("kv_dtype", ("--kv-dtype",), parse=str.lower, choices=KV_DTYPES, check=name_any_case,
      default="fp16", help="KV-cache precision, any case: fp8 doubles the KV blocks of fp16",
      default_help="default fp16"),
    S("max_batch_size", ("--max-batch-size",), parse=int, metavar="N",
      help="most running requests, >= 1",
      default_help="default: the scheduler's; 256 for the simple ones"),
    S("chunk_size", ("--chunk-size",), parse=int, metavar="TOKENS",
      help="chunked, sarathi, vllm, sglang: prefill token budget per iteration (sglang's "
           "chunked_prefill_size), >= 1",
      default_help=f"default: the scheduler's: chunked and sarathi {CHUNK_SIZE}, vllm 8,192 on "
                   f"GPUs of >= 70 GiB other than the A100, else 2,048; sglang by GPU memory, "
                   f"8,192 on an A100, H100 or H200"),
    S("token_budget", ("--token-budget",), parse=int, metavar="TOKENS",
      help="continuous, orca: cap on prompt tokens admitted per iteration; sglang: its "
           "max_prefill_tokens; tensorrt-llm: its max_num_tokens (decodes and prompts per "
           "iteration), >= 1", default_help="default: none; sglang 16,384; tensorrt-llm 8,192"),
    S("gpu_memory_utilization", ("--gpu-memory-utilization",), parse=float, metavar="FRACTION",
      help="every scheduler but sglang and tensorrt-llm (vLLM's accounting): vLLM's "
           "gpu_memory_utilization, the share of device memory the engine may use, in (0, 1]; "
           "sizes the KV pool unless --kv-blocks does", default_help="default 0.9"),
    S("free_gpu_memory_fraction", ("--free-gpu-memory-fraction",), parse=float,
      metavar="FRACTION", help="tensorrt-llm: " + FREE_GPU_MEMORY_FRACTION_HELP
                               + "; sizes the KV pool unless --kv-blocks does",
      default_help="default 0.9"),
    S("enable_chunked_context", ("--enable-chunked-context",), parse=bool,
      check=typed(bool, "true or false"),  # (before "not used by": a wrong type first)
      help="tensorrt-llm: TensorRT-LLM's enable_chunked_context: a prompt longer than what is "
           "left of max_num_tokens (--token-budget) runs in chunks",
      default_help="default: off, as in TensorRT-LLM's LLM API: a prompt over max_num_tokens "
                   "is rejected"),
    S("capacity_scheduler_policy", ("--capacity-scheduler-policy",), parse=str.lower,
      choices=CAPACITY_SCHEDULER_POLICIES, check=name_any_case,
      help="tensorrt-llm: TensorRT-LLM's capacity scheduler: guaranteed_no_evict (each "
           "request's KV to completion reserved, never preempts) or max_utilization (admits "
           "while this step's blocks fit, pauses the most recently started requests when the "
           "pool runs out)", default_help=f"default {CAPACITY_SCHEDULER_POLICIES[0]}"),
    S("context_chunking_policy", ("--context-chunking-policy",), parse=str.lower,
      choices=CONTEXT_CHUNKING_POLICIES, check=name_any_case,
      help="tensorrt-llm with --enable-chunked-context: how prompts share max_num_tokens: "
           "first_come_first_served (each in turn takes what it can) or equal_progress (a block "
           "more to each, round after round)",
      default_help=f"default {CONTEXT_CHUNKING_POLICIES[0]}"),
    S("kv_blocks", ("--kv-blocks",), parse=int, metavar="N",
      help="KV-cache blocks in the pool, >= 1",
      default_help="default: from the model's and GPU's memory budget"),
    S("kv_tokens", ("--kv-tokens",), parse=int, metavar="TOKENS",
      help="the KV pool in tokens instead, >= one block: --kv-tokens // --block-size blocks, "
           "the same memory across schedulers of different block sizes (not with --kv-blocks)",
      default_help="default: from the model's and GPU's memory budget"),
    S("max_model_len", ("--max-model-len",), parse=int, metavar="TOKENS",
      help="prompt + output tokens a request may hold, >= 1 and at most the model's context "
           "length; a request over it is rejected at arrival, as vLLM's --max-model-len does",
      default_help="default: the model's context length, 131,072 for llama-3.1-8b"),
    S("prefix_caching", ("--prefix-caching",), parse=str.lower, choices=("off", "block", "radix"),
      check=prefix_caching,
      help="prefix cache: off, block (vLLM v1: full blocks keyed by the workload's hash_ids) "
           "or radix (SGLang: a token-granular tree)",
      default_help="default: the scheduler's; off for the simple ones, block for vllm, radix "
                   "for sglang"),
    S("block_size", ("--block-size",), parse=int, metavar="TOKENS",
      help="tokens per KV block (sglang's page size), >= 1",
      default_help="default: the scheduler's; 16, sglang 1, tensorrt-llm 32"),
    S("seed", ("--seed",), ("workload", "config"), parse=int, check=count_or_zero, default=0,
      help="seed of sampled arrivals and lengths, >= 0", default_help="default 0"),
    S("bands", ("--bands",), parse=float, metavar="LEVEL",
      help="error band: every latency and throughput also as <metric>_lo / _hi, the runs "
           "with each step at the ends of the central LEVEL interval of the cost model's "
           "measured step-time error on this GPU, e.g. 0.9, in (0, 1); capacity: the rate's "
           "band", default_help="default: off"),
    S("cost", ("--cost",), ("cost",), metavar="SPEC", default="roofline",
      check=typed(str, "roofline, constant:SECONDS or linear:BASE,PREFILL,DECODE,CONTEXT"),
      help="roofline | constant:SECONDS | linear:BASE,PREFILL,DECODE,CONTEXT (all four numbers)",
      default_help="default roofline", kind="roofline | constant:SECONDS | linear:B,P,D,C"),
    S("profile", ("--profile",), ("cost",), metavar="JSON",
      check=typed((str, Path), "a profile file path"),
      help="calibrated profile from 'sim calibrate'; replaces --cost",
      default_help="default none", kind="file path"),
    S("usd_per_gpu_hour", ("--usd-per-gpu-hour",), parse=float, metavar="USD", check=positive,
      help="price of one GPU-hour, > 0: the cost columns (usd_per_hour, usd_per_million_*)",
      default_help="default: the GPU's sourced on-demand price, sim/data/gpu_prices.csv"),
    S("gpu_idle_watts", ("--gpu-idle-watts",), parse=float, metavar="W", check=at_least_zero,
      help="power of one GPU with no iteration running, >= 0: the energy columns",
      default_help="default: measured (sim/data/gpu_power.csv), else TDP x the measured ratio"),
    S("gpu_max_watts", ("--gpu-max-watts",), parse=float, metavar="W", check=positive,
      help="one GPU's board power (TDP), > 0; a busy GPU draws idle + a fitted share of (max "
           "- idle)",
      default_help="default: the GPU's TDP, sim/data/gpus.csv"),
    S("replicas", ("--replicas",), parse=int, metavar="N", default=1, check=count,
      help="replicas behind the router, >= 1, each of --tp GPUs", default_help="default 1"),
    S("router", ("--router",), parse=str.lower, metavar="NAME", default="round_robin",
      check=_router, help=f"which replica serves a request: {', '.join(ROUTERS)}",
      default_help="default round_robin", kind=" | ".join(ROUTERS)),
    S("prefill_replicas", ("--prefill-replicas",), ("disaggregation",), parse=int, metavar="N",
      check=count, help="disaggregation: replicas of the prefill pool, >= 1",
      default_help="default: colocated"),
    S("decode_replicas", ("--decode-replicas",), ("disaggregation",), parse=int, metavar="N",
      check=count, help="disaggregation: replicas of the decode pool, >= 1",
      default_help="default: colocated"),
    S("link_bandwidth_gbps", ("--link-bandwidth",), ("disaggregation",), parse=float,
      metavar="GB_S", check=positive,
      help="disaggregation: KV-transfer link, GB/s per direction, > 0",
      default_help="default: the GPU's scale-up link, 450 on an H100"),
    S("link_latency_s", ("--link-latency",), ("disaggregation",), parse=float, metavar="SECONDS",
      default=0.0, check=at_least_zero,
      help="disaggregation: latency of each KV transfer, >= 0", default_help="default 0"),
    S("offload_gb", ("--offload-gb",), ("kv_offload",), "capacity_gb", parse=float,
      metavar="GB", check=at_least_zero,
      help="KV offload tier under the prefix cache (vLLM's CPU offload; SGLang HiCache under "
           "the radix cache): its capacity "
           "per GPU in GB, >= 0; blocks the GPU evicts are stored there and loaded back on a "
           "hit instead of recomputed", default_help="default: no tier"),
    S("offload_read_bandwidth", ("--offload-read-bandwidth",), ("kv_offload",), "read_gbps",
      parse=float, metavar="GB_S", check=positive,
      help="offload tier: load bandwidth per GPU, GB/s, > 0", default_help="default 50"),
    S("offload_write_bandwidth", ("--offload-write-bandwidth",), ("kv_offload",), "write_gbps",
      parse=float, metavar="GB_S", check=positive,
      help="offload tier: store bandwidth per GPU, GB/s, > 0", default_help="default 50"),
    S("offload_latency", ("--offload-latency",), ("kv_offload",), "latency", parse=float,
      metavar="SECONDS", check=at_least_zero,
      help="offload tier: seconds added to every load, >= 0", default_help="default 0"),
    S("closed_loop_users", ("--closed-loop",), ("closed_loop",), "num_users", parse=int,
      metavar="USERS", check=count,
      help="closed loop with this many users, >= 1, each sending its next request when the "
           "last one finished (a workload with a session_id column: the next turn of the "
           "conversation it holds)", default_help="default: open loop, the trace's arrivals"),
    S("think_time", ("--think-time",), ("closed_loop",), parse=float, metavar="SECONDS",
      default=0.0, check=at_least_zero,
      help="closed loop: pause between a user's requests, >= 0", default_help="default 0"),
    S("speculative.num_speculative_tokens", ("--spec-tokens",), ("speculative",), parse=int,
      metavar="K", help=f"speculative decoding: draft K tokens per iteration and verify them, K "
                        f"in 1..{MAX_SPECULATIVE_TOKENS} (needs --draft-model, "
                        f"--draft-cost-ratio or --spec-method ngram)",
      default_help="default: off"),
    S("speculative.acceptance_rate", ("--acceptance-rate",), ("speculative",), parse=float,
      metavar="ALPHA", help="speculative: each draft token accepted with this probability, in "
                            "[0, 1], until the first rejection", default_help="default 0.8"),
    S("speculative.draft_model", ("--draft-model",), ("speculative",), metavar="NAME",
      help="speculative: the draft model, a model preset (as --model), priced on the same GPU",
      default_help="default none"),
    S("speculative.draft_cost_ratio", ("--draft-cost-ratio",), ("speculative",), parse=float,
      metavar="C", help="speculative: a draft step costs C x the target's decode step, C >= 0",
      default_help="default none"),
    S("speculative.method", ("--spec-method",), ("speculative",), parse=str.lower,
      choices=("draft", "ngram"), check=name_any_case,
      help="speculative: draft (a draft model or cost ratio) or ngram (prompt lookup, no draft "
           "cost)", default_help="default draft"),
    S("speculative.acceptance_lengths", (), ("speculative",), kind="list of probabilities",
      help="speculative: the probability that 0, 1, ... K draft tokens are accepted (instead "
           "of acceptance_rate)", default_help="default: from acceptance_rate"),
    *(S(f"slo.{key}", (f"--slo-{key}",), ("slo",), parse=float, metavar="SECONDS",
        check=positive, help=f"{key.upper()} SLO in seconds, > 0", default_help="default none")
      for key in SLO_KEYS),
    S("output", ("--output", "-o"), ("output",), metavar="FOLDER", default="sim-out",
      check=typed((str, Path), "a folder path"), help="output folder",
      default_help="default sim-out", kind="folder path"),
    S("plots", ("--plots", "--no-plots"), ("output",), parse=bool, default=False,
      check=typed(bool, "true or false"),
      help="also write the PNG figures: latency CDFs and the timeline",
      default_help="default: none; matplotlib and drawing cost ~1 s, ~4 s at 1M requests",
      off_help="write no PNG figure (the default; overrides plots = true in a file)"),
    S("quiet", ("--quiet", "-q"), ("output",), parse=bool, commands=("run", "capacity"),
      in_toml=False, help="print nothing but errors and warnings",
      default_help="default: print the summary"),
    S("report", ("--report",), ("output",), metavar="FILE.html", commands=("run",),
      help="also write one self-contained HTML page: settings, summary, findings and figures",
      default_help="default: none", kind="file path ending in .html"),
    S("format", ("--format",), ("output",), parse=str.lower, choices=BENCH_FORMATS,
      check=bench_format, commands=("run",),
      help="also write the result as that benchmark tool writes it, for its dashboards and "
           "scripts: vllm-bench (vllm-bench.json, as vllm bench serve --save-result "
           "--save-detailed), aiperf (profile_export.jsonl and profile_export_aiperf.json), "
           "guidellm (benchmarks.json); 'sim compare' reads them back",
      default_help="default: none", kind=" | ".join(BENCH_FORMATS)),
    S("request_path", ("--request-path",), ("request_path",), metavar="SPEC",
      commands=("run", "capacity"),
      help="time outside the engine, added to what the client sees: 'triton' (sourced: "
           "sim/data/request_overheads.csv), 'IN_MS,US_PER_TOKEN,OUT_MS' or 'off'; TOML: "
           "request_path = \"triton\"", default_help="default: off",
      kind="triton | off | IN_MS,US_PER_TOKEN,OUT_MS"),
    S("grid", (), ("sweep",), commands=("sweep",), kind="table: field = [values, ...]",
      help="the grid: any SimConfig field, rate, num_requests, or one of the settings that set "
           "one field of a config object, each with its list of values",
      default_help="required"),
    S("metrics", (), ("sweep",), commands=("sweep",), kind="list of summary keys",
      help="the summary keys to tabulate and plot", default=SWEEP_METRICS,
      default_help=f"default {', '.join(SWEEP_METRICS)}"),
    S("repeats", ("--repeats",), ("sweep",), parse=number(int), metavar="N", check=repeats,
      commands=("sweep",),
      default=1, help="runs per point, seeds seed, seed+1, ...",
      default_help="default: the file's repeats, else 1", kind="integer >= 1"),
) + table_benchwl.ROWS + table_offload.ROWS
del S
SETTINGS += (table_models.ROWS + table_plan.ROWS + table_fit.ROWS + table_overheads.ROWS
             + table_lora.ROWS + table_hetero.ROWS + table_plan_day.ROWS + table_moe.ROWS)

BY_KEY = {row.key: row for row in SETTINGS}
TABLES = ("slo", "speculative")  # TOML tables: their keys are rows ``table.key``


def rows_for(command) -> tuple:
    """The rows ``command`` reads, in the table's order."""
    return tuple(row for row in SETTINGS if command in row.commands)


def toml_keys(command) -> list:
    """The top-level TOML keys ``command`` takes (a table's keys once, as the table)."""
    keys = []
    for row in rows_for(command):
        top = row.key.split(".", 1)[0]
        if row.in_toml and top not in keys:
            keys.append(top)
    return keys


def table_keys(table) -> list:
    """The keys of the TOML table ``table`` (``[slo]``, ``[speculative]``)."""
    return [row.key.split(".", 1)[1] for row in SETTINGS if row.key.startswith(table + ".")]


def help_of(row) -> str:
    """The row's help, read now (the scheduler's names ``POLICIES``')."""
    return row.help() if callable(row.help) else row.help


def help_text(row) -> str:
    """The row's ``--help``: its help and its default."""
    return f"{help_of(row)} ({row.default_help})" if row.default_help else help_of(row)


def choices_of(row) -> tuple:
    """The row's allowed values (``()``: any), read now: the scheduler's are ``POLICIES``'."""
    return row.choices() if callable(row.choices) else row.choices


def key_of_flag(name, keys) -> str | None:
    """The setting among ``keys`` whose flag ``name`` spells (a TOML key written as its flag:
    ``tp`` or ``--tp`` is ``tensor_parallel``), else None."""
    flag = "--" + str(name).strip().lstrip("-").replace("_", "-")
    return next((row.key for row in SETTINGS if flag in row.flags and row.key in keys), None)


def flag_of(key) -> str:
    """The setting ``key`` as a flag (``--tp``), or its key when it has none."""
    row = BY_KEY.get(key)
    if row is not None:
        return row.flags[0] if row.flags else key
    return "--" + key.replace("_", "-")


# every shared setting's default, by TOML key (a table's: {}): the settings before any is given
DEFAULTS = {top: ({} if top in TABLES else BY_KEY[top].default) for top in toml_keys("sweep")
            if top in TABLES or BY_KEY[top].commands == SHARED}


def _kind(row) -> str:
    if row.kind:
        return row.kind
    if choices_of(row):
        return " | ".join(choices_of(row))
    return {int: "integer", float: "number", bool: "true | false"}.get(row.parse, "string")


def reference_rows() -> list[dict]:
    """The table for the docs' TOML reference, one dict per setting in the table's order:
    ``key`` (the TOML key; ``slo.ttft`` is ``ttft`` in ``[slo]``, None for a flag-only
    setting), ``flags`` (e.g. ``"--num-requests, -n"``, ``""`` for a TOML-only one), ``type``
    (the type or allowed values in words), ``default`` (the value, None when it is the
    target's or computed), ``default_help`` (the default in words), ``help``, ``target`` (where
    the value goes: ``SimConfig.kv_blocks``, ``workloads.load(..., n=)``) and ``commands``
    (those that read it)."""
    return [{"key": row.key if row.in_toml else None, "flags": ", ".join(row.flags),
             "type": _kind(row), "default": row.default, "default_help": row.default_help,
             "help": help_of(row), "target": " and ".join(TARGETS[to].format(field=row.api_field)
                                                 for to in row.to),
             "commands": list(row.commands)}
            for row in SETTINGS]
