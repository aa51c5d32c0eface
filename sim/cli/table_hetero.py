"""The settings of heterogeneous disaggregated pools: each pool's GPU type, tensor
parallelism and price (rows of the CLI's one table, :mod:`sim.cli.table`, appended there as
``ROWS``).

``prefill_gpu = "h100"`` with ``decode_gpu = "l40s"`` (and ``prefill_replicas`` /
``decode_replicas``, which make the disaggregation) is ``Disaggregation(prefill={"gpu":
"h100"}, decode={"gpu": "l40s"})``: the value goes to that pool's overrides
(:class:`sim.engine.fleet.disaggregation.Disaggregation`), the run's own ``gpu``,
``tensor_parallel`` and ``usd_per_gpu_hour`` apply to a pool without one. In a plan's
``[space]`` these keys are search dimensions of a ``P:D`` split. Loads nothing beyond the CLI's
argument helpers and the GPU presets.
"""

from __future__ import annotations

from ..checks import did_you_mean
from ..specs.gpus import get_gpu, gpu_presets
from .arguments import count, positive
from .setting import Setting

POOLS = ("prefill", "decode")


def _gpu(shown, value):
    if not isinstance(value, str):
        raise TypeError(f"{shown} must be a GPU preset name, got {value!r}")
    try:
        get_gpu(value)
    except ValueError:
        raise ValueError(f"{shown} {value!r} is not a GPU preset"
                         f"{did_you_mean(value.lower(), gpu_presets())}; known: "
                         f"{', '.join(gpu_presets())}") from None
    return value


def _rows(pool):
    to = (f"{pool}_pool",)
    return (
        Setting(f"{pool}_gpu", (f"--{pool}-gpu",), to, "gpu", check=_gpu, metavar="NAME",
                help=f"disaggregation: the {pool} pool's GPU preset (heterogeneous pools; "
                     f"their KV link is the network, sim.specs.links)",
                default_help="default: --gpu"),
        Setting(f"{pool}_tensor_parallel", (f"--{pool}-tp",), to, "tensor_parallel", parse=int,
                metavar="GPUS", check=count,
                help=f"disaggregation: tensor-parallel GPUs of a {pool} replica, >= 1",
                default_help="default: --tp"),
        Setting(f"{pool}_usd_per_gpu_hour", (f"--{pool}-usd-per-gpu-hour",), to,
                "usd_per_gpu_hour", parse=float, metavar="USD", check=positive,
                help=f"disaggregation: price of one GPU-hour of the {pool} pool, > 0",
                default_help="default: --usd-per-gpu-hour, else the pool GPU's sourced price"),
    )


ROWS = _rows("prefill") + _rows("decode")
