"""``sim run``'s settings: the flags, an optional TOML file with the same keys, and their checks.

``DEFAULTS`` lists every setting with its default; a TOML file gives any of these keys (plus an
``[slo]`` table) and flags override it. :func:`settings_from` merges them and
:func:`check_settings` checks the settings only ``sim run`` has (the engine's knobs are checked
by ``SimConfig``); every message names the setting as the user wrote it: ``--rate`` or
``exp.toml: rate`` (:class:`Names`). The checks every command shares (numbers, output paths,
profiles) are in :mod:`sim.cli.arguments`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from ..checks import did_you_mean, positive_float, positive_int
from ..constants import CHUNK_SIZE
from ..engine.config import KV_DTYPES, WEIGHT_DTYPES
from ..engine.fleet.routers import ROUTERS
from ..engine.schedulers import POLICIES
from ..engine.speculation.settings import MAX_SPECULATIVE_TOKENS
from ..engine.presets.tensorrt_llm import CAPACITY_SCHEDULER_POLICIES
from ..engine.presets.tensorrt_llm_chunking import CONTEXT_CHUNKING_POLICIES
from ..results.metrics import SLO_KEYS
from .arguments import not_beside_file


def _first_line(cls) -> str:
    """A policy's name in words for ``--help``: its docstring up to the first ':' or '.' outside
    parentheses, without long parentheticals ("Chunked prefill (Sarathi-style)")."""
    text = " ".join((cls.__doc__ or cls.__name__).strip().split("\n\n")[0].split())
    out, depth, group = [], 0, []
    for ch in text.replace("``", ""):
        if depth == 0 and ch in ":.":
            break
        depth += (ch == "(") - (ch == ")")
        group.append(ch)
        if depth == 0:
            if len(group) <= 40 or group[0] != "(":
                out.extend(group)
            group = []
    return "".join(out).strip()


# every setting of ``sim run`` with its default; a TOML file may give any of these keys
DEFAULTS = {
    "workload": "azure-conv", "num_requests": None, "rate": None, "scheduler": "chunked",
    "model": "llama-3.1-8b", "gpu": "h100", "tensor_parallel": 1, "max_batch_size": None,
    "chunk_size": None, "token_budget": None, "kv_blocks": None, "block_size": None,
    "max_model_len": None, "seed": 0,
    "cost": "roofline", "profile": None, "output": "sim-out", "plots": False, "slo": {},
    "closed_loop_users": None, "think_time": 0.0, "prefix_caching": None,
    "weight_dtype": "fp16", "kv_dtype": "fp16", "speculative": {},
    "replicas": 1, "router": "round_robin", "prefill_replicas": None, "decode_replicas": None,
    "link_bandwidth_gbps": None, "link_latency_s": 0.0,
    "hash_block_tokens": None, "gpu_memory_utilization": None,
    "free_gpu_memory_fraction": None, "enable_chunked_context": None,
    "capacity_scheduler_policy": None, "context_chunking_policy": None,
}
# the [speculative] table's keys (sim.SpeculativeConfig's fields) and their flags
SPEC_FLAGS = {"num_speculative_tokens": "--spec-tokens", "acceptance_rate": "--acceptance-rate",
              "draft_model": "--draft-model", "draft_cost_ratio": "--draft-cost-ratio",
              "method": "--spec-method", "acceptance_lengths": None}
DEFAULT_SCENARIO = ("Llama-3.1-8B (fp16) on one H100-80GB, roofline cost model; the Azure LLM "
                    "inference 2023 'conv' trace (19,366 requests over ~58 min, replayed); "
                    "chunked prefill (512-token budget), max batch 256, KV pool from the memory "
                    "budget")


FLAGS = {"num_requests": "--num-requests", "tensor_parallel": "--tp", "plots": "--plots",
         "closed_loop_users": "--closed-loop", "link_bandwidth_gbps": "--link-bandwidth",
         "link_latency_s": "--link-latency"}  # the others: ``--`` + key with dashes
NOT_SCENARIO = ("output", "plots", "slo")  # settings that do not change what is simulated
FREE_GPU_MEMORY_FRACTION_HELP = ("TensorRT-LLM's free_gpu_memory_fraction: the KV cache's share of "
                                 "the memory left free, in (0, 1)")
HASH_BLOCK_TOKENS_HELP = ("tokens each hash_ids entry of a CSV/JSONL workload file stands for "
                          "(the block size the ids were made with: 512 for Mooncake), >= 1; "
                          "parquet files and bundled traces carry it (default: the workload's "
                          "own)")


def add_run_args(p):
    """The flags of ``sim run``; each maps to a key of ``DEFAULTS`` (the TOML file's keys)."""
    p.add_argument("config", nargs="?",
                   help="TOML file with the same settings as the flags; flags override it")
    p.add_argument("--workload", "-w", metavar="NAME|FILE",
                   help="bundled trace (see 'sim workload list') or a CSV/JSONL/parquet file "
                        "(default azure-conv)")
    p.add_argument("--hash-block-tokens", type=int, dest="hash_block_tokens", metavar="TOKENS",
                   help=HASH_BLOCK_TOKENS_HELP)
    p.add_argument("--num-requests", "-n", type=int, dest="num_requests", metavar="N",
                   help="the first N requests, N >= 1; more than a replayed trace holds is an "
                        "error, a length-only set is resampled (default: all)")
    p.add_argument("--rate", type=float, metavar="REQ_PER_S",
                   help="requests/s > 0: time-scales a trace, or the Poisson rate of a "
                        "length-only set such as sharegpt, where it is required (default: the "
                        "trace's own timing)")
    p.add_argument("--scheduler", "-s", type=str.lower, choices=sorted(POLICIES), metavar="NAME",
                   help="; ".join(f"{name}: {_first_line(cls)}" for name, cls in POLICIES.items())
                   + " (default chunked)")
    p.add_argument("--model", help="model preset such as llama-3.1-70b (an unknown name lists "
                                    "them) (default llama-3.1-8b)")
    p.add_argument("--gpu", help="GPU preset: a100, h100, h200, l40s, b200, mi300x (default h100)")
    p.add_argument("--tp", type=int, dest="tensor_parallel", metavar="GPUS",
                   help="tensor-parallel GPUs, >= 1: must divide the model's KV heads or be a "
                        "multiple of them (default 1)")
    p.add_argument("--weight-dtype", type=str.lower, choices=WEIGHT_DTYPES, dest="weight_dtype",
                   help="weight precision, any case: sizes the weights and the KV pool and sets "
                        "the roofline's bytes and peak (default fp16)")
    p.add_argument("--kv-dtype", type=str.lower, choices=KV_DTYPES, dest="kv_dtype",
                   help="KV-cache precision, any case: fp8 doubles the KV blocks of fp16 "
                        "(default fp16)")
    p.add_argument("--max-batch-size", type=int, dest="max_batch_size", metavar="N",
                   help="most running requests, >= 1 (default: the scheduler's; 256 for the "
                        "simple ones)")
    p.add_argument("--chunk-size", type=int, dest="chunk_size", metavar="TOKENS",
                   help=f"chunked, sarathi, vllm, sglang: prefill token budget per iteration "
                        f"(sglang's chunked_prefill_size), >= 1 (default: the scheduler's: "
                        f"chunked and sarathi {CHUNK_SIZE}, vllm 8,192 on GPUs of >= 70 GiB "
                        f"other than the A100, else 2,048; sglang by GPU memory, 8,192 on an "
                        f"A100, H100 or H200)")
    p.add_argument("--token-budget", type=int, dest="token_budget", metavar="TOKENS",
                   help="continuous, orca: cap on prompt tokens admitted per iteration; sglang: its "
                        "max_prefill_tokens; tensorrt-llm: its max_num_tokens (decodes and "
                        "prompts per iteration), >= 1 (default: none; sglang 16,384; "
                        "tensorrt-llm 8,192)")
    p.add_argument("--gpu-memory-utilization", type=float, dest="gpu_memory_utilization",
                   metavar="FRACTION",
                   help="every scheduler but sglang and tensorrt-llm (vLLM's accounting): vLLM's "
                        "gpu_memory_utilization, the share of device memory the engine may use, "
                        "in (0, 1]; sizes the KV pool unless --kv-blocks does (default 0.9)")
    p.add_argument("--free-gpu-memory-fraction", type=float, dest="free_gpu_memory_fraction",
                   metavar="FRACTION", help="tensorrt-llm: " + FREE_GPU_MEMORY_FRACTION_HELP
                   + "; sizes the KV pool unless --kv-blocks does (default 0.9)")
    p.add_argument("--enable-chunked-context", action="store_true", default=None,
                   dest="enable_chunked_context",
                   help="tensorrt-llm: TensorRT-LLM's enable_chunked_context: a prompt longer "
                        "than what is left of max_num_tokens (--token-budget) runs in chunks "
                        "(default: off, as in TensorRT-LLM's LLM API: a prompt over "
                        "max_num_tokens is rejected)")
    for key, choices, help in (
            ("capacity_scheduler_policy", CAPACITY_SCHEDULER_POLICIES,
             "tensorrt-llm: TensorRT-LLM's capacity scheduler: guaranteed_no_evict (each "
             "request's KV to completion reserved, never preempts) or max_utilization (admits "
             "while this step's blocks fit, pauses the most recently started requests when the "
             "pool runs out)"),
            ("context_chunking_policy", CONTEXT_CHUNKING_POLICIES,
             "tensorrt-llm with --enable-chunked-context: how prompts share max_num_tokens: "
             "first_come_first_served (each in turn takes what it can) or equal_progress (a "
             "block more to each, round after round)")):
        p.add_argument("--" + key.replace("_", "-"), type=str.lower, choices=choices, dest=key,
                       help=f"{help} (default {choices[0]})")
    p.add_argument("--kv-blocks", type=int, dest="kv_blocks", metavar="N",
                   help="KV-cache blocks in the pool, >= 1 (default: from the model's and GPU's "
                        "memory budget)")
    p.add_argument("--max-model-len", type=int, dest="max_model_len", metavar="TOKENS",
                   help="prompt + output tokens a request may hold, >= 1 and at most the "
                        "model's context length; a request over it is rejected at arrival, as "
                        "vLLM's --max-model-len does (default: the model's context length, "
                        "131,072 for llama-3.1-8b)")
    p.add_argument("--prefix-caching", type=str.lower, choices=["off", "block", "radix"],
                   dest="prefix_caching",
                   help="prefix cache: off, block (vLLM v1: full blocks keyed by the "
                        "workload's hash_ids) or radix (SGLang: a token-granular tree) "
                        "(default: the scheduler's; off for the simple ones, block for vllm, "
                        "radix for sglang)")
    p.add_argument("--block-size", type=int, dest="block_size", metavar="TOKENS",
                   help="tokens per KV block (sglang's page size), >= 1 (default: the "
                        "scheduler's; 16, sglang 1)")
    p.add_argument("--seed", type=int,
                   help="seed of sampled arrivals and lengths, >= 0 (default 0)")
    p.add_argument("--cost", metavar="SPEC",
                   help="roofline | constant:SECONDS | linear:BASE,PREFILL,DECODE,CONTEXT "
                        "(all four numbers) (default roofline)")
    p.add_argument("--profile", metavar="JSON",
                   help="calibrated profile from 'sim calibrate'; replaces --cost (default none)")
    p.add_argument("--replicas", type=int, metavar="N",
                   help="replicas behind the router, >= 1, each of --tp GPUs (default 1)")
    p.add_argument("--router", type=str.lower, metavar="NAME",
                   help=f"which replica serves a request: {', '.join(ROUTERS)} "
                        f"(default round_robin)")
    p.add_argument("--prefill-replicas", type=int, dest="prefill_replicas", metavar="N",
                   help="disaggregation: replicas of the prefill pool, >= 1 (default: "
                        "colocated)")
    p.add_argument("--decode-replicas", type=int, dest="decode_replicas", metavar="N",
                   help="disaggregation: replicas of the decode pool, >= 1 (default: "
                        "colocated)")
    p.add_argument("--link-bandwidth", type=float, dest="link_bandwidth_gbps", metavar="GB_S",
                   help="disaggregation: KV-transfer link, GB/s per direction, > 0 (default: "
                        "the GPU's scale-up link, 450 on an H100)")
    p.add_argument("--link-latency", type=float, dest="link_latency_s", metavar="SECONDS",
                   help="disaggregation: latency of each KV transfer, >= 0 (default 0)")
    p.add_argument("--closed-loop", type=int, dest="closed_loop_users", metavar="USERS",
                   help="closed loop with this many users, >= 1, each sending its next request "
                        "when the last one finished (a workload with a session_id column: the "
                        "next turn of the conversation it holds) (default: open loop, the "
                        "trace's arrivals)")
    p.add_argument("--think-time", type=float, dest="think_time", metavar="SECONDS",
                   help="closed loop: pause between a user's requests, >= 0 (default 0)")
    p.add_argument("--spec-tokens", type=int, dest="spec_num_speculative_tokens", metavar="K",
                   help=f"speculative decoding: draft K tokens per iteration and verify them, "
                        f"K in 1..{MAX_SPECULATIVE_TOKENS} (needs --draft-model, "
                        f"--draft-cost-ratio or --spec-method ngram) (default: off)")
    p.add_argument("--acceptance-rate", type=float, dest="spec_acceptance_rate",
                   metavar="ALPHA", help="speculative: each draft token accepted with this "
                                         "probability, in [0, 1], until the first rejection "
                                         "(default 0.8)")
    p.add_argument("--draft-model", dest="spec_draft_model", metavar="NAME",
                   help="speculative: the draft model, a model preset (as --model), "
                        "priced on the same GPU (default none)")
    p.add_argument("--draft-cost-ratio", type=float, dest="spec_draft_cost_ratio",
                   metavar="C", help="speculative: a draft step costs C x the target's decode "
                                     "step, C >= 0 (default none)")
    p.add_argument("--spec-method", type=str.lower, choices=["draft", "ngram"],
                   dest="spec_method",
                   help="speculative: draft (a draft model or cost ratio) or ngram (prompt "
                        "lookup, no draft cost) (default draft)")
    for key in ("ttft", "itl", "tpot", "e2e"):
        p.add_argument(f"--slo-{key}", type=float, dest=f"slo_{key}", metavar="SECONDS",
                       help=f"{key.upper()} SLO in seconds, > 0 (default none)")
    p.add_argument("--output", "-o", metavar="FOLDER", help="output folder (default sim-out)")
    p.add_argument("--plots", action="store_true", dest="plots", default=None,
                   help="also write the PNG figures: latency CDFs and the timeline (default: "
                        "none; matplotlib and drawing cost ~1 s, ~4 s at 1M requests)")
    p.add_argument("--no-plots", action="store_false", dest="plots", default=None,
                   help="write no PNG figure (the default; overrides plots = true in a file)")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="print nothing but errors and warnings (default: print the summary)")


class Names:
    """How the user wrote each setting, for messages: ``--rate`` or ``exp.toml: rate``.
    ``from_file``: keys the TOML file set (``slo.ttft``, ``speculative.method`` for its tables'
    keys); ``from_flags``: keys a flag set (a flag overrides the file)."""

    def __init__(self, config):
        self.config, self.from_file, self.from_flags = config, set(), set()

    def like(self, key, other, metavar="") -> str:
        """``other`` (with its ``metavar`` value) in ``key``'s voice, for a message that starts
        with ``names(key)``: the file's bare key (``prefill_replicas``, ``closed_loop_users =
        USERS``) when ``key`` came from the file and no flag set ``other``, else
        ``names(other)`` (``--closed-loop USERS``)."""
        if key in self.from_file and other not in self.from_flags:
            return f"{other} = {metavar}" if metavar else other
        return f"{self(other)} {metavar}".rstrip()

    def table(self, name) -> str:
        """Whether the TOML file set any key of the ``[name]`` table."""
        return any(k.startswith(f"{name}.") for k in self.from_file)

    def __call__(self, key):
        if key in self.from_file:
            return f"{self.config}: {key}"
        if key.startswith("slo."):
            return "--slo-" + key[4:]
        if key.startswith("speculative."):
            return SPEC_FLAGS.get(key[12:]) or f"speculative.{key[12:]}"
        return FLAGS.get(key, "--" + key.replace("_", "-"))


def _read_toml(config, extra=()) -> dict:
    path = Path(config)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise ValueError(f"config file {config!r} {what}")
    try:
        with open(path, "rb") as f:
            loaded = tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{config}: not a valid TOML file: {e}") from None
    except OSError as e:
        raise ValueError(f"{config}: cannot be read: {e.strerror or e}") from None
    unknown = sorted(set(loaded) - set(DEFAULTS) - set(extra))
    if unknown:
        hint = did_you_mean(unknown[0], list(DEFAULTS) + list(extra))
        raise ValueError(f"{config}: unknown setting(s) {unknown}{hint}; known: "
                         f"{sorted(set(DEFAULTS) | set(extra))}")
    return loaded


def settings_from(args, names=None, extra=()) -> dict:
    """The run's settings: ``DEFAULTS``, then the TOML file (unknown keys are an error), then
    every flag given on the command line; ``--slo-*`` flags merge into the ``[slo]`` table.
    Checked by :func:`check_settings` (errors name the flag, or the file and key); ``names``
    (a :class:`Names`, filled in here) says how the user wrote each one. ``extra``: further
    top-level keys the file may hold (a command's own, e.g. ``sim sweep``'s ``grid``), returned
    in ``s["extra"]``."""
    s = dict(DEFAULTS)
    names = names if names is not None else Names(args.config)
    given = set()
    extras = {}
    if args.config:
        loaded = _read_toml(args.config, extra)
        extras = {k: loaded.pop(k) for k in extra if k in loaded}
        s.update(loaded)
        given |= set(loaded)
        names.from_file = set(loaded) | {f"{table}.{k}" for table in ("slo", "speculative")
                                         for k in (loaded.get(table)
                                                   if isinstance(loaded.get(table), dict)
                                                   else ())}
    for key in DEFAULTS:
        v = getattr(args, key, None)
        if v is not None:
            s[key] = v
            given.add(key)
            names.from_file.discard(key)
            names.from_flags.add(key)
    slo = s.get("slo")
    if not isinstance(slo, dict):
        raise TypeError(f"{names('slo')} must be a table of limits in seconds ([slo] with ttft, "
                        f"itl, tpot, e2e), got {slo!r}")
    slo = dict(slo)
    for key in ("ttft", "itl", "tpot", "e2e"):
        v = getattr(args, f"slo_{key}", None)
        if v is not None:
            slo[key] = v
            names.from_file.discard(f"slo.{key}")
            names.from_flags.add(f"slo.{key}")
    s["slo"] = slo
    spec = s.get("speculative")
    if not isinstance(spec, dict):
        raise TypeError(f"{names('speculative')} must be a table ([speculative] with "
                        f"{', '.join(SPEC_FLAGS)}), got {spec!r}")
    spec = dict(spec)
    for key in SPEC_FLAGS:
        v = getattr(args, f"spec_{key}", None)
        if v is not None:
            spec[key] = v
            names.from_file.discard(f"speculative.{key}")
            names.from_flags.add(f"speculative.{key}")
    s["speculative"] = spec
    checked = check_settings(s, names, given)
    if extra:
        checked["extra"] = extras
    return checked


def check_settings(s, names=None, given=()) -> dict:
    """``s`` with the ``sim run``-only settings checked; the engine's knobs are checked by
    ``SimConfig``. ``names(key)`` says how the user wrote a key; ``given``: keys the user set."""
    names = names or Names(None)

    def typed(key, kind, what):
        if s[key] is not None and (isinstance(s[key], bool) is not (kind is bool)
                                   or not isinstance(s[key], kind)):
            raise TypeError(f"{names(key)} must be {what}, got {s[key]!r}")

    typed("workload", (str, Path), "a trace name or a file path")
    typed("cost", str, "roofline, constant:SECONDS or linear:BASE,PREFILL,DECODE,CONTEXT")
    typed("profile", (str, Path), "a profile file path")
    typed("output", (str, Path), "a folder path")
    typed("plots", bool, "true or false")
    from workloads import trace_names
    for key in ("workload", "profile"):  # read from the working directory, not the file's folder
        if key in names.from_file and s[key] is not None and str(s[key]) not in trace_names():
            not_beside_file(s[key], key, names.config)
    for key in ("scheduler", "router", "weight_dtype", "kv_dtype", "prefix_caching",
                "capacity_scheduler_policy", "context_chunking_policy"):
        if isinstance(s[key], str):  # names take any case, as the flags do
            s[key] = s[key].strip().lower()
    if isinstance(s["speculative"], dict) and isinstance(s["speculative"].get("method"), str):
        s["speculative"]["method"] = s["speculative"]["method"].strip().lower()
    if s["num_requests"] is not None:
        if s["num_requests"] == 0 and not isinstance(s["num_requests"], bool):
            raise ValueError(f"{names('num_requests')} must be >= 1, got 0: an empty workload "
                             f"has nothing to simulate")
        s["num_requests"] = positive_int(names("num_requests"), s["num_requests"])
    if s["rate"] is not None:
        s["rate"] = positive_float(names("rate"), s["rate"])
    s["seed"] = positive_int(names("seed"), s["seed"], allow_zero=True)
    if s["hash_block_tokens"] is not None:
        s["hash_block_tokens"] = positive_int(names("hash_block_tokens"), s["hash_block_tokens"])
    s["replicas"] = positive_int(names("replicas"), s["replicas"])
    typed("router", str, f"a router name ({', '.join(ROUTERS)})")
    if s["router"].strip().lower() not in ROUTERS:
        raise ValueError(f"{names('router')} {s['router']!r} is not a router"
                         f"{did_you_mean(s['router'], list(ROUTERS))}; known: "
                         f"{', '.join(ROUTERS)}")
    pools = [k for k in ("prefill_replicas", "decode_replicas") if s[k] is not None]
    for key in pools:
        s[key] = positive_int(names(key), s[key])
    if s["link_bandwidth_gbps"] is not None:
        s["link_bandwidth_gbps"] = positive_float(names("link_bandwidth_gbps"),
                                                  s["link_bandwidth_gbps"])
    s["link_latency_s"] = positive_float(names("link_latency_s"), s["link_latency_s"],
                                         allow_zero=True)
    link = [k for k in ("link_bandwidth_gbps", "link_latency_s") if k in given]
    if link and not pools:
        raise ValueError(f"{names(link[0])} applies to disaggregation only: give "
                         f"{names.like(link[0], 'prefill_replicas')} and/or "
                         f"{names.like(link[0], 'decode_replicas')}")
    if pools and s["replicas"] != 1:
        raise ValueError(f"{names('replicas')} and {names.like('replicas', pools[0])} exclude "
                         f"each other: a disaggregated run's size is its two pools")
    if s["closed_loop_users"] is not None:
        s["closed_loop_users"] = positive_int(names("closed_loop_users"), s["closed_loop_users"])
    s["think_time"] = positive_float(names("think_time"), s["think_time"], allow_zero=True)
    if "rate" in given and s["closed_loop_users"] is not None:
        raise ValueError(f"{names('rate')} applies to an open loop: with "
                         f"{names.like('rate', 'closed_loop_users')} the users issue the "
                         f"requests (drop the rate, or use "
                         f"{names.like('rate', 'think_time')})")
    if "think_time" in given and s["closed_loop_users"] is None:
        raise ValueError(f"{names('think_time')} applies to a closed loop only: give "
                         f"{names.like('think_time', 'closed_loop_users', 'USERS')} as well")
    unknown = sorted(set(s["slo"]) - set(SLO_KEYS))
    if unknown:
        raise ValueError(f"{names('slo')}: unknown SLO(s) {unknown}; known: {list(SLO_KEYS)}")
    for key, limit in s["slo"].items():
        s["slo"][key] = positive_float(names(f"slo.{key}"), limit)
    unknown = sorted(set(s["speculative"]) - set(SPEC_FLAGS))
    if unknown:
        hint = did_you_mean(unknown[0], list(SPEC_FLAGS))
        raise ValueError(f"{names('speculative')}: unknown key(s) {unknown}{hint}; known: "
                         f"{list(SPEC_FLAGS)}")
    if "speculative" in given and not s["speculative"]:
        raise ValueError(f"{names.config}: [speculative] is empty: give num_speculative_tokens "
                         f"and the draft's cost (draft_model, draft_cost_ratio, or method = "
                         f"\"ngram\"), or remove the table to run without speculation")
    if s["speculative"] and "num_speculative_tokens" not in s["speculative"]:
        if names.table("speculative"):
            raise ValueError(f"{names.config}: [speculative] needs num_speculative_tokens (K, "
                             f"the draft tokens per iteration)")
        raise ValueError(f"speculative decoding needs its number of draft tokens: give "
                         f"{names('speculative.num_speculative_tokens')} K")
    if s["profile"] is not None and "cost" in given:  # the profile would win, silently
        raise ValueError(f"{names('cost')} and {names.like('cost', 'profile')} exclude each "
                         f"other: a calibration profile prices every step")
    if s["profile"] is not None and not Path(s["profile"]).is_file():
        raise ValueError(f"{names('profile')} {str(s['profile'])!r}: no such file")
    return s


def check_router_used(s, names) -> None:
    """A router the user set (flag or file) for one colocated replica routes nothing: an error,
    as ``think_time`` without a closed loop is, never silently ignored. (``sim sweep`` does not
    call this: its grid may vary ``replicas`` under the file's router.)"""
    if s["replicas"] == 1 and s["prefill_replicas"] is None and s["decode_replicas"] is None \
            and ("router" in names.from_file or "router" in names.from_flags):
        raise ValueError(f"{names('router')} {s['router']!r} applies to several replicas only: "
                         f"give {names.like('router', 'replicas', 'N')} (N >= 2) or prefill and "
                         f"decode pools, or drop it")


def is_default_scenario(s) -> bool:
    """Whether the settings simulate exactly the README's default scenario."""
    return all(s[k] == v for k, v in DEFAULTS.items() if k not in NOT_SCENARIO)
