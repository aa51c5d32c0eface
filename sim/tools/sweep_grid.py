"""A sweep's grid: which fields it may vary, and its points, each built into a config and
checked before anything runs.

A grid maps a field to a non-empty list of values: a :class:`~sim.engine.config.SimConfig`
field; :data:`RESHAPE` (``rate``, ``num_requests``), which reshape the workload instead of the
config; or one of :data:`PARTS`, one field of a config object (``closed_loop``,
``disaggregation``, ``speculative``) under ``sim run``'s name for it. Its points are the
cartesian product of the values, in the grid's order (the first field varies slowest).

Invariants: :func:`check_grid` builds every point's config (:func:`point_config`) before any
point runs, so a bad value raises here naming the point; a misspelt field gets a did-you-mean; a
``rate`` beside a closed loop is refused (its users ignore it). What fails only when a point
runs (a model that does not fit its GPU) is that point's error row, not an error here; an
unknown model or GPU name is an error here.
"""

from __future__ import annotations

import dataclasses
import itertools

RESHAPE = ("rate", "num_requests")  # grid fields that reshape the workload
# grid fields that set one field of a config object, under sim run's names for them: a grid
# over users, think times, pool sizes, links or speculation settings without writing objects
PARTS = {"closed_loop_users": ("closed_loop", "num_users"),
         "think_time": ("closed_loop", "think_time"),
         "prefill_replicas": ("disaggregation", "prefill_replicas"),
         "decode_replicas": ("disaggregation", "decode_replicas"),
         "link_bandwidth_gbps": ("disaggregation", "link_bandwidth_gbps"),
         "link_latency_s": ("disaggregation", "link_latency_s"),
         "num_speculative_tokens": ("speculative", "num_speculative_tokens"),
         "acceptance_rate": ("speculative", "acceptance_rate"),
         "draft_model": ("speculative", "draft_model"),
         "draft_cost_ratio": ("speculative", "draft_cost_ratio")}


def has_object(base, grid, owner) -> bool:
    """Whether some point of ``grid`` over ``base`` has the config object ``owner``
    (``speculative``, ``disaggregation``, ``closed_loop``): the base's, a value of the grid's
    own field, or one made from a :data:`PARTS` field of it."""
    return (getattr(base, owner, None) is not None
            or any(v is not None for v in grid.get(owner, ()))
            or any(PARTS[k][0] == owner for k in grid if k in PARTS))


def point_config(base, point):
    """The config of one grid ``point``: ``base`` with the point's ``SimConfig`` fields, then
    its :data:`PARTS` set on the config objects they belong to (the point's or the base's
    ``closed_loop``, ``disaggregation``, ``speculative``; a ``Disaggregation()`` of 1 + 1
    replicas where there is none; a closed loop or speculation where there is none from the
    point's parts alone, if they are enough to build one). ``rate`` and ``num_requests`` are
    the workload's (:func:`sim.tools.sweep_backends.run_point`)."""
    from ..engine.schedulers import override  # (a grid's kv_blocks replaces a base's utilization)
    config = override(base, **{k: v for k, v in point.items()
                               if k not in RESHAPE and k not in PARTS})
    parts = {}
    for k, v in point.items():
        if k in PARTS:
            owner, attr = PARTS[k]
            parts.setdefault(owner, {})[attr] = v
    if not parts:
        return config
    over = {}
    for owner, values in parts.items():
        given = getattr(config, owner)
        if given is not None:
            over[owner] = dataclasses.replace(given, **values)
            continue
        cls = _owner_class(owner)
        try:
            over[owner] = cls(**values)
        except TypeError:  # a required field the point does not give
            names = [k for k, (o, _) in PARTS.items() if o == owner and k in point]
            raise ValueError(f"{', '.join(names)} set(s) {owner}'s {sorted(values)}, but the "
                             f"base config has no {owner} and these alone cannot make one: "
                             f"give the base a {cls.__name__} ({_HOW[owner]})") from None
    return dataclasses.replace(config, **over)


_HOW = {"closed_loop": "sim run's closed_loop_users", "speculative": "a [speculative] table",
        "disaggregation": "prefill_replicas and decode_replicas"}


def _owner_class(owner):
    if owner == "closed_loop":
        from workloads import ClosedLoop
        return ClosedLoop
    if owner == "disaggregation":
        from ..engine.fleet.disaggregation import Disaggregation
        return Disaggregation
    from ..engine.speculation.settings import SpeculativeConfig
    return SpeculativeConfig


NAMED = ("model", "gpu", "draft_model")  # grid fields naming a preset (or a config.json)


def _check_names(point) -> None:
    """A point's model, GPU or draft model that is no preset (nor a model's config.json):
    a typo, refused before anything runs, not the error row of every point it is in."""
    from ..specs.gpus import get_gpu
    from ..specs.models import get_model
    for key in NAMED:
        if isinstance(point.get(key), str):
            (get_gpu if key == "gpu" else get_model)(point[key])


def _shown(point) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in point.items())


def check_grid_fields(grid, rows=None) -> None:
    """Check ``grid``'s fields (``SimConfig``'s, ``rate``/``num_requests``, or :data:`PARTS`; a
    misspelt one gets a did-you-mean), that each holds a non-empty list, ``rate`` > 0 and
    ``num_requests`` in 1..``rows`` (the workload's rows, when known)."""
    from ..checks import did_you_mean, positive_float, positive_int
    from ..engine import SimConfig
    if not isinstance(grid, dict) or not grid:
        raise ValueError(f"grid must be a non-empty dict of field -> list of values, got "
                         f"{grid!r}")
    fields = [f.name for f in dataclasses.fields(SimConfig)]
    known = fields + list(RESHAPE) + list(PARTS)
    unknown = sorted(set(grid) - set(known), key=str)
    if unknown:
        raise ValueError(f"grid field(s) {unknown} are neither SimConfig fields nor "
                         f"{RESHAPE} nor {sorted(PARTS)}{did_you_mean(unknown[0], known)}")
    for k, values in grid.items():
        if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__") or not len(
                values):
            raise ValueError(f"grid[{k!r}] must be a non-empty list of values, got {values!r}")
    for v in grid.get("rate", ()):
        positive_float("grid['rate']", v)
    for v in grid.get("num_requests", ()):
        n = positive_int("grid['num_requests']", v)
        if rows is not None and n > rows:
            raise ValueError(f"grid['num_requests'] {n} is more than the workload's {rows:,} "
                             f"requests")


def check_grid(workload, grid, base=None) -> list[dict]:
    """Every point of ``grid`` (field -> value dicts, in the sweep's order), all checked before
    anything runs: :func:`check_grid_fields` (with a DataFrame ``workload``'s rows; a function's
    are known only when it runs), then each point's ``dataclasses.replace(base, **fields)`` is
    built, so a bad value raises here, naming the grid point (so does a ``rate`` beside a
    ``closed_loop``, whose users ignore it). What fails only when a point runs
    (a model that does not fit its GPU) stays that point's error row."""
    from ..engine.config import as_config
    check_grid_fields(grid, None if callable(workload) else len(workload))
    base = as_config(base, "base")
    names = list(grid)
    points = [dict(zip(names, combo)) for combo in itertools.product(*grid.values())]
    for point in points:
        try:
            config = point_config(base, point)
            _check_names(point)
        except (ValueError, TypeError) as e:
            raise type(e)(f"grid point {_shown(point)}: {e}") from None
        if point.get("rate") is not None and config.closed_loop is not None:
            raise ValueError(f"grid point {_shown(point)}: rate applies to an open loop; with "
                             f"closed_loop={config.closed_loop!r} the users issue the requests "
                             f"as theirs finish, so every rate gives the same run (drop rate "
                             f"from the grid, or vary closed_loop instead)")
    return points

