"""The scheduler table: one line per name, and how a config's scheduler becomes a policy.

:data:`POLICIES` is the one table of named schedulers: our simple policies
(:mod:`sim.engine.core.policies`) and the engine presets (:mod:`sim.engine.presets`: vLLM,
Sarathi, Orca, SGLang, TensorRT-LLM). The CLI's
``--scheduler`` choices and help come from it. :func:`resolve` fills the knobs a config leaves
``None`` with the scheduler's defaults and builds the policy.
"""

from __future__ import annotations

import dataclasses
import functools

from ..checks import did_you_mean
from .core.policies import (ENGINE_DEFAULTS, KNOBS, ChunkedPrefill, ContinuousBatching,
                       StaticBatching)
from .presets.orca import Orca
from .presets.sarathi import Sarathi
from .presets.sglang import SGLang
from .presets.tensorrt_llm import TensorRTLLM
from .presets.vllm import VLLM

POLICIES = {
    "static": StaticBatching,
    "continuous": ContinuousBatching,
    "chunked": ChunkedPrefill,
    "vllm": VLLM,
    "sarathi": Sarathi,
    "orca": Orca,
    "sglang": SGLang,
    "tensorrt-llm": TensorRTLLM,
}


# knobs that size the KV pool from the memory budget: unused (not filled in) when kv_blocks
# gives the pool, and refused beside it (SimConfig), or when the pool is the cheat sheet's
# (SimConfig.pool_from_budget: given, one makes the pool the budget's)
POOL_SIZING = ("gpu_memory_utilization", "free_gpu_memory_fraction")
SIZING = ("kv_blocks", "kv_tokens") + POOL_SIZING  # the knobs that size the KV pool: one at a time


def _fill(config, defaults):
    unread = (config.kv_blocks is not None or config.kv_tokens is not None
              or not config.pool_from_budget())
    missing = {k: v for k, v in defaults.items()  # (a None default: the knob is unused)
               if v is not None and getattr(config, k) is None
               and not (k in POOL_SIZING and unread)}  # (a given or the cheat sheet's pool)
    return dataclasses.replace(config, **missing) if missing else config


RESOLVED_MAX = 4096  # configs whose resolution by a scheduler's name is kept
_RESOLVED = {}  # config -> (defaults filled, resolved), the oldest first


def resolve(config):
    """``(resolved config, policy)`` for ``config.scheduler``: a name in :data:`POLICIES` (its
    class's ``engine_defaults(config)`` fill the engine knobs left ``None``, then
    ``from_config`` builds the policy from the config's knobs) or an object with
    ``schedule(replica, now)`` (used as given; it carries its own settings).

    By a name, the resolved config is kept per config value (a config is frozen, and its
    resolution a function of its fields: each ``replace`` that fills a knob validates the new
    config, resolving it again, so a plan's candidates resolved ~9 times each); the policy is
    built anew each call (a policy keeps state over a run)."""
    scheduler = config.scheduler
    if isinstance(scheduler, str):
        cls = POLICIES.get(scheduler.strip().lower())
        if cls is None:
            raise ValueError(f"scheduler must be one of {sorted(POLICIES)} or a policy object, "
                             f"got {scheduler!r}")
        try:
            kept = _RESOLVED.get(config)
        except TypeError:  # (a field that does not hash: resolved each time)
            kept = False
        if kept:
            return kept[1], cls.from_config(kept[0])
        defaults = getattr(cls, "engine_defaults", None)
        filled = _fill(config, {**ENGINE_DEFAULTS, **(defaults(config) if defaults else {})})
        policy = cls.from_config(filled)
        knobs = getattr(policy, "knobs", None)
        resolved = filled if not knobs else _fill(  # record the policy knobs it uses (a
            filled, {k: v for k, v in knobs().items() if v is not None})  # None: its default)
        if kept is None:
            if len(_RESOLVED) >= RESOLVED_MAX:
                _RESOLVED.pop(next(iter(_RESOLVED)))
            _RESOLVED[config] = (filled, resolved)
        return resolved, policy
    if isinstance(scheduler, type) and callable(getattr(scheduler, "schedule", None)):
        raise TypeError(f"scheduler {scheduler.__name__} is a class: pass an instance, "
                        f"scheduler={scheduler.__name__}()")
    if not callable(getattr(scheduler, "schedule", None)):
        raise TypeError(f"scheduler must be a name in {sorted(POLICIES)} or have a "
                        f"schedule(replica, now) method, got {scheduler!r}")
    for knob in KNOBS:
        if getattr(config, knob) is not None:
            raise ValueError(f"{knob}={getattr(config, knob)!r} is set but scheduler is a "
                             f"policy object ({scheduler!r}), which carries its own settings")
    defaults = getattr(scheduler, "engine_defaults", None)
    return _fill(config, {**ENGINE_DEFAULTS, **(defaults(config) if defaults else {})}), scheduler


# sim run's settings that are no SimConfig field: where the API takes them
_LOAD = "the workload's: workloads.load(NAME, n=N, rate=R) or workloads.scale_to_rate(df, R)"
ELSEWHERE = {"rate": _LOAD, "n": _LOAD, "num_requests": _LOAD,
             "slo": "the summary's: result.summary(slo={'ttft': 2.0}) (sim.max_rate's too)"}


def unknown_fields(fields, given) -> str | None:
    """The message for the keywords of ``given`` that are not SimConfig ``fields`` (the first
    one's closest field, or where the API takes it), else None."""
    unknown = sorted(set(given) - set(fields))
    if not unknown:
        return None
    where = ELSEWHERE.get(unknown[0])
    return f"unknown SimConfig field(s) {unknown}" + (
        f": {unknown[0]} is {where}" if where else did_you_mean(unknown[0], fields))


def naming_unknown_fields(cls):
    """``cls`` (SimConfig) with an ``__init__`` whose error for an unknown keyword names the
    field meant (the dataclass's own says only that it is unexpected)."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except TypeError:
            fields = [f.name for f in dataclasses.fields(type(self))]
            message = unknown_fields(fields, kwargs)
            if message is None:
                raise
            raise TypeError(message) from None
    cls.__init__ = __init__
    return cls


def override(config, **over):
    """``dataclasses.replace(config, **over)``, where a knob that sizes the KV pool
    (``kv_blocks``, ``kv_tokens``, ``gpu_memory_utilization``, ``free_gpu_memory_fraction``)
    replaces the config's way of sizing it: the others, unless ``over`` sets them too, are
    cleared. So
    ``run(df, res.config, kv_blocks=500)``, a sweep's ``kv_blocks`` grid over a run's resolved
    config (its utilization filled in) or a disaggregated pool's own ``kv_blocks`` take the
    pool given, where ``replace`` would give a config that sets both (an error)."""
    message = unknown_fields([f.name for f in dataclasses.fields(config)], over)
    if message:  # replace's own error names the field but not the one meant
        raise TypeError(message)
    if any(k in over for k in SIZING):
        over = {**{k: None for k in SIZING}, **over}
    return dataclasses.replace(config, **over)
