"""Engine overheads the roofline does not price: per-request time outside the iterations, and
per-iteration time that grows with the batch.

Concept. A serving engine's step is the GPU's work (the roofline) plus the CPU's: scheduling,
input preparation, sampling, output processing, detokenising and streaming. Two terms:

- ``per_request_s``: time each request spends outside the engine's iterations, seen by the
  client on its first token and its end (API server, tokeniser, the hop to the scheduler,
  detokeniser, the stream): it shifts every TTFT and E2E by the same amount, changes no TPOT
  or ITL, and in a closed loop delays each client's next request by as much (the run applies
  it: ``SimConfig(engine_overheads=...)``, :mod:`sim.engine.engine_overheads`);
- ``per_request_layer_s``: the same shift, per layer of the run's model (a request pays
  ``per_request_s + per_request_layer_s x layers``). What the shift stands for at
  concurrency 1 grows with the model, not the request (``experiments/ttft_residual.py``: 0.06
  to 2.4 ms per layer once the sourced request path is taken off; the prefill forward outside
  CUDA graphs launches its kernels layer by layer); fitted, never sourced (no per-layer timing
  of those prefills is published);
- ``per_iter_s + per_seq_s x sequences``: the CPU time of one iteration over its sequences
  (decodes plus prefill chunks). A **synchronous** loop (``overlap=False``: vLLM without async
  scheduling) adds it to the GPU's time; an **overlapped** one (``overlap=True``: SGLang's
  overlap scheduler, vLLM's ``--async-scheduling``, TensorRT-LLM's overlap scheduler) prepares
  the next batch while the GPU runs this one, so the step is ``max(GPU, CPU)``: the CPU shows
  only once it is the longer of the two - the knee's second slope;
- ``per_prefill_iter_s``: a fixed time of every iteration that holds prefill work (one or
  more prefill chunks, however many), added to the GPU's time before the step rule (it is on
  the forward's critical path: an overlapped loop does not hide it). Not per request: a
  batch of 30 prefills pays it once, and every decode in that iteration and every request
  queued behind it waits for it. ``experiments/ttft_residual.py``: the first token's time the
  roofline misses at concurrency 1 is 58-111 ms per prefill iteration on B200 whatever the
  prompt (1,000 vs 8,000 tokens: the same intercept); fitted, never sourced (the fit keeps
  0 ms for both engines: what it gains on TTFT it loses on E2E, ITL P99 and throughput);
- ``prefill_host_layer_s``: the host's time per layer of the model to run the forward of an
  iteration that holds prefill work. Prefill iterations are not replayed from CUDA graphs: the
  host launches each layer's kernels one by one while the GPU runs those already launched, so
  such an iteration takes at least ``layers x prefill_host_layer_s`` however little the GPU
  has to do (the step is ``max(GPU, host)``, after ``per_prefill_iter_s``, before the CPU
  step rule). What it explains (``experiments/ttft_residual.py``): at concurrency 1 the
  measured first token has an intercept the roofline misses and a slope with the prompt
  flatter than the roofline's (the GPU's work hides behind the launches until it is the
  longer), and 100 clients see the first token of one. Fitted per engine, never sourced
  (no published per-layer launch timing of these prefills); needs the run's model (its
  layers: :class:`OverheadCost`'s ``layers``);
- ``prefill_host_launch_s``: the same floor counted in kernel launches instead of layers: a
  prefill iteration takes at least ``launches x prefill_host_launch_s``, ``launches`` the
  kernels one eager prefill forward of the run's model launches (SGLang's model files,
  counted per layer kind: :mod:`sim.specs.prefill_launches`), so a layer of an MLA, a Gated
  DeltaNet or a block-FP8 model, which launches more kernels, costs the host more than a
  dense GQA one. Both floors may be set (their times add). The time per launch is fitted per
  engine (no published timing); the counts are sourced (:class:`OverheadCost`'s
  ``launches``).

Invariants: :class:`OverheadCost` with zero terms prices every batch exactly as its base cost
model (bit for bit); the terms are non-negative; the fast-forward's ``pure_decode_cost`` is
kept when the base has one and equals pricing the same decode-only batch. Values: fitted on
the ``fit`` split of ``sim/data/validation_runs.csv`` by ``experiments/fit_overheads.py``
(``sim/data/engine_overheads.json``, :func:`fitted_overheads`; ``engine_overheads="fitted"``);
nothing here is default.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources

from ..checks import declared_with


def _nonneg(name, x) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {x!r}")
    return float(x)


@dataclass(frozen=True, slots=True)
class EngineOverheads:
    """One engine's overheads (see the module docstring); ``source`` says where they come from."""

    per_request_s: float = 0.0
    per_iter_s: float = 0.0
    per_seq_s: float = 0.0
    overlap: bool = False
    source: str = ""
    per_request_layer_s: float = 0.0
    per_prefill_iter_s: float = 0.0
    prefill_host_layer_s: float = 0.0
    prefill_host_launch_s: float = 0.0

    def __post_init__(self):
        for name in ("per_request_s", "per_iter_s", "per_seq_s", "per_request_layer_s",
                     "per_prefill_iter_s", "prefill_host_layer_s", "prefill_host_launch_s"):
            _nonneg(name, getattr(self, name))
        if not isinstance(self.overlap, bool):
            raise ValueError(f"overlap must be True or False, got {self.overlap!r}")

    def request_s(self, layers: int) -> float:
        """One request's time outside the iterations, for a model of ``layers`` layers."""
        return self.per_request_s + self.per_request_layer_s * layers

    def host_s(self, layers: int | None, launches: int | None) -> float:
        """A prefill forward's host time, the least a prefill iteration takes, for a model of
        ``layers`` layers and ``launches`` kernel launches (either None: its floor not set)."""
        return ((self.prefill_host_layer_s * layers if layers else 0.0)
                + (self.prefill_host_launch_s * launches if launches else 0.0))

    def cpu_s(self, num_seqs: int) -> float:
        """One iteration's CPU time over ``num_seqs`` sequences."""
        return self.per_iter_s + self.per_seq_s * num_seqs

    @property
    def prices_steps(self) -> bool:
        """Whether any term changes an iteration's price (else the base's price stands)."""
        return bool(self.per_iter_s or self.per_seq_s or self.per_prefill_iter_s
                    or self.prefill_host_layer_s or self.prefill_host_launch_s)

    def step_s(self, gpu_s: float, num_seqs: int) -> float:
        """The step: GPU plus CPU (synchronous) or the longer of the two (overlapped)."""
        if not (self.per_iter_s or self.per_seq_s):
            return gpu_s
        cpu = self.cpu_s(num_seqs)
        return max(gpu_s, cpu) if self.overlap else gpu_s + cpu


class OverheadCost:
    """``base`` (any cost model) with ``overheads``' per-iteration CPU time. Built on a base
    with a fast-forward pricer (``pure_decode_cost``, the engine's ``decode_pricer`` rule) it is
    a :class:`PureOverheadCost`, which keeps one. ``layers`` and ``launches``: the run's
    model's layers and one prefill forward's kernel launches, needed (only) when
    ``prefill_host_layer_s`` / ``prefill_host_launch_s`` is set: ``prefill_host_s`` is the
    host's time of such a forward, the least a prefill iteration takes."""

    def __new__(cls, base=None, overheads=None, layers=None, launches=None):  # (unpickling)
        if cls is OverheadCost and declared_with(base, "pure_decode_cost", "__call__"):
            cls = PureOverheadCost
        return object.__new__(cls)

    def __init__(self, base, overheads: EngineOverheads, layers: int | None = None,
                 launches: int | None = None):
        if not callable(base):
            raise TypeError(f"base must be a cost model callable(batch) -> seconds, got {base!r}")
        if not isinstance(overheads, EngineOverheads):
            raise TypeError(f"overheads must be an EngineOverheads, got {overheads!r}")
        for name, n in (("layers", layers), ("launches", launches)):
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
                raise ValueError(f"{name} must be an int >= 1, got {n!r}")
        if overheads.prefill_host_layer_s and layers is None:
            raise ValueError("prefill_host_layer_s needs the model's layers (OverheadCost(..., "
                             "layers=N)): the host's time is per layer")
        if overheads.prefill_host_launch_s and launches is None:
            raise ValueError("prefill_host_launch_s needs the model's prefill kernel launches "
                             "(OverheadCost(..., launches=N)): the host's time is per launch")
        self.base, self.overheads, self.layers, self.launches = base, overheads, layers, launches
        self.prefill_host_s = overheads.host_s(layers, launches)
        self.needs_decode_lengths = getattr(base, "needs_decode_lengths", False)

    def __call__(self, batch) -> float:
        gpu = self.base(batch)
        if batch.prefills:
            if self.overheads.per_prefill_iter_s:
                gpu += self.overheads.per_prefill_iter_s  # (the prefill iteration's fixed time)
            if gpu < self.prefill_host_s:  # the host's launches, the GPU behind them
                gpu = self.prefill_host_s
        return self.overheads.step_s(gpu, batch.num_decode_tokens + len(batch.prefills))

    def __repr__(self):
        return (f"{type(self).__name__}({self.base!r}, {self.overheads!r}, {self.layers!r}, "
                f"{self.launches!r})")


class PureOverheadCost(OverheadCost):
    """An :class:`OverheadCost` whose base prices pure decodes ahead (its fast-forward)."""

    def pure_decode_cost(self, num_decodes: int):
        """``f(context_tokens)``: the base's pure-decode price, then the step's CPU rule."""
        f, step = self.base.pure_decode_cost(num_decodes), self.overheads.step_s
        return lambda context_tokens: step(f(context_tokens), num_decodes)


def fitted_overheads(engine: str) -> EngineOverheads:
    """The overheads ``experiments/fit_overheads.py`` fitted for ``engine``."""
    data = json.loads(resources.files("sim").joinpath("data/engine_overheads.json").read_text())
    terms = data["engines"]
    if engine not in terms:
        raise ValueError(f"engine must be one of {sorted(terms)}, got {engine!r}")
    t = terms[engine]
    return EngineOverheads(per_request_s=t["per_request_s"], per_iter_s=t["per_iter_s"],
                           per_seq_s=t["per_seq_s"], overlap=t["overlap"],
                           per_request_layer_s=t.get("per_request_layer_s", 0.0),
                           per_prefill_iter_s=t.get("per_prefill_iter_s", 0.0),
                           prefill_host_layer_s=t.get("prefill_host_layer_s", 0.0),
                           prefill_host_launch_s=t.get("prefill_host_launch_s", 0.0),
                           source=data["source"])
