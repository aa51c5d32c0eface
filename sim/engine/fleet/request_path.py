"""The request path: a request's time outside the engine, between the client and the engine.

A client sends a request at ``a``; the front end (HTTP or gRPC, JSON, the tokeniser, the hop to
the engine) hands it to the engine later, and each token the engine emits reaches the client
later still. ``SimConfig(request_path=RequestPath(...))`` adds that time to what the client
sees while the engine schedules as it would on its own clock. The model, per request ``i`` in
workload order (prompt ``p_i``):

- **in**: a pure delay ``in_s`` (transport and framing: no queue, every request the same);
- **tokeniser**: one first-come-first-served server taking ``per_prompt_token_s * p_i``: the
  engine receives the request at ``e_i = max(a_i + in_s, e_{i-1}) + per_prompt_token_s * p_i``
  (one tokeniser, as in vLLM's API server process, SGLang's tokenizer manager by default or a
  Triton preprocessing model with one instance); at the sources' rates (about 1 us a token) it
  queues only when requests come a millisecond apart or closer;
- **out**: a pure delay ``out_s`` on every token and on the end of the request as the client
  receives them.

Invariants: the engine runs the workload with arrival times ``e`` (non-decreasing, as ``a`` is,
so the order is kept): its iterations and its schedule are those of that workload.
``Result.requests`` is the client's view: ``arrival_time`` is ``a``, ``engine_arrival_time``
is ``e``, ``first_token_time`` and ``finish_time`` are the engine's plus ``out_s``, so a
finished request's ``ttft`` and ``e2e`` are the engine's plus ``e_i - a_i + out_s``; ``tpot``,
the inter-token gaps and ``queueing_delay`` (first scheduled minus ``e``, the engine's queue)
are unchanged. A path of zeros is no path: the run is the one without, bit for bit.

In a closed loop (:class:`ClosedPath`, driven by :mod:`sim.engine.fleet.clients`) the client
times are made during the run: a user issues at ``a`` (``env.now``), the same queue gives ``e``
(``e = max(a + in_s, e_prev) + s``, requests taken in the order they are issued), the engine
receives the request at ``e``, and the user sees its finish (or its rejection) ``out_s`` after
the engine's: its next request is issued then, plus its think time (and gap) as without a path.
The client's view of the Result is the open loop's (``arrival_time`` = ``a``,
``engine_arrival_time`` = ``e``); a turn abandoned by its conversation never reaches the engine
(both times are the moment the client gave it up).

Sourced values: :func:`triton_path` from ``sim/data/request_overheads.csv``, whose rows give the
measurements, their sources and which were fitted or held out (:func:`overheads`,
:func:`held_out_errors`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from importlib import resources

import numpy as np
import pandas as pd

from ..engine_overheads import lag_of

COLUMNS = ("front_end", "version", "component", "measured", "value", "unit", "tokens",
           "bytes_per_token", "split", "source")
COMPONENTS = ("round_trip", "tokenize", "context")
SPLITS = ("fit", "held-out", "context")
_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


@dataclass(frozen=True, slots=True)
class RequestPath:
    """Seconds outside the engine (see the module docstring): ``in_s`` before the tokeniser,
    ``per_prompt_token_s`` per prompt token in the tokeniser, ``out_s`` on every token's way
    back. Each a finite number >= 0."""

    in_s: float = 0.0
    per_prompt_token_s: float = 0.0
    out_s: float = 0.0

    def __post_init__(self):
        for name in ("in_s", "per_prompt_token_s", "out_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"request_path.{name} must be a number of seconds, got "
                                f"{value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"request_path.{name} must be a finite number of seconds "
                                 f">= 0, got {value!r}")
            object.__setattr__(self, name, float(value))

    @property
    def is_zero(self) -> bool:
        return not (self.in_s or self.per_prompt_token_s or self.out_s)


def check_request_path(path) -> None:
    """``SimConfig``'s check: a :class:`RequestPath` or None."""
    if path is not None and not isinstance(path, RequestPath):
        raise TypeError(f"request_path must be a sim.RequestPath or None, got {path!r}")


class ClosedPath:
    """A closed loop's request path (module docstring): the one tokeniser's queue, fed in the
    order the users issue, and each request's client issue time (``client``, by request
    index) for :func:`as_client_sees`."""

    __slots__ = ("in_s", "per_prompt_token_s", "out_s", "client", "free")

    def __init__(self, path: RequestPath, n: int):
        self.in_s, self.per_prompt_token_s, self.out_s = (path.in_s, path.per_prompt_token_s,
                                                          path.out_s)
        self.client = np.full(n, np.nan)
        self.free = -math.inf  # when the tokeniser finishes the request before

    def issue(self, r, now) -> float:
        """``r`` issued by its user at ``now``: the time the engine receives it."""
        self.client[r.index] = now
        start = now + self.in_s
        if not self.per_prompt_token_s:
            return start
        e = self.free = max(start, self.free) + self.per_prompt_token_s * r.num_prompt_tokens
        return e

    def gave_up(self, r, now) -> None:
        """``r`` abandoned by its client at ``now`` (never sent)."""
        self.client[r.index] = now


def engine_arrivals(arrival, num_prompt_tokens, path: RequestPath) -> np.ndarray:
    """When the engine receives each request: ``e_i = max(a_i + in_s, e_{i-1}) + s_i`` with
    ``s_i = per_prompt_token_s * p_i``, in closed form (the queue's departure times:
    ``e_i = S_i + max_{j <= i} (a_j + in_s - S_{j-1})``, ``S`` the cumulative service)."""
    start = np.asarray(arrival, dtype=np.float64) + path.in_s
    if not path.per_prompt_token_s:
        return start
    service = path.per_prompt_token_s * np.asarray(num_prompt_tokens, dtype=np.float64)
    done = np.cumsum(service)
    return done + np.maximum.accumulate(start - (done - service))


def enter(requests, path, closed=False):
    """Move each request's ``arrival_time`` to when the engine receives it; returns the
    client's arrival times (workload order), or None when there is no path to take; in a
    closed loop (``closed``) a :class:`ClosedPath` for the users to take, times unset."""
    if path is None or path.is_zero:
        return None
    if closed:
        return ClosedPath(path, len(requests))
    client = np.fromiter((r.arrival_time for r in requests), np.float64, len(requests))
    prompts = np.fromiter((r.num_prompt_tokens for r in requests), np.float64, len(requests))
    for r, e in zip(requests, engine_arrivals(client, prompts, path).tolist()):
        r.arrival_time = e
    return client


def as_client_sees(result, client, path):
    """``result`` (built on the engine's arrivals) in the client's view (module docstring);
    unchanged when :func:`enter` returned None."""
    if client is None:
        return result
    if isinstance(client, ClosedPath):
        client = client.client
    req = result.requests
    engine = req["arrival_time"].to_numpy()
    req["arrival_time"] = client
    req.insert(req.columns.get_loc("arrival_time") + 1, "engine_arrival_time", engine)
    delay_client_view(req, path.out_s)
    return result


def as_client_sees_lag(result, config):
    """``result`` with every token and end ``engine_overheads``' ``per_request_s`` later
    (:mod:`sim.engine.engine_overheads`); unchanged without that time."""
    lag = lag_of(config)
    if lag:
        delay_client_view(result.requests, lag)
    return result


def delay_client_view(req, out_s) -> None:
    """Every first token and end of ``req`` (a result's requests frame) ``out_s`` seconds
    later, and TTFT, E2E and TPOT-with-TTFT recomputed from its ``arrival_time`` (the
    client's): what a client sees of time spent outside the engine on the way back."""
    done = (req["status"] == "finished").to_numpy()
    arrival = req["arrival_time"].to_numpy()
    first = req["first_token_time"].to_numpy() + out_s
    finish = req["finish_time"].to_numpy() + out_s
    req["first_token_time"], req["finish_time"] = first, finish
    req["ttft"] = np.where(done, first - arrival, np.nan)
    e2e = np.where(done, finish - arrival, np.nan)
    req["e2e"] = e2e
    req["tpot_incl_ttft"] = np.where(done, e2e / req["num_output_tokens"].to_numpy(), np.nan)


def overheads() -> pd.DataFrame:
    """``request_overheads.csv``, checked, with ``seconds``: each row's value as seconds per
    request (``round_trip``) or per token (``tokenize``; MB/s through ``bytes_per_token``);
    NaN for ``context`` rows, which no model uses."""
    with resources.files("sim").joinpath("data", "request_overheads.csv").open() as f:
        rows = pd.read_csv(f)
    missing = [c for c in COLUMNS if c not in rows.columns]
    if missing:
        raise ValueError(f"request_overheads.csv lacks columns {missing}")
    seconds = []
    for i, r in rows.iterrows():
        where = f"request_overheads.csv row {i}"
        if r.component not in COMPONENTS or r.split not in SPLITS:
            raise ValueError(f"{where}: component {r.component!r} or split {r.split!r} unknown")
        if (r.split == "context") != (r.component == "context"):
            raise ValueError(f"{where}: only context rows are split 'context'")
        if not isinstance(r.source, str) or ("http" not in r.source and "#" not in r.source):
            raise ValueError(f"{where}: source {r.source!r} names no URL, issue or pull request")
        if not r.value > 0:
            raise ValueError(f"{where}: value {r.value!r} must be > 0")
        seconds.append(_seconds(r, where))
    return rows.assign(seconds=seconds)


def _seconds(r, where) -> float:
    if r.component == "context":
        return math.nan
    if r.component == "round_trip":
        if r.unit not in _SECONDS:
            raise ValueError(f"{where}: a round trip in {r.unit!r} (give us, ms or s)")
        return r.value * _SECONDS[r.unit]
    if r.unit == "MB/s":
        if not r.bytes_per_token > 0:
            raise ValueError(f"{where}: a throughput in MB/s needs bytes_per_token")
        return r.bytes_per_token / (r.value * 1e6)
    if r.unit not in _SECONDS or not r.tokens > 0:
        raise ValueError(f"{where}: a tokenisation time needs a unit of us, ms or s and its "
                         f"tokens, got {r.unit!r} and {r.tokens!r}")
    return r.value * _SECONDS[r.unit] / r.tokens


def triton_path(rows: pd.DataFrame | None = None) -> RequestPath:
    """Triton's front end from the ``fit`` rows: the mean client round trip of a trivial model
    through Triton (gRPC, one request at a time), split evenly between ``in_s`` and ``out_s``
    (the sources time the round trip, not its halves), and the fast tokenizer's time per token
    as ``per_prompt_token_s`` (Triton's TensorRT-LLM ensemble tokenises in its preprocessing
    model with transformers' AutoTokenizer). Whether a client sends text (tokenised) or token
    ids (not) is the user's to know."""
    rows = overheads() if rows is None else rows
    fit = rows[rows["split"] == "fit"]
    trip = fit[(fit["front_end"] == "triton") & (fit["component"] == "round_trip")]["seconds"]
    tok = fit[(fit["front_end"] == "hf-tokenizers") & (fit["component"] == "tokenize")]
    if trip.empty or tok.empty:
        raise ValueError("request_overheads.csv has no fit rows for Triton's round trip or the "
                         "fast tokenizer")
    half = float(trip.mean()) / 2
    return RequestPath(in_s=half, per_prompt_token_s=float(tok["seconds"].mean()), out_s=half)


FRONT_ENDS = {"sglang": "SGLang's TokenizerManager (one process)",
              "vllm": "vLLM's API server process"}


def front_end_path(engine: str, rows: pd.DataFrame | None = None) -> RequestPath:
    """An engine's own front end (``"sglang"``, ``"vllm"``: :data:`FRONT_ENDS`) from the
    ``fit`` rows: one tokeniser at the fast tokenizer's time per token (both tokenise the
    prompt with transformers' AutoTokenizer in the one process that feeds the scheduler);
    ``in_s = out_s = 0`` (no source times these front ends' round trips: Triton's are
    Triton's)."""
    if engine not in FRONT_ENDS:
        raise ValueError(f"engine must be one of {', '.join(FRONT_ENDS)}, got {engine!r}")
    rows = overheads() if rows is None else rows
    tok = rows[(rows["split"] == "fit") & (rows["front_end"] == "hf-tokenizers")
               & (rows["component"] == "tokenize")]
    if tok.empty:
        raise ValueError("request_overheads.csv has no fit rows for the fast tokenizer")
    return RequestPath(per_prompt_token_s=float(tok["seconds"].mean()))


def held_out_errors(path: RequestPath | None = None, rows: pd.DataFrame | None = None):
    """Each held-out row beside the model's value (``triton_path`` unless given): the round
    trip ``in_s + out_s``, or ``per_prompt_token_s``; signed error = model / measured - 1."""
    rows = overheads() if rows is None else rows
    path = triton_path(rows) if path is None else path
    out = rows[rows["split"] == "held-out"].copy()
    out["model_seconds"] = np.where(out["component"] == "round_trip", path.in_s + path.out_s,
                                    path.per_prompt_token_s)
    out["error"] = out["model_seconds"] / out["seconds"] - 1.0
    return out[["front_end", "component", "measured", "seconds", "model_seconds", "error",
                "source"]]
