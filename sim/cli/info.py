"""``sim workload`` (list / describe bundled traces and files) and ``sim memory`` (does a model
fit on a GPU, and how much KV cache is left).

The settings they share with ``sim run`` are its rows of the table (:mod:`sim.cli.table`): the
same flags, checks and help (``DESCRIBE``: the workload's; ``MEMORY``: the GPU and the tensor
parallelism); ``sim memory``'s own knobs are each engine's memory-accounting names, and its
precisions ``memory_budget``'s (fp32 as well)."""

from __future__ import annotations

import numbers
import warnings

from ..checks import each_gpu, plural
from .arguments import output_file
from .build import as_written
from .settings import Names, add_flags, flag_values
from .table import BY_KEY, FREE_GPU_MEMORY_FRACTION_HELP, flag_of

DESCRIBE = ("num_requests", "rate", "seed", "hash_block_tokens")  # sim run's rows it shares
MEMORY = ("gpu", "tensor_parallel")  # (its precisions: memory_budget's, fp32 too)


def accounting_block_size(accounting) -> int:
    """The KV block (page) of the engine whose memory accounting ``sim memory`` shows, as
    ``sim run`` with that engine's preset counts its pool (vLLM's 16 tokens, SGLang's page of
    1, TensorRT-LLM's 32): read from the preset of that name, not restated here."""
    from ..engine import SimConfig
    return SimConfig(scheduler=accounting).resolved().block_size


def cmd_workload(args) -> int:
    """``sim workload list`` prints the bundled trace names; ``describe`` prints a workload's
    statistics (``workloads.describe``) and, with ``--plot``, writes a PNG of it."""
    import workloads
    if args.action == "list":
        for name in workloads.trace_names():
            print(name)
        return 0
    if not args.name:
        raise ValueError("describe needs a bundled trace name or a file (see 'sim workload "
                         "list')")
    if args.plot:  # checked before any work; its folder is made only once there is a figure
        plot = output_file(args.plot, "--plot")
        if plot.suffix.lower() != ".png":
            raise ValueError(f"--plot {args.plot!r} must be a file name ending in .png")
    load = flag_values(args, DESCRIBE)
    shown = {**{k: None for k in DESCRIBE}, "speculative": {}}
    try:
        with warnings.catch_warnings(record=True) as said:  # (seed=3 unused: --seed 3)
            warnings.simplefilter("always")
            df = workloads.load(args.name, **load)
    except ValueError as e:  # the loader names its arguments (n=, rate=): name the flags
        raise ValueError(as_written(str(e), shown, Names(None))) from None
    for w in said:
        warnings.warn(as_written(str(w.message), shown, Names(None)), w.category)
    d = workloads.describe(df)
    width = max(len(k) for k in d)
    for k, v in d.items():
        shown = (f"{v:,.4g}" if isinstance(v, float) else  # counts and maxima: 14,050
                 f"{v:,}" if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v)
        print(f"{k:<{width}}  {shown}")
    if args.plot:
        plot.parent.mkdir(parents=True, exist_ok=True)
        workloads.plot_workload(df, plot)
        print(f"wrote {args.plot}")
    return 0


# memory_budget's argument -> the flag of ``sim memory`` that sets it
MEMORY_FLAGS = {**{k: flag_of(k) for k in MEMORY}, "gpu_memory_gb": "--gpu-memory-gb",
                "weight_dtype": "--weight-dtype", "kv_dtype": "--kv-dtype",
                "gpu_memory_utilization": "--utilization",
                "max_num_batched_tokens": "--max-num-batched-tokens",
                "max_num_seqs": "--max-num-seqs", "mem_fraction_static": "--mem-fraction-static",
                "free_gpu_memory_fraction": "--free-gpu-memory-fraction"}


def cmd_memory(args) -> int:
    """``sim memory``: parameters, weight and KV bytes of a model, the serving engine's memory
    accounting on one GPU term by term, and whether it fits with room for KV cache (exit status 1
    when it does not, with the advice to quantize or add GPUs)."""
    from ..specs.gpus import check_scaleup_domain, get_gpu, scaleup_domain
    from ..specs.memory import READ_BY, GiB, memory_budget
    engine_knobs = {"gpu_memory_utilization": args.utilization,
                    "max_num_batched_tokens": args.max_num_batched_tokens,
                    "max_num_seqs": args.max_num_seqs,
                    "mem_fraction_static": args.mem_fraction_static,
                    "free_gpu_memory_fraction": args.free_gpu_memory_fraction}
    unused = [k for k in engine_knobs if args.accounting not in READ_BY[k]]
    for key in unused:  # a flag that would change nothing is an error, never ignored
        if engine_knobs[key] is not None:
            used = ", ".join(MEMORY_FLAGS[k] for k in engine_knobs if k not in unused)
            raise ValueError(f"{MEMORY_FLAGS[key]} is not used by --accounting "
                             f"{args.accounting} (its knobs: {used})")
    shared = flag_values(args, MEMORY)  # gpu, tensor_parallel
    name = shared.pop("gpu")
    try:
        gpu = None if args.gpu_memory_gb is not None else get_gpu(name)
        gb = args.gpu_memory_gb if gpu is None else gpu.memory_gb
        domain = None if gpu is None else scaleup_domain(gpu)
        b = memory_budget(args.model, gb, weight_dtype=args.weight_dtype,
                          max_tensor_parallel=None if domain is None else domain[0],
                          kv_dtype=args.kv_dtype, **shared, accounting=args.accounting,
                          block_size=accounting_block_size(args.accounting),
                          **{k: v for k, v in engine_knobs.items() if v is not None})
        if domain is not None:  # (after the model's own checks, in SimConfig's order)
            check_scaleup_domain(gpu, b.tensor_parallel)
    except (ValueError, TypeError) as e:  # the library names its arguments; name the flags
        msg = str(e)
        field = msg.split(" ", 1)[0].split("=", 1)[0]
        if field in MEMORY_FLAGS:  # "tensor_parallel must ..." / "gpu_memory_gb=0 ..."
            rest = msg[len(field):]
            msg = MEMORY_FLAGS[field] + (" " + rest[1:] if rest.startswith("=") else rest)
        raise type(e)(msg) from None
    print(f"{b.model.name}: {b.model.total_params() / 1e9:.2f} B parameters, weights "
          f"{b.weights_bytes / GiB:.1f} GiB, KV {b.kv_bytes_per_token / 1024:.0f} KiB/token")
    device = b.device_memory_bytes
    where = f"{gpu.name}: " if gpu is not None else ""
    print(f"{where}{device / 2**20:,.0f} MiB = {device / GiB:.2f} GiB as the device reports it; "
          f"{b.accounting} accounting on {each_gpu(b.tensor_parallel)}:")
    rows = [(f"{'+' if t.bytes > 0 else '-'} {t.name}", t.bytes, t.source) for t in b.terms]
    rows.append(("= KV cache", b.kv_bytes_per_gpu,
                 f"{plural(b.kv_blocks, 'block')} of {plural(b.block_size, 'token')} "
                 f"({b.kv_block_bytes_per_gpu / 2**20:g} MiB each)"))
    width = max(len(r[0]) for r in rows)
    for label, n, source in rows:
        print(f"  {label:<{width}}  {abs(n) / GiB:8.2f} GiB  {abs(n):>15,} B  {source}")
    print(b.advice)
    return 0 if b.fits else 1


def add_parsers(sub):
    p_wl = sub.add_parser("workload", help="list or describe workloads")
    p_wl.add_argument("action", choices=["list", "describe"],
                      help="list: the bundled traces; describe: statistics of one workload")
    p_wl.add_argument("name", nargs="?", help="bundled trace name or CSV/JSONL/parquet file")
    add_flags(p_wl, [BY_KEY[k] for k in DESCRIBE])
    p_wl.add_argument("--plot", metavar="PNG", help="write a PNG of the workload (default none)")
    p_wl.set_defaults(func=cmd_workload)
    p_mem = sub.add_parser("memory", help="memory budget of a model on a GPU")
    p_mem.add_argument("model", help="model preset such as llama-3.1-70b (an unknown name "
                                      "lists them)")
    add_flags(p_mem, [BY_KEY[k] for k in MEMORY])
    p_mem.add_argument("--gpu-memory-gb", type=float,
                       help="override the memory the GPU reports, GB = 1e9 bytes (default: the "
                            "preset's)")
    p_mem.add_argument("--weight-dtype", default="fp16", help="weight precision (default fp16)")
    p_mem.add_argument("--kv-dtype", default="fp16", help="KV cache precision (default fp16)")
    p_mem.add_argument("--utilization", type=float, default=None,
                       help="vLLM's gpu_memory_utilization (default 0.9)")
    p_mem.add_argument("--accounting", choices=["vllm", "sglang", "tensorrt-llm"],
                       default="vllm", help="whose memory accounting (default vllm)")
    p_mem.add_argument("--max-num-batched-tokens", type=int, default=None,
                       help="vLLM: tokens of the profiling forward pass; TensorRT-LLM: "
                            "max_num_tokens, which sizes its activations (default 8192)")
    p_mem.add_argument("--max-num-seqs", type=int, default=None,
                       help="vLLM: sequences sampled in the profiling run (default 256)")
    p_mem.add_argument("--mem-fraction-static", type=float, default=None,
                       help="SGLang: weights + KV fraction (default: SGLang's own for the GPU)")
    p_mem.add_argument("--free-gpu-memory-fraction", type=float, default=None,
                       help=FREE_GPU_MEMORY_FRACTION_HELP + " (default 0.9)")
    p_mem.set_defaults(func=cmd_memory)
