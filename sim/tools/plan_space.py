"""The planner's search space: its candidates, each built into a config, and the pruning that
needs no simulation.

``space`` maps a key to a non-empty list of values: a :class:`~sim.engine.config.SimConfig`
field (``gpu``, ``tensor_parallel``, ``weight_dtype``, ``scheduler``, ``max_batch_size``,
``chunk_size``, ``replicas``, ``router``, ...) or ``split``, the serving layout:
``"aggregated"`` (colocated replicas, the base config's ``replicas``), or ``"P:D"``, a
prefill pool of P replicas and a decode pool of D (:class:`~sim.engine.fleet.disaggregation.
Disaggregation`, the base's link if it has one), or a pool's own knob ``prefill_<knob>`` /
``decode_<knob>`` (a :data:`~sim.engine.fleet.disaggregation.POOL_KNOBS` entry: ``prefill_gpu``,
``decode_gpu``, ``decode_tensor_parallel``, ...: heterogeneous pools, added to that pool's
overrides; an aggregated candidate ignores them, so its copies are duplicates). Candidates are
the product of the lists, in the space's order (the first key varies slowest).

Invariants: every candidate gets a verdict, in order, before any simulation: ``invalid`` (the
config does not build: its check's message), ``duplicate`` (the same config as an earlier
candidate: ``replicas`` beside a disaggregated split, whose pools are its fleet), ``memory``
(the weights do not fit: the memory budget's message and advice), ``price`` (ranking by
dollars, and the GPU has no sourced price); the rest are simulated. A value ``invalid`` in every
candidate and on its own (the base with that value alone does not build) is a
:class:`SpaceValueError` before any verdict counts: a typo, not a combination to prune.
"""

from __future__ import annotations

import dataclasses
import re

from ..engine.config import SimConfig
from ..results.economics import price_missing

FIELDS = frozenset(f.name for f in dataclasses.fields(SimConfig))
POOLS = ("prefill", "decode")


def pool_key(key) -> tuple | None:
    """``(pool, knob)`` of a pool's space key (``"decode_gpu"``: ``("decode", "gpu")``), else
    None."""
    from ..engine.fleet.disaggregation import POOL_KNOBS
    pool, _, knob = key.partition("_")
    return (pool, knob) if pool in POOLS and knob in POOL_KNOBS else None
SPLIT = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")


def check_space(space) -> dict:
    """``space`` as a dict of lists, a ``ValueError`` naming a bad key or value."""
    if not isinstance(space, dict) or not space:
        raise ValueError(f"space must be a non-empty dict of SimConfig field -> list of values, "
                         f"got {space!r}")
    out = {}
    for key, values in space.items():
        if key not in FIELDS and key != "split" and pool_key(key) is None:
            raise ValueError(f"space key {key!r} is not a SimConfig field, 'split' nor a "
                             f"pool's knob (prefill_gpu, decode_tensor_parallel, ...)")
        if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
            raise ValueError(f"space[{key!r}] must be a list of values, got {values!r}")
        out[key] = list(values)
        if not out[key]:
            raise ValueError(f"space[{key!r}] is empty")
    for v in out.get("split", ()):
        if not (v == "aggregated" or (isinstance(v, str) and SPLIT.match(v))):
            raise ValueError(f"space['split'] value {v!r} must be 'aggregated' or 'P:D' "
                             f"(prefill and decode replicas, e.g. '1:2')")
    return out


def split_of(value) -> tuple | None:
    """``(P, D)`` of a ``split`` value, ``None`` for ``"aggregated"``."""
    if value == "aggregated":
        return None
    p, d = SPLIT.match(value).groups()
    return int(p), int(d)


def candidate_config(base, knobs) -> SimConfig:
    """``base`` with a candidate's knobs (a ``split`` sets or drops its disaggregation; a
    pool's knob goes to that pool's overrides when the candidate is disaggregated)."""
    from ..engine.fleet.disaggregation import Disaggregation
    pools = {k: pool_key(k) for k in knobs if pool_key(k) is not None}
    fields = {k: v for k, v in knobs.items() if k != "split" and k not in pools}
    dis = base.disaggregation
    if "split" in knobs:
        split = split_of(knobs["split"])
        dis = None if split is None else dataclasses.replace(
            dis or Disaggregation(), prefill_replicas=split[0], decode_replicas=split[1])
        if dis is not None:
            fields["replicas"] = 1  # (its pools are the fleet: replicas does not apply)
    if pools and dis is None and "split" not in knobs:
        raise ValueError(f"space key {next(iter(pools))!r} sets a pool of a disaggregated "
                         f"run: give a 'split' ('P:D') or a base with a disaggregation")
    if dis is not None and pools:
        over = {pool: dict(getattr(dis, pool)) for pool in POOLS}
        for key, (pool, knob) in pools.items():
            over[pool][knob] = knobs[key]
        dis = dataclasses.replace(dis, **over)
    if "split" in knobs or pools:
        fields["disaggregation"] = dis
    return dataclasses.replace(base, **fields)


def static_verdict(base, knobs, objective, seen) -> tuple:
    """``(config, None)`` for a candidate worth simulating, else ``(None, (stage, reason))``
    (see the module docstring). ``seen``: config -> the knobs of the first candidate that had
    it, filled in here."""
    try:
        config = candidate_config(base, knobs)
        pools = [config]
        if config.disaggregation is not None:
            pools = config.disaggregation.pool_configs(config)
            config.disaggregation.bandwidth_bytes(config)  # (a GPU with no link: give one)
    except (TypeError, ValueError) as e:
        return None, ("invalid", str(e))
    key = repr(config)
    if key in seen:
        why = f"the same configuration as {seen[key]}"
        if config.disaggregation is not None:
            why += " (a disaggregated split's pools are its fleet: replicas does not apply)"
        elif any(pool_key(k) for k in knobs):
            why += " (an aggregated candidate has no pools: their knobs do not apply)"
        return None, ("duplicate", why)
    seen[key] = ", ".join(f"{k}={v}" for k, v in knobs.items())
    try:
        for pool in pools:
            pool.resolved_kv_blocks()
    except (TypeError, ValueError) as e:
        text = str(e)
        return None, ("memory" if "fit" in text or "room" in text else "invalid", text)
    if objective.startswith("usd_"):
        missing = price_missing(config)
        if missing:
            return None, ("price", missing)
    return config, None


class SpaceValueError(ValueError):
    """A value of the space invalid on its own: ``key``, ``value`` and why (the CLI names the
    key as the file spelt it)."""

    def __init__(self, key, value, reason):
        self.key, self.value, self.reason = key, value, reason
        super().__init__(f"space[{key!r}] value {value!r} is invalid on its own (so in every "
                         f"candidate): {reason}")


INTS = frozenset(f.name for f in dataclasses.fields(SimConfig)
                 if f.type in ("int", "int | None") and f.name != "seed")  # counts: >= 1
NAMES = ("gpu", "model", "scheduler", "router")  # a preset or a kind, whatever else is set


def own_reason(key, value) -> str | None:
    """Why ``value`` cannot be ``key``'s whatever the other fields are, else None: a count
    (an int field: ``tensor_parallel``, ``replicas``, ``chunk_size``, ...) below 1 or not an
    integer; a preset or kind (``gpu``, ``model``, ``scheduler``, ``router``) that
    ``SimConfig`` with it alone refuses. A count the model's heads refuse, a knob another
    scheduler reads: invalid only in combination (None here)."""
    field = pool_key(key)[1] if pool_key(key) is not None else key
    if field in INTS:
        from ..checks import positive_int
        try:
            value is None or positive_int(field, value)
        except (TypeError, ValueError) as e:
            return str(e)
        return None
    if field in NAMES:
        _, pruned = static_verdict(SimConfig(), {field: value}, "ttft_p99", {})
        return pruned[1] if pruned is not None and pruned[0] == "invalid" else None
    return None


def check_values(space, stages) -> None:
    """Raise :class:`SpaceValueError` for the first value (in the space's order) that is
    invalid on its own (:func:`own_reason`) and in every candidate (``stages``: each
    candidate's stage, the product's order): a typo to fix, not candidates to prune. A value
    invalid only beside other values stays a pruned candidate."""
    import itertools
    for i, key in enumerate(space):
        for value in space[key]:
            reason = own_reason(key, value)
            if reason is not None and all(stage == "invalid" for values, stage in zip(
                    itertools.product(*space.values()), stages) if values[i] == value):
                raise SpaceValueError(key, value, reason)
