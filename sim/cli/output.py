"""What ``sim run`` prints and writes: the summary as a plain-text table
(:func:`format_summary`), strict JSON (:func:`strict_json`: an undefined metric is ``null``
with its reason in ``null_reasons``), parquet files, and :func:`write_outputs`, which writes
each file under a temporary name and renames it into place."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .. import native
from ..checks import plural
from ..results import FIGURES
from ..results.atomic import atomic_path


# an SLO in the summary's words: the ITL limit holds each request's every gap (its max_itl)
SLO_LABELS = (("ttft", "TTFT", ""), ("itl", "ITL", " (every gap)"), ("tpot", "TPOT", ""),
              ("e2e", "E2E", ""))


def _num(value, spec) -> str:
    """``value`` formatted, or ``n/a`` when it is not defined (NaN)."""
    return "n/a" if value is None or value != value else format(value, spec)


def _tokens_per_s(value) -> str:
    """A token throughput: whole tokens from 1/s up (``3,085``), else three figures (a run of
    requests hours apart printed ``0 output tok/s`` beside ``8.88e-10 req/s``)."""
    return _num(value, ",.0f" if value is not None and value >= 1 else ".3g")


def format_summary(summary, max_batch_size=None, prefix_caching=None,
                   names_prefixes=True, lora=None) -> str:
    """The summary as the aligned plain-text table ``sim run`` prints (units in the labels;
    each share says what it is a share of); ``prefix_caching`` (the run's mode, when on): a
    row with the cache's hit rate, saying so when the workload names no prefix block
    (``names_prefixes`` False: nothing can hit); ``lora`` (the run's LoRAConfig, when on) and
    the summary's ``lora_*`` metrics: a row with its slots and the adapters' loads."""
    why = ", ".join(f"{n:,} {what}" for n, what in (
        (summary.get("num_rejected_context_length"), "over max_model_len"),
        (summary.get("num_rejected_max_num_tokens"), "over max_num_tokens"),
        (summary.get("num_rejected_kv_pool"), "needing more KV than the pool holds"),
        (summary.get("num_rejected_conversation_abandoned"), "turns of abandoned "
                                                              "conversations")) if n)
    rows = [("requests", f"{summary['num_finished']:,} finished, {summary['num_rejected']:,} "
                         f"rejected of {summary['num_requests']:,}"
                         + (f" ({why})" if why else ""))]
    for key, label in (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("e2e", "E2E")):
        rows.append((f"{label} (s)", "  ".join(
            f"{stat} {_num(summary[f'{key}_{stat}'], '.4g')}"
            for stat in ("mean", "p50", "p90", "p99"))))
    slots = f" of {max_batch_size:,}" if max_batch_size else ""
    rows += [
        ("throughput", f"{_num(summary['request_throughput'], '.3g')} req/s, "
                       f"{_tokens_per_s(summary['output_token_throughput'])} output tok/s, "
                       f"{_tokens_per_s(summary['total_token_throughput'])} total tok/s"),
        *([("cost", _cost(summary))] if "avg_power_watts" in summary else []),
        ("batch", f"{summary['mean_batch_size']:.1f} requests running on average{slots} "
                  f"({summary['slot_utilization']:.0%} of the batch slots)"),
        ("busy", f"an iteration was running {_num(summary['busy_fraction'], '.0%')} of the time "
                 f"(first arrival to last finish)"),
        ("KV cache", f"{plural(summary['kv_blocks'], 'block')}"
                     + (f" = {summary['kv_tokens']:,} tokens" if summary.get("kv_tokens") else "")
                     + (f" ({summary['kv_pool']})" if summary.get("kv_pool") else "") + ": "
                     f"{summary['kv_usage_mean']:.0%} in use "
                     f"on average, {summary['kv_usage_max']:.0%} at peak; "
                     f"{plural(summary['num_preemptions'], 'preemption')}"),
    ]
    if "bands_level" in summary:  # run(..., bands=): sim.engine.bands
        rows.append((f"{summary['bands_level']:.0%} band", "  ".join(
            f"{label} {_num(summary[f'{key}_lo'], '.4g')}-{_num(summary[f'{key}_hi'], '.4g')}"
            for key, label in (("ttft_p99", "TTFT P99"), ("tpot_p99", "TPOT P99"),
                               ("e2e_p99", "E2E P99"))) + "  output tok/s "
            f"{_num(summary['output_token_throughput_lo'], ',.0f')}-"
            f"{_num(summary['output_token_throughput_hi'], ',.0f')} (each step "
            f"x{summary['bands_factor_lo']:.3g}-{summary['bands_factor_hi']:.3g}, "
            + (f"the cost model's error on this GPU, {summary['bands_errors']})"
               if summary["bands_errors"] in ("fitted", "assumed") else
               f"{summary['bands_errors']})")))
    if prefix_caching:
        rows.append(("prefix cache", f"{prefix_caching}: "
                                     f"{_num(summary['prefix_hit_rate'], '.1%')} of prompt "
                                     f"tokens served from the cache; prefill computed "
                                     f"{_num(summary['prefill_compute_ratio'], '.3g')}x the "
                                     f"prompt tokens" + ("" if names_prefixes else
                                     " (the workload names no prefix block: no hash_ids "
                                     "covering one, so nothing can hit)")))
    if "offload_hit_rate" in summary:
        rows.append(("offload tier", f"{_num(summary['offload_hit_rate'], '.1%')} of prompt "
                                     f"tokens loaded from it; "
                                     f"{summary['offload_bytes_stored'] / 1e9:,.1f} GB stored, "
                                     f"{summary['offload_bytes_loaded'] / 1e9:,.1f} GB loaded; "
                                     f"{_num(summary['load_time_mean'] * 1e3, '.1f')} ms "
                                     f"load per request on average"))
        k = 0
        while f"offload_tier{k}_hit_rate" in summary:  # a chain: one line per tier
            rows.append((f"  tier {k}", f"{_num(summary[f'offload_tier{k}_hit_rate'], '.1%')} "
                         f"of prompt tokens read from it; "
                         f"{summary[f'offload_tier{k}_bytes_written'] / 1e9:,.1f} GB written, "
                         f"{summary[f'offload_tier{k}_bytes_read'] / 1e9:,.1f} GB read"))
            k += 1
        rows.append(("TTFT split", f"mean {_num(summary['ttft_queue_mean'], '.4g')} s queued + "
                                   f"{_num(summary['ttft_load_mean'], '.4g')} s loading + "
                                   f"{_num(summary['ttft_prefill_mean'], '.4g')} s prefill"))
    if "lora_adapter_loads" in summary:
        rows.append(("LoRA", _lora(summary, lora)))
    if "spec_acceptance_rate" in summary:
        rows.append(("speculation", f"{_num(summary['spec_acceptance_rate'], '.0%')} of draft "
                                    f"tokens accepted; "
                                    f"{_num(summary['spec_mean_acceptance_length'], '.2f')} "
                                    f"tokens per verification (bonus included)"))
    if summary.get("num_replicas", 1) > 1:
        rows.append(("cluster", f"{summary['num_replicas']} replicas, {summary['num_gpus']} "
                                f"GPUs in all (busy and batch: per replica on average)"))
    if "kv_transfer_time_mean" in summary:
        rows.append(("KV transfer", "prefill done to KV on the decode replica: mean "
                     f"{_num(summary['kv_transfer_time_mean'], '.4g')} s, P99 "
                     f"{_num(summary['kv_transfer_time_p99'], '.4g')} s (in TTFT)"))
    if "slo_attainment" in summary:
        each = "; ".join(
            f"{label} <= {summary[f'slo_{key}']:g} s{every}: "
            f"{_num(summary[f'slo_attainment_{key}'], '.1%')}"
            for key, label, every in SLO_LABELS if f"slo_{key}" in summary)
        rows.append(("SLOs", f"{_num(summary['slo_attainment'], '.1%')} of requests meet all "
                             f"({each}); goodput {_num(summary['goodput'], '.3g')} req/s, "
                             f"{_num(summary['goodput_per_gpu'], '.3g')} per GPU"))
    if "engine_overheads" in summary:  # (SimConfig.engine_overheads; none: no row)
        lag = summary.get("engine_overhead_per_request_total_s",
                          summary["engine_overhead_per_request_s"])  # (with the per-layer part)
        rows.append(("overheads", f"{summary['engine_overheads']}: "
                     f"{lag * 1e3:.3g} ms per request (in "
                     f"TTFT, E2E), CPU {summary['engine_overhead_per_iter_s'] * 1e6:.3g} us + "
                     f"{summary['engine_overhead_per_seq_s'] * 1e6:.3g} us per sequence per "
                     f"iteration, " + ("overlapped with the GPU" if
                                       summary["engine_overhead_overlap"] else "after the GPU")
                     + (f", {summary['engine_overhead_per_prefill_iter_s'] * 1e3:.3g} ms per "
                        f"prefill iteration" if "engine_overhead_per_prefill_iter_s" in summary
                        else "")
                     + (f", a prefill iteration at least "
                        f"{summary['engine_overhead_prefill_host_s'] * 1e3:.3g} ms (the host's "
                        f"launches{_host_terms(summary)})" if "engine_overhead_prefill_host_s"
                        in summary else "")))
    rows.append(("wall time", f"{summary['wall_seconds']:.2f} s to simulate"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _host_terms(summary) -> str:
    """The prefill host floor's terms, as the overheads row states them."""
    terms = []
    if "engine_overhead_prefill_host_layer_s" in summary:
        terms.append(f"{summary['engine_overhead_prefill_host_layer_s'] * 1e3:.3g} ms a layer")
    if "engine_overhead_prefill_host_launch_s" in summary:
        terms.append(f"{summary['engine_overhead_prefill_launches']:,} kernels x "
                     f"{summary['engine_overhead_prefill_host_launch_s'] * 1e6:.3g} us")
    return ", " + " + ".join(terms)


def _lora(summary, lora) -> str:
    """The LoRA row: the slots (``lora``: the run's LoRAConfig, None: not said), the adapter
    loads and their time, the distinct adapters per batch (sim.engine.kv.lora.lora_stats)."""
    slots = (f"{plural(lora.max_loras, 'GPU slot')} of rank {lora.max_lora_rank}, "
             f"{lora.max_cpu_loras:,} in the CPU cache; " if lora is not None else "")
    per = summary["lora_load_time_per_request"]
    return (f"{slots}{plural(summary['lora_adapter_loads'], 'adapter load')} "
            f"({summary['lora_disk_loads']:,} from disk), "
            f"{summary['lora_load_seconds']:.3g} s loading in all, "
            f"{_num(per * 1e3 if per == per else per, '.3g')} ms per LoRA request; "
            f"{_num(summary['lora_distinct_per_batch_mean'], '.2f')} distinct adapters per "
            f"batch on average, {summary['lora_distinct_per_batch_max']:,} at most")


def _cost(summary) -> str:
    """The cost row: dollars (when the GPU has a price) and energy (sim.results.economics)."""
    usd = summary.get("usd_per_hour")
    gpus = plural(summary.get("num_gpus", 1), "GPU")
    money = (f"${_num(usd, ',.2f')}/h for {gpus}, "
             f"${_num(summary['usd_per_million_output_tokens'], '.3g')} per million output "
             f"tokens (${_num(summary['usd_per_million_total_tokens'], '.3g')} per million "
             f"in + out)" if usd == usd else f"no sourced price for the GPU ({gpus}): set "
                                                f"usd_per_gpu_hour")
    return (f"{money}; {_num(summary['energy_joules_per_output_token'], '.3g')} J per output "
            f"token at {_num(summary['avg_power_watts'], ',.0f')} W on average")


def _null_reason(key, summary) -> str:
    if key.startswith("usd_") and summary.get("usd_per_hour") is None:
        return "the GPU has no sourced price in sim/data/gpu_prices.csv: set usd_per_gpu_hour"
    if not summary.get("num_finished"):
        return "no request finished"
    if key.startswith(("tpot", "itl")):
        return "no finished request has two or more output tokens"
    if key.startswith(("prefix_hit", "prefill_compute")):
        return "no prompt tokens among the finished requests"
    if summary.get("duration", 1) <= 0:
        return "the window from the first arrival to the last finish has zero length"
    return "not defined for this run"


def strict_json(doc) -> str:
    """``doc`` as strict JSON: every NaN or infinity becomes ``null``, and the summary's
    ``null_reasons`` says why for each such metric."""
    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if hasattr(x, "item") and not isinstance(x, (str, bytes)):  # NumPy scalars
            x = x.item()
        if isinstance(x, float) and not math.isfinite(x):
            return None
        return x
    doc = clean(doc)
    summary = doc.get("summary")
    if isinstance(summary, dict):
        reasons = {k: _null_reason(k, summary) for k, v in summary.items() if v is None}
        if reasons:
            summary["null_reasons"] = reasons
    return json.dumps(doc, indent=2, allow_nan=False, default=str)


def write_parquet(data, path) -> None:
    """``data`` (a DataFrame, or its :func:`arrow_table`) as parquet, dictionary-encoding only
    its text columns (status, reason): on numbers the encoder's dictionary attempt cost ~25 %
    of the write (1M requests and 2.4M iterations: 1.2 -> 0.9 s) for files 4-12 % smaller.
    Integer columns (counts, indices) are delta-encoded (parquet's DELTA_BINARY_PACKED, read
    by every parquet reader): 1.23M iterations' rows 0.33 -> 0.23 s and 41 -> 27 MB."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = data if isinstance(data, pa.Table) else arrow_table(data)
    kinds = [(f.name, f.type) for f in table.schema]
    text = [n for n, t in kinds if pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_binary(t) or pa.types.is_dictionary(t) or t == pa.null()]
    ints = {n: "DELTA_BINARY_PACKED" for n, t in kinds if pa.types.is_integer(t)}
    pq.write_table(table, path, use_dictionary=text, column_encoding=ints)


def arrow_table(df):
    """``df`` as the Arrow table :func:`write_parquet` writes (no index): another thread may
    write it without touching a pandas object (numeric columns may share ``df``'s buffers:
    nothing changes ``df`` meanwhile; the summary and findings only read it)."""
    import pyarrow as pa
    return pa.Table.from_pandas(df, preserve_index=False)


TEMP_PREFIX = ".sim-run-"  # + the writer's process id + a random part
STALE_AFTER_S = 3600.0  # a temporary folder naming no process (an older sim's) this old is stale


def _alive(pid) -> bool:
    if os.name == "nt":  # (os.kill(pid, 0) would end the process there): by age alone
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_stale_temporaries(out) -> list[str]:
    """Remove the temporary folders a killed run left in ``out`` (``kill -9``, a power cut: its
    ``finally`` never ran; 41 MB each at 1M requests): those of a process no longer running,
    and those naming no process (an older version's) untouched for ``STALE_AFTER_S``. A run
    still writing keeps its own. Returns the names removed."""
    import time
    removed = []
    for path in Path(out).glob(TEMP_PREFIX + "*"):
        pid = path.name[len(TEMP_PREFIX):].split("-", 1)[0]
        try:
            stale = (not _alive(int(pid)) if pid.isdigit() and "-" in path.name[len(TEMP_PREFIX):]
                     else time.time() - path.stat().st_mtime > STALE_AFTER_S)
        except OSError:
            continue
        if stale and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed


WALL_KEYS = ("wall_seconds",)  # the summary's wall-clock keys: timing.json, not summary.json


def split_wall_time(doc) -> tuple[dict, dict]:
    """``(doc without the wall-clock keys of its summary, {those keys})``: ``summary.json`` is
    then the same bytes for the same inputs, on any machine and at any load; the wall time,
    which is neither, goes to ``timing.json``."""
    summary = dict(doc.get("summary") or {})
    timing = {k: summary.pop(k) for k in WALL_KEYS if k in summary}
    return ({**doc, "summary": summary} if "summary" in doc else doc), timing


def write_outputs(res, out, doc, plots, slo=None) -> list[str]:
    """Write the files (``summary.json`` byte-stable for the same inputs, the wall time apart in
    ``timing.json``: :func:`split_wall_time`) into a temporary folder inside ``out``, then
    rename each into place. ``doc``: the summary document, or a function that makes it (called
    while a thread writes the parquet files from the frames' Arrow tables). An
    interrupted run leaves the previous files or the new ones, never half a file (and a killed
    run's temporary folder is removed by the next run: :func:`remove_stale_temporaries`). A
    figure of a previous run (``FIGURES``) that this run does not write is removed."""
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out)
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=f"{TEMP_PREFIX}{os.getpid()}-"))
    try:
        tables = [(arrow_table(res.requests), tmp / "requests.parquet"),
                  (arrow_table(res.iterations), tmp / "iterations.parquet")]
        with ThreadPoolExecutor(1) as pool:  # pyarrow encodes without the GIL: the files are
            # written while ``doc`` is made (1M requests: 0.5 s of 1.0 s hidden)
            frames = pool.submit(lambda: [write_parquet(t, path) for t, path in tables])
            doc = doc() if callable(doc) else doc
            frames.result()
        tables = None  # (their memory: free for the plots)
        doc, timing = split_wall_time(doc)
        timing["engine_core"] = native.summary()  # (the wall time's context: sim/native.py)
        (tmp / "summary.json").write_text(strict_json(doc))
        (tmp / "timing.json").write_text(strict_json(timing) + "\n")
        written = ["requests.parquet", "iterations.parquet", "summary.json", "timing.json"]
        if plots:
            from ..results.plots import save_plots
            written += [p.name for p in save_plots(res, tmp, slo=slo)]
        for name in written:
            os.replace(tmp / name, out / name)
        for name in FIGURES:  # a previous run's figure beside this run's files would mislead
            if name not in written:
                (out / name).unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return written


def write_bench_files(res, out, fmt, info) -> list[str]:
    """The run in the benchmark tool ``fmt``'s files (:func:`sim.results.bench.files.export`),
    each written under a temporary name in ``out`` and renamed into place; their names."""
    from ..results.bench.files import export
    names = []
    for name, text in export(res, fmt, info).items():
        with atomic_path(out / name) as tmp:
            tmp.write_text(text, encoding="utf-8")
        names.append(name)
    return names
