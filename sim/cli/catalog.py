"""``sim models`` and ``sim gpus``: what is known, with sources.

``sim models`` lists every model preset (its parameters, the published total it is checked
against and where that is published, its layer types, its routed experts' own precision
where the checkpoint ships one, KV bytes per token); ``sim gpus`` every
GPU preset (memory as the device reports it, bandwidth, dense peaks, link, whether the roofline's
efficiency terms were fitted to its kernels, partly (to its published kernel timings) or
assumed, and the sources of its numbers).
``--sources`` adds each row's sources as a line under it. The same rows make the docs' tables
(:func:`models_markdown`, :func:`gpus_markdown`, the ``<!-- gen: models -->`` and
``<!-- gen: gpus -->`` blocks), so the two cannot disagree.

Loads no simulation: the presets' CSV files and the roofline fit only.
"""

from __future__ import annotations

MODEL_COLUMNS = ("model", "params_B", "published_B", "active_B", "layers", "expert_dtype",
                 "kv_B_per_token", "hf_id")
GPU_COLUMNS = ("gpu", "name", "memory_GB", "HBM_GB_s", "fp16_TF", "fp8_TF", "fp4_TF",
               "link_GB_s", "tp_max", "terms")


def _kinds(m) -> str:
    """``"12 full + 12 sliding(128)"``: each layer kind's count (and window)."""
    window = {"sliding_attention": m.sliding_window, "chunked_attention": m.attention_chunk_size}
    parts = []
    for kind, n in m.layer_counts().items():
        short = kind.removesuffix("_attention")
        w = window.get(kind)
        parts.append(f"{n} {short}" + (f"({w:,})" if w else ""))
    if m.is_mla:
        parts[0] += " MLA"
    if m.is_moe:
        parts.append(f"MoE {m.num_local_experts}x top-{m.num_experts_per_tok}")
    return " + ".join(parts)


def model_rows() -> list:
    """One dict per model preset (:data:`MODEL_COLUMNS`, plus ``source``)."""
    from ..specs.memory import kv_cache_bytes
    from ..specs.models import _preset_rows, model_presets, reported_active_params, \
        reported_params
    out = []
    for name in model_presets():
        m, row = _preset_rows()[name]
        active = reported_active_params(name)
        out.append({"model": name, "params_B": f"{m.total_params() / 1e9:.2f}",
                    "published_B": f"{reported_params(name) / 1e9:g}",
                    "active_B": f"{m.active_params() / 1e9:.2f}" if m.is_moe else "",
                    "layers": _kinds(m), "expert_dtype": m.expert_dtype or "",
                    "kv_B_per_token": f"{kv_cache_bytes(1, model=m):,}",
                    "hf_id": row["hf_id"],
                    "source": row.get("reported_params_source") or row["source"]})
        if active:
            out[-1]["active_B"] += f" ({active / 1e9:g})"
    return out


def gpu_rows() -> list:
    """One dict per GPU preset (:data:`GPU_COLUMNS`, plus ``source`` and ``notes``)."""
    from ..costs.roofline_params import fitted_gpus, profiled_gpus
    from ..specs.gpus import get_gpu, gpu_presets, gpu_row, scaleup_domain
    fitted, profiled = set(fitted_gpus()), set(profiled_gpus())
    out = []
    for key in gpu_presets():
        g, row = get_gpu(key), gpu_row(key)

        def peak(v):
            return f"{v:g}" if v else "-"
        out.append({"gpu": key, "name": g.name, "memory_GB": f"{g.memory_gb:.1f}",
                    "HBM_GB_s": f"{g.memory_bandwidth_gbps:g}", "fp16_TF": peak(g.fp16_tflops),
                    "fp8_TF": peak(g.fp8_tflops), "fp4_TF": peak(g.fp4_tflops),
                    "link_GB_s": peak(g.link_bandwidth_gbps),
                    "tp_max": str(scaleup_domain(key)[0]),
                    "terms": "fitted" if key in profiled else
                    "partly fitted" if key in fitted else "assumed",
                    "source": row["sources"], "notes": row["notes"]})
    return out


def _table(rows, columns, sources) -> list:
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns).rstrip()]
    for r in rows:
        lines.append("  ".join(r[c].ljust(widths[c]) for c in columns).rstrip())
        if sources:
            lines.append(f"    source: {r['source']}")
    return lines


MODELS_NOTE = ("params_B: computed from the architecture; published_B: the figure it is checked "
               "against (within 2 %); active_B: per token (published, where given); "
               "expert_dtype: the checkpoint's routed experts' own precision (--expert-dtype "
               "checkpoint), blank: --weight-dtype's. Any other model: --model "
               "path/to/config.json.")
GPUS_NOTE = ("Dense peaks (TFLOP/s; '-': none, or no source); memory_GB as the device reports it; "
             "link per direction; tp_max: the GPUs of one scale-up domain (an HGX board, a "
             "PCIe host, a GB200 NVL72 rack), the largest --tp; terms: the roofline's efficiency terms fitted to this GPU's "
             "kernels, or assumed (the fitted GPUs' mean).")


def cmd_models(args) -> int:
    """Print the model presets (``--sources``: with where each total is published)."""
    return _print(model_rows(), MODEL_COLUMNS, args.sources, MODELS_NOTE)


def cmd_gpus(args) -> int:
    """Print the GPU presets (``--sources``: with each row's sources)."""
    return _print(gpu_rows(), GPU_COLUMNS, args.sources, GPUS_NOTE)


def _print(rows, columns, sources, note) -> int:
    print("\n".join(_table(rows, columns, sources)))
    print(note)
    return 0


def _markdown(rows, columns, extra) -> str:
    head = list(columns) + [extra]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        out.append("| " + " | ".join(str(r[c]).replace("|", "\\|") for c in columns)
                   + " | " + r[extra].replace("|", "\\|") + " |")
    return "\n".join(out) + "\n"


def models_markdown() -> str:
    """The model presets as a Markdown table (``sim models``' rows, with sources)."""
    return _markdown(model_rows(), MODEL_COLUMNS, "source")


def gpus_markdown() -> str:
    """The GPU presets as a Markdown table (``sim gpus``' rows, with sources)."""
    return _markdown(gpu_rows(), GPU_COLUMNS, "source")


def add_parsers(sub):
    for name, func, what in (("models", cmd_models, "model presets"),
                             ("gpus", cmd_gpus, "GPU presets")):
        p = sub.add_parser(name, help=f"list the {what}, with sources")
        p.add_argument("--sources", action="store_true",
                       help="print each row's sources under it (default: the table only)")
        p.set_defaults(func=func)
