"""The CLI's rows for LoRA adapters (:mod:`sim.engine.kv.lora`), appended to the table
(:mod:`sim.cli.table`), with vLLM's flag names.

``--enable-lora`` makes the run's ``lora`` a :class:`~sim.engine.kv.lora.LoRAConfig` of the
``lora`` rows' fields (:func:`lora_from`); a ``lora`` field given without it is an error
(never silently ignored). ``--lora-adapters N`` gives the workload a ``lora_id`` column
(``workloads.lora_mix``: N adapters of Zipf popularity ``--lora-zipf``). Loads nothing beyond
the standard library.
"""

from __future__ import annotations

from .arguments import at_least_zero, count, positive, typed
from .setting import Setting as S

LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's (kv.lora.VLLM_RANKS: tested equal)


def lora_rank(shown, value):
    """A slot rank: a positive integer among vLLM's allowed ranks, named as the user wrote it
    (``--max-lora-rank``, ``exp.toml: max_lora_rank``)."""
    value = count(shown, value)
    if value not in LORA_RANKS:
        raise ValueError(f"{shown} must be one of {LORA_RANKS} (vLLM's), got {value}")
    return value


ROWS = (
    S("enable_lora", ("--enable-lora",), ("lora_switch",), "enable", parse=bool,
      check=typed(bool, "true or false"),
      help="serve LoRA adapters (vLLM's --enable-lora): GPU slots preallocated at "
           "--max-lora-rank off the KV budget, a request waits for its adapter's slot, loads "
           "from CPU or disk, the batched LoRA GEMMs per distinct adapter",
      default_help="default: off"),
    S("max_loras", ("--max-loras",), ("lora",), parse=int, metavar="N", check=count,
      help="LoRA: GPU adapter slots, the most distinct adapters in one batch (vLLM's)",
      default_help="default 1"),
    S("max_lora_rank", ("--max-lora-rank",), ("lora",), parse=int, metavar="R",
      check=lora_rank,
      kind="one of " + ", ".join(map(str, LORA_RANKS)),
      help="LoRA: the rank every slot is preallocated at (vLLM's allowed values)",
      default_help="default 16"),
    S("max_cpu_loras", ("--max-cpu-loras",), ("lora",), parse=int, metavar="N", check=count,
      help="LoRA: adapters the CPU cache holds, >= --max-loras (vLLM's)",
      default_help="default: --max-loras"),
    S("lora_default_rank", ("--lora-rank",), ("lora",), "default_rank", parse=int,
      metavar="R", check=count,
      help="LoRA: every adapter's rank, <= --max-lora-rank",
      default_help="default: --max-lora-rank"),
    S("lora_cpu_bandwidth", ("--lora-cpu-bandwidth",), ("lora",), "cpu_gbps", parse=float,
      metavar="GB_S", check=positive, help="LoRA: CPU -> GPU adapter load bandwidth, GB/s > 0",
      default_help="default 25"),
    S("lora_disk_bandwidth", ("--lora-disk-bandwidth",), ("lora",), "disk_gbps", parse=float,
      metavar="GB_S", check=positive, help="LoRA: disk -> CPU adapter load bandwidth, GB/s > 0",
      default_help="default 2"),
    S("lora_adapters", ("--lora-adapters",), ("lora_mix",), "adapters", parse=int,
      metavar="N", check=count,
      help="LoRA: give the workload a lora_id column of N adapters (workloads.lora_mix)",
      default_help="default: the workload's own lora_id column, if any"),
    S("lora_zipf", ("--lora-zipf",), ("lora_mix",), "zipf", parse=float, metavar="S",
      check=at_least_zero, help="LoRA: the adapters' Zipf popularity exponent, >= 0 (0: uniform)",
      default_help="default 1.0"),
)


def lora_from(p: dict):
    """``SimConfig.lora`` from the settings' parts (``{target: {field: value}}``): a
    ``LoRAConfig`` with ``--enable-lora``, else None; a ``lora`` field without it is an error."""
    fields = p.get("lora", {})
    if not p.get("lora_switch", {}).get("enable"):
        given = [row.key for row in ROWS if row.to == ("lora",) and row.api_field in fields]
        if given:
            raise ValueError(f"{given[0]} needs enable_lora (--enable-lora)")
        return None
    from ..engine.kv.lora import LoRAConfig
    return LoRAConfig(**fields)


def with_lora_ids(df, p: dict, seed):
    """The workload with ``workloads.lora_mix``'s ``lora_id`` column when ``lora_adapters``
    is given (``lora_zipf`` alone is an error), else as it is."""
    mix = p.get("lora_mix", {})
    if not mix:
        return df
    if "adapters" not in mix:
        raise ValueError("lora_zipf needs lora_adapters (--lora-adapters)")
    import workloads
    return workloads.lora_mix(df, seed=seed, **mix)
