"""GPU presets: peak dense throughput, memory and bandwidth from published specs.

Read from ``sim/data/gpus.csv`` (the team's reference table; every number's source is in its
``sources`` column, see ``sim/data/NOTICE.md``). All TFLOP/s figures are dense (no 2:4 sparsity).
``memory_gb`` is the memory the device reports (nvidia-smi's ``memory.total``, the CSV's
``mem_device_mib``) in GB of 10**9 bytes: an "80 GB" A100 reports 81,920 MiB = 85.9 GB, an
"80 GB" H100 81,559 MiB = 85.5 GB. The datasheet's figure is ``nominal_memory_gb``.
A peak the CSV leaves empty is 0: the GPU has no such tensor cores, or no source gives the figure
(its ``notes`` say which); weights of that dtype are then dequantised
(:func:`sim.costs.roofline_params.compute_peak`).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from ..checks import did_you_mean, positive_float

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class GPU:
    name: str
    memory_gb: float
    memory_bandwidth_gbps: float
    fp16_tflops: float
    fp8_tflops: float = 0.0  # 0: no FP8 tensor cores
    int8_tops: float = 0.0
    fp4_tflops: float = 0.0
    link_bandwidth_gbps: float = 0.0  # per direction, scale-up link (NVLink)
    nominal_memory_gb: float = 0.0  # the datasheet's capacity ("80 GB"); 0: not given

    def __post_init__(self):
        for f in ("memory_gb", "memory_bandwidth_gbps", "fp16_tflops"):
            positive_float(f, getattr(self, f))
        for f in ("fp8_tflops", "int8_tops", "fp4_tflops", "link_bandwidth_gbps",
                  "nominal_memory_gb"):
            positive_float(f, getattr(self, f), allow_zero=True)


_ALIASES = {"a100": "A100-80GB-SXM", "h100": "H100-80GB-SXM", "h200": "H200-141GB-SXM",
            "l40s": "L40S", "b200": "B200-HGX", "mi300x": "MI300X", "gb200": "GB200",
            "b300": "B300-HGX", "h20": "H20", "l4": "L4", "a10g": "A10G", "rtx4090": "RTX-4090",
            "rtx5090": "RTX-5090", "mi325x": "MI325X", "mi355x": "MI355X"}


@lru_cache(maxsize=1)
def _gpu_rows() -> dict:
    text = resources.files("sim").joinpath("data/gpus.csv").read_text()
    out = {}
    for row in csv.DictReader(text.splitlines()):
        num = lambda k: float(row[k]) if row[k] else 0.0  # noqa: E731
        out[row["gpu"].lower()] = GPU(
            name=row["gpu"], memory_gb=num("mem_device_mib") * MIB / 1e9,
            nominal_memory_gb=num("mem_capacity_gb"),
            memory_bandwidth_gbps=num("mem_bandwidth_gbps"), fp16_tflops=num("fp16_dense_tflops"),
            fp8_tflops=num("fp8_dense_tflops"), int8_tops=num("int8_dense_tops"),
            fp4_tflops=num("fp4_dense_tflops"), link_bandwidth_gbps=num("scaleup_bw_unidir_gbps"))
    return out


def gpu_presets() -> list[str]:
    """The short names :func:`get_gpu` accepts, sorted."""
    return sorted(_ALIASES)


def gpu_row(gpu) -> dict:
    """The CSV row of a preset (its ``sources``, ``notes``, links and form factor)."""
    name = get_gpu(gpu).name
    text = resources.files("sim").joinpath("data/gpus.csv").read_text()
    return next(r for r in csv.DictReader(text.splitlines()) if r["gpu"] == name)


def get_gpu(gpu) -> GPU:
    """Resolve a preset (:func:`gpu_presets`: ``"h100"``, ``"l4"``, ``"mi355x"``, ...), a row's
    full name (``"H100-80GB-SXM"``) or a ``GPU``."""
    if isinstance(gpu, GPU):
        return gpu
    if not isinstance(gpu, str):
        raise TypeError(f"gpu must be a preset name or GPU, got {type(gpu).__name__}")
    key = _ALIASES.get(gpu.strip().lower(), gpu).lower()
    rows = _gpu_rows()
    if key not in rows:
        raise ValueError(f"gpu {gpu!r} is not a preset{did_you_mean(gpu, gpu_presets())}; "
                         f"choose one of {gpu_presets()}")
    return rows[key]


@lru_cache(maxsize=1)
def _domains() -> dict:
    text = resources.files("sim").joinpath("data/scaleup_domain.csv").read_text()
    rows = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))
    return {r["gpu"]: (int(r["domain_gpus"]), r["platform"]) for r in rows}


def scaleup_domain(gpu) -> tuple[int, str] | None:
    """``(GPUs, platform)`` of a preset's scale-up domain (``sim/data/scaleup_domain.csv``: 8
    on an HGX or AMD Instinct board or a PCIe host, 72 in a GB200 NVL72 rack); None for a
    ``GPU`` of the user's own, whose platform is not known."""
    return _domains().get(get_gpu(gpu).name)


def check_scaleup_domain(gpu, tensor_parallel: int) -> int:
    """``tensor_parallel`` if one scale-up domain of ``gpu`` holds that many GPUs; else a
    ``ValueError`` naming the value and the limit. A TP group's all-reduces are priced at the
    scale-up bandwidth: past the domain they would cross the network between hosts, which
    nothing here prices (sim has no multi-node tensor parallelism: use replicas)."""
    domain = scaleup_domain(gpu)
    if domain is not None and tensor_parallel > domain[0]:
        gpus, platform = domain
        raise ValueError(f"tensor_parallel {tensor_parallel} is more GPUs than one scale-up "
                         f"domain of {get_gpu(gpu).name} holds: at most {gpus} ({platform}; "
                         f"sim/data/scaleup_domain.csv); tensor parallelism over the network "
                         f"between hosts is not modelled: use replicas for more GPUs")
    return tensor_parallel
