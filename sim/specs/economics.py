"""What a GPU costs to rent and the power it draws: the data behind a run's dollars and joules.

Prices (``sim/data/gpu_prices.csv``): on-demand list prices from named public price lists, one
row per (GPU, provider, instance type) with the instance's $/hour, its GPUs, the source and the
date it was seen (``sim/data/NOTICE.md``). The row marked ``default`` is the GPU's price: one
provider where it lists the GPU (RunPod Secure Cloud lists the A100, H100, H200, B200 and
MI300X presets at one time, so they compare like for like), another where not (the L40S).
:func:`gpu_price` gives ``usd_per_instance_hour / gpus_per_instance``; a GPU without a sourced
row (a GPU preset added later, a custom :class:`~sim.specs.gpus.GPU`) has no price: ``None``,
never a guess. Keyed by the GPU's name, so a new preset simply has no price until one is
sourced.

Power (:func:`gpu_power`): a GPU draws ``idle_watts`` when no iteration runs and
``idle + active_fraction x (max - idle)`` while one does; ``max_watts`` is the board's TDP
(``sim/data/gpus.csv``'s ``tdp_w``, vendor datasheets). ``idle_watts`` is the measured idle
draw where ``sim/data/gpu_power.csv`` has one (the H200), else the TDP times the measured
GPUs' idle/TDP ratio (``idle_source`` says which). ``active_fraction``
(:data:`ACTIVE_FRACTION`) is fitted, not chosen: the mean over the CSV's ``fit`` rows of
``(measured - idle) / (TDP - idle)`` (an H200 serving a batch of 128 with vLLM drew 516.9 W:
0.705); the other rows are held out (``tests/test_economics.py`` reports both).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from .gpus import get_gpu


@dataclass(frozen=True, slots=True)
class Price:
    """One row of the price table: ``usd_per_gpu_hour`` = instance price / its GPUs."""

    gpu: str
    provider: str
    instance_type: str
    usd_per_instance_hour: float
    gpus_per_instance: int
    region: str
    default: bool
    source: str
    seen: str

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_instance_hour / self.gpus_per_instance


@dataclass(frozen=True, slots=True)
class PowerTerms:
    """A GPU's power model: watts idle, at its TDP, and the fitted share of the range it draws
    while an iteration runs (see the module docstring); NaN where unknown."""

    idle_watts: float
    max_watts: float
    active_fraction: float
    idle_source: str = ""

    @property
    def busy_watts(self) -> float:
        return self.idle_watts + self.active_fraction * (self.max_watts - self.idle_watts)


def _csv(name) -> list[dict]:
    return list(csv.DictReader(resources.files("sim").joinpath(f"data/{name}").read_text()
                               .splitlines()))


@lru_cache(maxsize=1)
def price_table() -> tuple:
    """Every row of ``gpu_prices.csv`` as a :class:`Price`, in the file's order."""
    return tuple(Price(gpu=r["gpu"], provider=r["provider"], instance_type=r["instance_type"],
                       usd_per_instance_hour=float(r["usd_per_instance_hour"]),
                       gpus_per_instance=int(r["gpus_per_instance"]), region=r["region"],
                       default=r["default"] == "1", source=r["source"], seen=r["seen"])
                 for r in _csv("gpu_prices.csv"))


def _name(gpu) -> str:
    return get_gpu(gpu).name.lower()


def gpu_price(gpu) -> Price | None:
    """The default price row of ``gpu`` (a preset name or a GPU); None when none is sourced."""
    name = _name(gpu)
    return next((p for p in price_table() if p.default and p.gpu.lower() == name), None)


@lru_cache(maxsize=1)
def _tdp() -> dict:
    return {r["gpu"].lower(): float(r["tdp_w"]) for r in _csv("gpus.csv") if r.get("tdp_w")}


@lru_cache(maxsize=1)
def power_rows() -> tuple:
    """``gpu_power.csv``'s rows (measurements: idle watts, watts under load, J per token)."""
    return tuple(_csv("gpu_power.csv"))


@lru_cache(maxsize=1)
def _idle() -> dict:
    return {r["gpu"].lower(): float(r["value"]) for r in power_rows() if r["kind"] == "idle"}


def idle_ratio() -> float:
    """Measured idle watts / TDP, averaged over the GPUs with a measured idle draw."""
    ratios = [w / _tdp()[g] for g, w in _idle().items()]
    return sum(ratios) / len(ratios)


def _fit_active_fraction() -> float:
    out = []
    for r in power_rows():
        if r["kind"] == "power" and r["use"] == "fit":
            g = r["gpu"].lower()
            idle, tdp = _idle()[g], _tdp()[g]
            out.append((float(r["value"]) - idle) / (tdp - idle))
    return sum(out) / len(out)


ACTIVE_FRACTION = _fit_active_fraction()


def gpu_power(gpu, max_watts=None) -> PowerTerms:
    """The power terms of ``gpu``: NaN watts for a GPU without a TDP in ``gpus.csv``.
    ``max_watts``: the TDP to use instead (an unmeasured idle draw then scales with it)."""
    name = _name(gpu)
    tdp = _tdp().get(name, math.nan) if max_watts is None else max_watts
    if name in _idle():
        idle, source = _idle()[name], "measured"
    else:
        idle, source = tdp * idle_ratio(), "tdp x measured idle/TDP ratio"
    return PowerTerms(idle_watts=idle, max_watts=tdp, active_fraction=ACTIVE_FRACTION,
                      idle_source=source)


def check_power(gpu, idle_watts=None, max_watts=None) -> None:
    """A ``ValueError`` naming the setting when the idle draw (``idle_watts``, else the GPU's)
    is above the board power (``max_watts``, else its TDP): a busy GPU would draw less than an
    idle one. Nothing to check where either is unknown (NaN)."""
    terms, name = gpu_power(gpu, max_watts), get_gpu(gpu).name
    idle = terms.idle_watts if idle_watts is None else idle_watts
    if not idle > terms.max_watts:  # (NaN: unknown)
        return
    if idle_watts is None:
        raise ValueError(f"gpu_max_watts {max_watts:g} W is below the {name} idle draw "
                         f"{idle:g} W ({terms.idle_source}): a GPU draws at least its idle "
                         f"power when busy")
    top = (f"gpu_max_watts={max_watts:g} W" if max_watts is not None else
           f"the {name} TDP {terms.max_watts:g} W")
    raise ValueError(f"gpu_idle_watts {idle:g} W is above {top}: a GPU draws at least its "
                     f"idle power when busy")
