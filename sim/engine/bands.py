"""Error bands: every latency and throughput of a run with the range the cost model's own
measured error implies (``run(..., bands=0.9)``).

Method. The cost model's step-time error on a GPU is taken from the measurements the fit held
out (``sim/data/roofline_fit.json``: ``latency_report`` and ``decode_report``, rows with split
``held-out`` - batch-1 TTFTs, decode steps, decode latencies and decode-throughput runs of
published tables, each a whole engine iteration). Each row gives a factor ``measured step /
predicted step`` (their ``error_pct`` is ``predicted / measured - 1`` on step time: a
throughput row's is inverted, so one sign means "too slow" everywhere). A GPU without held-out
rows of its own takes every GPU's rows and is marked ``assumed``. The central ``bands``
interval of those factors (quantiles ``(1 - bands) / 2`` and ``(1 + bands) / 2``, numpy's linear
method) gives two factors ``f_lo <= f_hi``; the same workload is run again twice, with every
iteration's price multiplied by ``f_lo`` and by ``f_hi`` (:class:`ScaledCost`: durations only,
deterministic; it keeps ``pure_decode_cost`` so fast-forward still applies). For each banded
metric ``m`` of the summary, ``m_lo`` and ``m_hi`` are the smallest and largest of the three
runs' values (a slower step gives higher latencies and lower throughput, so the ends are
ordered by value, and the point estimate always lies inside).

Why a rerun and not a sensitivity: near the knee a queue's waiting time grows as
``1 / (1 - load)``, so a few per cent on the step time moves the tail latencies by much more
than a few per cent; rerunning captures that non-linearity (and preemptions, admission), where
a first-order estimate would not. The band is the model's pricing error only: not the
scheduler's, the workload's or the engine behaviours the simulator does not model.

Invariants: ``bands=None`` changes nothing (no extra run, the summary bit-identical); the band
contains the point estimate; a band's two runs use the same workload, config and seed.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import replace
from importlib import resources

BANDED = ("ttft", "tpot", "itl", "e2e", "queueing_delay")  # <key>_mean and <key>_p<q>
THROUGHPUTS = ("request_throughput", "output_token_throughput", "total_token_throughput",
               "goodput")
REPORTS = ("latency_report", "decode_report")


def check_bands(value):
    """``value`` as a float in (0, 1), or None; anything else is a one-line error naming
    ``bands``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not 0 < value < 1 or math.isnan(value):
        raise ValueError(f"bands must be a central probability in (0, 1), e.g. 0.9, got "
                         f"{value!r}")
    return float(value)


def _rows() -> list:
    fit = json.loads(resources.files("sim").joinpath("data", "roofline_fit.json").read_text())
    seen, out = set(), []
    for report in REPORTS:
        for r in fit.get(report, ()):
            key = (r["metric"], r["gpu"], r["model"], r.get("tensor_parallel"),
                   r.get("batch_size"), r.get("input_tokens"), r.get("output_tokens"),
                   r["value"])
            if key not in seen and r.get("split") == "held-out" and r.get("error_pct") is not None:
                seen.add(key)  # (a row in both reports counts once)
                out.append((r["gpu"], 1.0 / (1.0 + r["error_pct"] / 100.0)))
    return out


def step_factors(gpu_key) -> tuple:
    """``(factors, assumed)``: the measured ``measured / predicted`` step-time ratios of
    ``gpu_key``'s held-out rows (sorted), or every GPU's with ``assumed`` True when it has
    none."""
    rows = _rows()
    own = sorted(f for g, f in rows if g == gpu_key)
    if own:
        return tuple(own), False
    return tuple(sorted(f for _, f in rows)), True


def band_factors(level: float, gpu_key) -> dict:
    """The step-time factors at the ends of the central ``level`` interval of ``gpu_key``'s
    measured errors: ``{"level", "gpu", "factor_lo", "factor_hi", "rows", "assumed"}``."""
    import numpy as np  # (not at import: the CLI's parser loads this module's check)
    factors, assumed = step_factors(gpu_key)
    lo, hi = np.quantile(np.asarray(factors), [(1 - level) / 2, (1 + level) / 2])
    return {"level": level, "gpu": gpu_key, "factor_lo": float(lo), "factor_hi": float(hi),
            "rows": len(factors), "assumed": assumed}


class ScaledCost:
    """``cost`` with every iteration's price multiplied by ``factor`` (> 0): a uniformly faster
    or slower GPU. Keeps ``pure_decode_cost`` (scaled alike) when ``cost`` has one."""

    def __init__(self, cost, factor: float):
        if not factor > 0:
            raise ValueError(f"factor must be > 0, got {factor!r}")
        self.cost, self.factor = cost, float(factor)
        from .core.batch import decode_pricer
        pricer = decode_pricer(cost)
        if pricer is not None:
            def pure_decode_cost(num_decodes, _f=self.factor):
                price = pricer(num_decodes)
                return lambda context_tokens: price(context_tokens) * _f
            self.pure_decode_cost = pure_decode_cost

    def __call__(self, batch) -> float:
        return self.cost(batch) * self.factor

    def __getattr__(self, name):  # the wrapped model's terms (gpu_key, cost_ratio, ...)
        if name in ("cost", "pure_decode_cost"):  # (never the unscaled decode price)
            raise AttributeError(name)
        return getattr(self.cost, name)

    def __repr__(self):
        return f"ScaledCost({self.cost!r}, {self.factor:.4g})"


def gpu_of(config) -> str | None:
    """The GPU key the band's errors are looked up by: the cost model's (the roofline's
    ``gpu_key``), else the config's GPU, else None (every GPU's rows, assumed)."""
    key = getattr(config.cost_model, "gpu_key", None)
    if key is None and config.gpu is not None:
        from ..costs.roofline import RooflineCost  # (the key the roofline would use)
        try:
            key = RooflineCost(config.model or "llama-3.1-8b", config.gpu).gpu_key
        except (KeyError, ValueError, TypeError):
            key = str(config.gpu).lower()
    if key is None and config.cost_model is None:
        key = "h100"  # the default roofline's GPU
    return key


def errors_label(config, info: dict) -> str:
    """Where the band's errors come from (the summary's ``bands_errors``): ``fitted`` (the
    roofline's held-out rows on this GPU) or ``assumed`` (the roofline on a GPU without rows:
    every GPU's) when the roofline prices the run; for a cost model of the user's own, which
    has no measured error here, ``assumed: the roofline's error on <GPU>`` (it was labelled
    ``fitted`` when the config named a checked GPU, as if the errors were the model's own)."""
    from ..costs.roofline import RooflineCost
    if config.cost_model is None or isinstance(config.cost_model, RooflineCost):
        return "assumed" if info["assumed"] else "fitted"
    from ..specs.gpus import get_gpu
    where = "every GPU it was checked on"
    if not info["assumed"]:
        try:
            where = get_gpu(config.gpu or info["gpu"]).name
        except (ValueError, TypeError):
            where = str(info["gpu"])
    return (f"assumed: the roofline's error on {where}, not {type(config.cost_model).__name__}'s "
            f"own")


def band_info(config) -> dict:
    """:func:`band_factors` of ``config``'s level and GPU (:func:`gpu_of`), with ``errors``:
    :func:`errors_label`."""
    info = band_factors(check_bands(config.bands), gpu_of(config))
    return dict(info, errors=errors_label(config, info))


def scaled_config(config, factor: float):
    """``config`` (bands off) pricing every iteration ``factor`` times as long: the target cost
    model wrapped in :class:`ScaledCost` (a speculative draft priced by its own roofline is
    not scaled)."""
    split = config.disaggregation
    own = sorted({k for pool in (split.prefill, split.decode) for k, _ in dict(pool).items()
                  if k in ("cost_model", "gpu", "tensor_parallel")}) if split is not None else []
    if own:
        raise ValueError(f"bands with disaggregated pools setting their own {', '.join(own)} "
                         f"is not supported: the band scales the run's one cost model (give "
                         f"both pools the run's GPU and cost model, or bands=None)")
    target = replace(config, speculative=None, bands=None).resolved_cost_model()
    return replace(config, bands=None, cost_model=ScaledCost(target, factor))


def banded_keys(summary: dict) -> list:
    """The summary's latency means and percentiles and its throughputs (the banded metrics)."""
    return [k for k, v in summary.items() if isinstance(v, float) and (
        k in THROUGHPUTS or any(k == f"{b}_mean" or k.startswith(f"{b}_p") for b in BANDED))]


class Bands:
    """A point run's band: the two scaled runs and the factors (:func:`band_factors`);
    :meth:`columns` gives ``<metric>_lo`` / ``<metric>_hi`` for a summary."""

    def __init__(self, info: dict, fast, slow):
        self.info, self.fast, self.slow = info, fast, slow

    def columns(self, point: dict, slo=None) -> dict:
        ends = (self.fast.summary(slo=slo), self.slow.summary(slo=slo))
        out = {"bands_level": self.info["level"], "bands_factor_lo": self.info["factor_lo"],
               "bands_factor_hi": self.info["factor_hi"],
               "bands_errors": self.info["errors"]}
        for key in banded_keys(point):
            values = [v for v in (point[key], ends[0].get(key), ends[1].get(key))
                      if isinstance(v, float) and v == v]
            out[f"{key}_lo"] = min(values) if values else float("nan")
            out[f"{key}_hi"] = max(values) if values else float("nan")
        return out


def run_banded(run, workload, config):
    """``run(workload, config)`` with its :class:`Bands` attached (``result.bands``; the
    summary then carries the ``_lo`` / ``_hi`` columns)."""
    info = band_info(config)
    fast_config, slow_config = (scaled_config(config, info[f]) for f in ("factor_lo",
                                                                          "factor_hi"))
    point = run(workload, replace(config, bands=None))
    fast, slow = run(workload, fast_config), run(workload, slow_config)
    point.bands = Bands(info, fast, slow)
    return point
