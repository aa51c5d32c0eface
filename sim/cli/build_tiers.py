"""The CLI's offload tier chain (:mod:`sim.cli.table_offload`'s rows) as a ``KVTierChain``.

:func:`tier_chain` turns the ``kv_tiers`` target's fields and the first tier the
``kv_offload`` rows made into ``SimConfig.kv_offload``: a preset's chain
(``sim.offload_preset``), its first tier's given fields replacing the preset's, or a chain of
that tier and an optional second of ``lower_gb``; without any ``kv_tiers`` field the tier is
left as it is (a ``KVTier``).
"""

from __future__ import annotations

import dataclasses

_CHAIN_FIELDS = ("write_policy", "write_threshold", "link_gbps", "layer_overlap",
                 "prefetch_policy", "prefetch_timeout_base", "prefetch_threshold")


def tier_chain(fields: dict | None, tier, given: dict):
    """``SimConfig.kv_offload`` from the ``kv_tiers`` ``fields`` (None: none given), the
    first tier ``tier`` (a ``KVTier`` or None) and the ``kv_offload`` fields ``given``."""
    if not fields:
        return tier
    from ..engine.kv.offload import KVTier
    from ..engine.kv.tiers import KVTierChain
    from ..engine.presets.offload import offload_preset
    if tier is None:
        from .table_offload import ROWS
        keys = [row.key for row in ROWS if row.api_field in fields and row.to == ("kv_tiers",)]
        raise ValueError(f"{keys[0]} needs offload_gb: the first offload tier's capacity per "
                         f"GPU in GB")
    chain = {k: fields[k] for k in _CHAIN_FIELDS if k in fields}
    lower = fields.get("lower_gb", 0.0)
    if fields.get("preset"):
        made = offload_preset(fields["preset"], tier.capacity_gb, lower, **chain)
        first = dataclasses.replace(made.tiers[0], **given)
        return dataclasses.replace(made, tiers=(first,) + made.tiers[1:])
    tiers = (tier,) + ((KVTier(lower),) if lower else ())
    return KVTierChain(tiers, **chain)
