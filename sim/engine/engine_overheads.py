"""``SimConfig(engine_overheads=...)``: the engine's time the roofline does not price, as a run
setting (the terms: :mod:`sim.costs.overheads`).

Values: ``"none"`` (the default; ``None`` means the same): the engine's iterations alone, as
every run before this setting; ``"fitted"``: the preset engine's terms fitted on the ``fit``
split of ``sim/data/validation_runs.csv`` (``sim/data/engine_overheads.json``, written by
``experiments/fit_overheads.py``): ``sglang`` and ``vllm``. Any other scheduler with
``"fitted"`` is an error naming it: no measured terms exist for it and none is assumed (give an
:class:`~sim.costs.overheads.EngineOverheads` of your own instead); ``"auto"``: ``"fitted"``
where the scheduler has fitted terms, ``"none"`` (bit for bit) where it has not - the form a
default could take; or an ``EngineOverheads``.

One meaning everywhere (open loop, closed loop, replicas, disaggregation, bands):

- ``per_iter_s + per_seq_s x sequences``: every iteration is priced by
  :class:`~sim.costs.overheads.OverheadCost` around the run's cost model (GPU plus CPU in a
  synchronous loop, the longer of the two when overlapped); the error band's scaled runs
  scale the GPU's part only (:mod:`sim.engine.bands` scales the cost model, the CPU rule is
  applied after);
- ``prefill_host_layer_s`` x the run's model's layers, plus ``prefill_host_launch_s`` x one
  prefill forward's kernel launches of that model at the run's ``tensor_parallel`` and
  ``weight_dtype`` (:mod:`sim.specs.prefill_launches`): the least time an iteration holding
  prefill work takes (the host launching its forward; ``OverheadCost``'s ``layers`` and
  ``launches``);
- ``per_request_s`` (plus ``per_request_layer_s`` x the model's layers: the lag below is
  their sum): each request's time outside the iterations. The client sees every token
  and the end ``per_request_s`` later than the engine emits them (``Result.requests``'
  ``first_token_time``, ``finish_time``, ``ttft``, ``e2e`` and ``tpot_incl_ttft`` include it;
  ``tpot``, ITL and the queueing delay do not change), on top of any ``request_path``; in a
  closed loop a user sees its finish that much later, so it issues its next request
  ``think_time + per_request_s`` after the engine's finish (the shift:
  :func:`sim.engine.fleet.request_path.as_client_sees_lag`).

Invariants: ``"none"`` (and ``"auto"`` for a scheduler without fitted terms) is the run
without the setting, bit for bit (no wrapper, no shift, no summary key); with a setting the
summary says which (``engine_overheads``: ``"fitted (sglang)"`` or ``"given"``, and its four
terms ``engine_overhead_*``).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

from ..costs.overheads import EngineOverheads, OverheadCost, fitted_overheads

NAMES = ("none", "fitted", "auto")


@lru_cache(maxsize=None)
def _fitted(engine: str) -> EngineOverheads:
    return fitted_overheads(engine)


@lru_cache(maxsize=None)
def _fitted_engines() -> tuple:
    import json
    from importlib import resources
    data = resources.files("sim").joinpath("data/engine_overheads.json").read_text()
    return tuple(sorted(json.loads(data)["engines"]))


def _engine_name(scheduler) -> str | None:
    if isinstance(scheduler, str):
        return scheduler.strip().lower()
    return getattr(scheduler, "name", None)


def check_engine_overheads(value, scheduler):
    """``SimConfig``'s check: the normalised value (``"none"``, ``"fitted"`` or an
    ``EngineOverheads``); a one-line error naming the field and value otherwise."""
    if value is None:
        return "none"
    if isinstance(value, EngineOverheads):
        return value
    if not isinstance(value, str) or value.strip().lower() not in NAMES:
        raise ValueError(f"engine_overheads must be one of {', '.join(NAMES)} or a "
                         f"sim.EngineOverheads, got {value!r}")
    value = value.strip().lower()
    if value == "fitted":
        engine, fitted = _engine_name(scheduler), _fitted_engines()
        if engine not in fitted:
            raise ValueError(f"engine_overheads='fitted': scheduler {engine!r} has no fitted "
                             f"overheads (fitted: {', '.join(fitted)}): give its terms "
                             f"(a sim.EngineOverheads) or none")
    return value


def overheads_of(config) -> EngineOverheads | None:
    """The run's overheads; None for ``"none"`` (and ``"auto"`` without fitted terms)."""
    value = getattr(config, "engine_overheads", "none")
    if value == "none" or value is None:
        return None
    if value in ("fitted", "auto"):
        engine = _engine_name(config.scheduler)
        if value == "auto" and engine not in _fitted_engines():
            return None
        return _fitted(engine)
    return value


def _model(config):
    """The run's model (the roofline's model: ``SimConfig.model``, default ``llama-3.1-8b``)."""
    from ..specs.models import get_model
    from .pool_budget import DEFAULT_MODEL
    return get_model(config.model or DEFAULT_MODEL)


def _layers(config) -> int:
    """The run's model's layers."""
    return _model(config).num_hidden_layers


def _launches(config) -> int:
    """One eager prefill forward's kernel launches of the run's model at its tensor parallel
    and weight precision (:func:`sim.specs.prefill_launches.prefill_launches`)."""
    from ..specs.prefill_launches import prefill_launches
    return prefill_launches(_model(config), config.tensor_parallel, config.weight_dtype)


def _host_counts(config, ov) -> tuple:
    """``(layers, launches)`` of the run's model, each only where ``ov``'s floor of it is set
    (else None): what :class:`OverheadCost` and ``EngineOverheads.host_s`` take."""
    return (_layers(config) if ov.prefill_host_layer_s else None,
            _launches(config) if ov.prefill_host_launch_s else None)


def engine_cost(cost, config):
    """``cost`` with the run's per-iteration CPU time and prefill host time (``cost`` itself
    when there is none)."""
    ov = overheads_of(config)
    if ov is None or not ov.prices_steps:
        return cost
    return OverheadCost(cost, ov, *_host_counts(config, ov))


def lag_of(config) -> float:
    """The run's time per request outside the iterations (0.0 without overheads):
    ``per_request_s`` plus ``per_request_layer_s`` x the run's model's layers (the roofline's
    model: ``SimConfig.model``, default ``llama-3.1-8b``)."""
    ov = overheads_of(config)
    if ov is None:
        return 0.0
    if not ov.per_request_layer_s:
        return ov.per_request_s
    return ov.request_s(_layers(config))


def client_loop(config):
    """``config.closed_loop`` as the engine sees its users: ``think_time + per_request_s``
    between a finish and the next request (the loop itself when there is no lag)."""
    loop, lag = config.closed_loop, lag_of(config)
    if loop is None or not lag:
        return loop
    return dataclasses.replace(loop, think_time=float(loop.think_time) + lag)


def summary_keys(config) -> dict:
    """The summary's record of the setting; empty for ``"none"`` (so runs without it keep
    their summaries)."""
    ov = overheads_of(config)
    if ov is None:
        return {}
    given = config.engine_overheads
    return {"engine_overheads": (f"fitted ({_engine_name(config.scheduler)})"
                                 if given in ("fitted", "auto") else "given"),
            "engine_overhead_per_request_s": ov.per_request_s,
            "engine_overhead_per_iter_s": ov.per_iter_s,
            "engine_overhead_per_seq_s": ov.per_seq_s,
            "engine_overhead_overlap": ov.overlap,
            **({"engine_overhead_per_prefill_iter_s": ov.per_prefill_iter_s}
               if ov.per_prefill_iter_s else {}),
            **({"engine_overhead_prefill_host_layer_s": ov.prefill_host_layer_s}
               if ov.prefill_host_layer_s else {}),
            **({"engine_overhead_prefill_host_launch_s": ov.prefill_host_launch_s,
                "engine_overhead_prefill_launches": _launches(config)}
               if ov.prefill_host_launch_s else {}),
            **({"engine_overhead_prefill_host_s": ov.host_s(*_host_counts(config, ov))}
               if ov.prefill_host_layer_s or ov.prefill_host_launch_s else {}),
            **({"engine_overhead_per_request_layer_s": ov.per_request_layer_s,
                "engine_overhead_per_request_total_s": lag_of(config)}
               if ov.per_request_layer_s else {})}
