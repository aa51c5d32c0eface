"""Prefill/decode disaggregation: a prefill pool and a decode pool joined by KV-transfer links.

``SimConfig.disaggregation = Disaggregation(prefill_replicas=P, decode_replicas=D, ...)``: the
run's ``router`` sends each arriving request to a prefill replica (replicas ``0..P-1``), which
runs its prefill as in a colocated run (same policy, KV pool, preemption). When the prefill
completes (the iteration that computes the first token), the request leaves that replica's
batch but keeps its KV blocks; a second instance of the router (``random``: its own stream; a
callable router is called for both pools) picks a decode replica
(``P..P+D-1``; its load, ``ReplicaView.num_outstanding``, counts the requests routed to it
whose KV has not landed: ``Replica.num_incoming``); the KV of its ``num_computed`` tokens (``kv_cache_bytes`` of the model at the
run's ``kv_dtype`` on one GPU of the prefill replica's tensor-parallel group: each GPU sends
its shard over its own link, in parallel) crosses the prefill replica's link, then the
request decodes there.

- **Link**: one per prefill replica, FIFO: a transfer of ``b`` bytes occupies it
  ``b / bandwidth`` seconds after the transfers queued before it, and lands ``latency`` after
  that (the latency is pipelined: it does not hold the link). ``link_bandwidth_gbps``: GB/s per
  direction (1e9 bytes/s); default the GPU preset's scale-up link (NVLink: 450 GB/s on an
  H100); between pools of two GPU types (different machines: no NVLink spans them) the
  network, :func:`sim.specs.links.network_link_gbps`; ``math.inf`` makes the serialisation
  free.
- **Blocks on both sides**: the decode replica's blocks are taken (and a batch slot counted)
  when the transfer starts; the prefill replica frees its blocks when it lands.
- **Back-pressure**: a transfer starts only when the chosen decode replica has the blocks and a
  slot free; until then it waits in that replica's FIFO of pending transfers, retried each time
  one of its requests finishes. A request whose prompt + output could never fit a decode
  replica's pool is rejected at arrival (as for a colocated pool), as is one over
  ``max_model_len`` (that reason first: the server checks it). Nothing is lost.
- **First token**: the decode side streams it when the KV has landed (vLLM's disaggregated
  serving), so ``first_token_time`` = landing time: TTFT = arrival -> prefill done +
  ``kv_transfer_time`` (prefill done -> landed: back-pressure wait, link queue, bytes /
  bandwidth, latency). A one-token request finishes at its prefill (no transfer).
- Each pool is the run's config with its overrides (``prefill={...}``, ``decode={...}``: any of
  ``scheduler``, ``cost_model``, ``max_batch_size``, ``chunk_size``, ``token_budget``,
  ``kv_blocks``, ``gpu``, ``gpu_memory_utilization``, ``tensor_parallel``, the price and power
  terms ``usd_per_gpu_hour``, ``gpu_idle_watts``, ``gpu_max_watts``; one that sizes the
  KV pool replaces the run's way of sizing it: ``sim.engine.schedulers.override``); the model, block
  size and prefix caching are the run's (the KV and its block keys mean the same on both
  sides).

Invariants (tests/test_disaggregation.py): every request comes out once; with infinite
bandwidth and zero latency a request alone has exactly the colocated timings' TTFT; a
request's token gaps still sum to E2E - TTFT.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from dataclasses import dataclass
from functools import partial

import numpy as np

from ...checks import did_you_mean, positive_float, positive_int
from ...specs.replica_layout import replica_gpus

POOL_KNOBS = ("scheduler", "cost_model", "max_batch_size", "chunk_size", "token_budget",
              "kv_blocks", "kv_tokens", "gpu", "gpu_memory_utilization", "tensor_parallel",
              "free_gpu_memory_fraction", "enable_chunked_context", "capacity_scheduler_policy",
              "context_chunking_policy", "usd_per_gpu_hour", "gpu_idle_watts", "gpu_max_watts",
              "expert_parallel", "expert_skew")
# the other SimConfig fields: the same in both pools (a test keeps the two lists complete)
SHARED_KNOBS = ("block_size", "prefix_caching", "model", "max_model_len", "weight_dtype",
                "expert_weight_dtype", "attention_dp", "kv_dtype", "kv_offload", "lora",
                "speculative", "replicas", "router", "disaggregation", "closed_loop",
                "request_path", "seed", "progress", "check", "bands", "engine_overheads")


@dataclass(frozen=True, slots=True)
class Disaggregation:
    """Two pools and the link between them; see the module docstring."""

    prefill_replicas: int = 1
    decode_replicas: int = 1
    link_bandwidth_gbps: float | None = None  # GB/s per direction; None: the GPU's scale-up link
    link_latency_s: float = 0.0
    prefill: object = ()  # SimConfig overrides for the prefill pool (a dict)
    decode: object = ()

    def __post_init__(self):
        positive_int("prefill_replicas", self.prefill_replicas)
        positive_int("decode_replicas", self.decode_replicas)
        if self.link_bandwidth_gbps is not None and self.link_bandwidth_gbps != math.inf:
            positive_float("link_bandwidth_gbps", self.link_bandwidth_gbps)
        positive_float("link_latency_s", self.link_latency_s, allow_zero=True)
        for pool in ("prefill", "decode"):
            given = getattr(self, pool)
            items = tuple(sorted(dict(given or {}).items())) if isinstance(
                given, (dict, tuple)) else None
            if items is None:
                raise TypeError(f"{pool} must be a dict of SimConfig overrides, got {given!r}")
            bad = [k for k, _ in items if k not in POOL_KNOBS]
            if bad:
                if bad[0] not in SHARED_KNOBS:
                    raise ValueError(f"{pool}: unknown key {bad[0]!r}"
                                     f"{did_you_mean(bad[0], POOL_KNOBS)}; known: "
                                     f"{list(POOL_KNOBS)}")
                raise ValueError(f"{pool}: {bad[0]!r} cannot differ between pools; one of "
                                 f"{list(POOL_KNOBS)}")
            object.__setattr__(self, pool, items)  # hashable, like the rest of the config

    def pool_configs(self, config, shared=None):
        """``(prefill, decode)`` SimConfigs: ``config`` with each pool's replicas and
        overrides (validated as any config). ``shared``: the run's resolved config, whose
        ``block_size`` and ``prefix_caching`` both pools take; the knobs ``config`` leaves
        ``None`` take each pool's scheduler's defaults (an SGLang pool its own chunk size and
        batch size, whatever the run's scheduler). An error names the pool it is about."""
        same = {} if shared is None else {"block_size": shared.block_size,
                                          "prefix_caching": shared.prefix_caching}
        base = dataclasses.replace(config, disaggregation=None, replicas=1, **same)
        from ..schedulers import override  # (on use: as run_disaggregated imports resolve)
        pools = []
        for pool, n, over in (("prefill", self.prefill_replicas, self.prefill),
                              ("decode", self.decode_replicas, self.decode)):
            try:
                pools.append(override(base, replicas=n, **dict(over)))
            except (ValueError, TypeError) as e:  # (the run's knob, or the pool's own)
                raise type(e)(f"{pool}: {e}") from None
        return tuple(pools)

    def fleet(self, config) -> tuple:
        """``(replicas, GPUs)`` of both pools together. Read from the overrides, not by
        building each pool's config: ``config`` may be a run's resolved one (a Result's), whose
        filled-in knobs (the run's scheduler's chunk size) a pool's own scheduler refuses."""
        gpus = [replica_gpus(dict(over).get("tensor_parallel", config.tensor_parallel),
                             config.attention_dp) for over in (self.prefill, self.decode)]
        return (self.prefill_replicas + self.decode_replicas,
                self.prefill_replicas * gpus[0] + self.decode_replicas * gpus[1])

    def pool_gpus(self, config) -> tuple:
        """``(prefill, decode)`` GPU preset names (each pool's override, else the run's)."""
        from ...specs.gpus import get_gpu
        return tuple(get_gpu(dict(over).get("gpu") or config.resolved_gpu()).name
                     for over in (self.prefill, self.decode))

    def bandwidth_bytes(self, config) -> float:
        """Link bandwidth in bytes/s: the given figure, else between pools of two GPU types
        the network (:func:`sim.specs.links.network_link_gbps`), else the prefill GPU's
        scale-up link. ``config``: the run's (its GPU for a pool without one)."""
        if self.link_bandwidth_gbps is not None:
            return self.link_bandwidth_gbps * 1e9
        from ...specs.gpus import get_gpu
        from ...specs.links import network_link_gbps
        names = self.pool_gpus(config)
        if names[0] != names[1]:
            return network_link_gbps(*names) * 1e9
        gpu = get_gpu(names[0])
        if not gpu.link_bandwidth_gbps:
            raise ValueError(f"gpu {gpu.name!r} has no scale-up link in the presets: give "
                             f"Disaggregation(link_bandwidth_gbps=...)")
        return gpu.link_bandwidth_gbps * 1e9


class Link:
    """One FIFO link: ``send(now, nbytes)`` -> landing time (see the module docstring)."""

    __slots__ = ("bandwidth", "latency", "free_at")

    def __init__(self, bandwidth: float, latency: float):
        self.bandwidth, self.latency, self.free_at = bandwidth, latency, 0.0

    def send(self, now: float, nbytes: float) -> float:
        start = max(now, self.free_at)
        self.free_at = start + (nbytes / self.bandwidth if self.bandwidth != math.inf else 0.0)
        return self.free_at + self.latency


class Transfers:
    """Hands requests from the prefill pool to the decode pool (the hooks of both)."""

    def __init__(self, env, prefill, decode, disagg, model, bandwidth, kv_dtype="fp16"):
        from ...specs.memory import bytes_per_value, kv_cache_bytes, kv_cache_bytes_of
        from ...specs.models import get_model
        # (on use: the CLI's parser reads this module without SimPy)
        from ..core.events import Wakeup
        self.env, self.prefill, self.decode = env, prefill, decode
        self.tp = prefill.config.tensor_parallel
        kv_cache_bytes(0, model=model, dtype=kv_dtype, tensor_parallel=self.tp)  # (checked)
        # the KV bytes of n tokens on one GPU, kv_cache_bytes(n, model=...)'s factors read once
        # (a transfer per request)
        per_token = get_model(model).kv_cache_values_per_token(self.tp)
        self.kv_bytes = partial(kv_cache_bytes_of, values_per_token=per_token,
                                dtype=bytes_per_value("dtype", kv_dtype))
        self.links = [Link(bandwidth, float(disagg.link_latency_s)) for _ in prefill.replicas]
        self.pending = [deque() for _ in decode.replicas]
        self.in_flight = [0] * len(decode.replicas)
        self.retry = [False] * len(decode.replicas)
        # a decode replica's retry event (one at a time: retry[d]); a landing's, per transfer
        self.retry_events = [Wakeup(self._retry, d) for d in range(len(decode.replicas))]
        self.landing = partial(Wakeup, self._land)
        n = len(prefill.requests)
        self.prefill_done = np.full(n, np.nan)
        self.transfer_time = np.full(n, np.nan)
        self.decode_of = np.full(n, -1, dtype=np.int64)
        self.source = {}
        for k, rep in enumerate(prefill.replicas):
            rep.on_prefilled = self._hook(k)
        for k, rep in enumerate(decode.replicas):
            rep.on_finish = self._finished_hook(k, rep.on_finish)

    def close(self):
        """The environment has run: drop the events that refer back to this object (their
        bound methods), so that no reference cycle keeps the pools, and with them every
        request, alive until the cyclic garbage collector runs."""
        self.retry_events = self.landing = None

    def _hook(self, k):
        def prefilled(r, now):
            self.source[r.index] = k
            self.prefill_done[r.index] = now
            r.first_token_time = None  # the decode side streams it (see the docstring)
            d = self.decode.pick(r)
            self.decode_of[r.index] = d
            self.decode.replicas[d].num_incoming += 1  # its load, as a router counts it
            self.pending[d].append(r)
            self._start(d)
        return prefilled

    def _finished_hook(self, d, previous):
        def finished(r, now):
            if self.pending[d] and not self.retry[d]:  # once the replica has freed its blocks
                self.retry[d] = True                   # (after its postprocess): same instant
                self.env.wake(self.retry_events[d])
            if previous is not None:
                previous(r, now)
        return finished

    def _retry(self, event):
        d = event.value
        self.retry[d] = False
        self._start(d)

    def _start(self, d):
        """Start the pending transfers to decode replica ``d`` that fit, in order."""
        rep, queue = self.decode.replicas[d], self.pending[d]
        while queue:
            r = queue[0]
            if len(rep.running) + self.in_flight[d] >= rep.max_batch_size or not rep.reserve(
                    rep.blocks_of(r.num_computed)):
                return
            queue.popleft()
            self.in_flight[d] += 1
            now = self.env.now
            nbytes = self.kv_bytes(r.num_computed)
            landing = self.links[self.source[r.index]].send(now, nbytes)
            self.env.wake(self.landing((r, d)), landing - now)

    def _land(self, event):
        r, d = event.value
        now = self.env.now
        k = self.source.pop(r.index)
        self.prefill.replicas[k].release(r)
        self.prefill.processes[k].wake()  # it may wait for these blocks
        rep = self.decode.replicas[d]
        self.in_flight[d] -= 1
        rep.num_incoming -= 1
        rep.receive(r)
        r.first_token_time = now
        self.transfer_time[r.index] = now - self.prefill_done[r.index]
        self.decode.processes[d].wake()


def run_disaggregated(ctx):
    """Simulate ``config.disaggregation``'s two pools (each resolves the knobs ``ctx.given``
    leaves unset with its own scheduler)."""
    from .cluster import Cluster, concatenate, shift_segments, simulate
    from ..core.invariants import check_finished
    from ..core.records import build_result, offload_traffic
    from .routers import make_router
    from ..schedulers import resolve
    from ..engine_overheads import engine_cost
    env, requests, config = ctx.env, ctx.requests, ctx.config
    disagg = config.disaggregation
    pools = []
    for name, cfg in zip(("prefill", "decode"), disagg.pool_configs(ctx.given, shared=config)):
        try:  # (checked as late as a run's own pool: an error names its pool)
            cfg, policy = resolve(cfg)
            cost = engine_cost(cfg.resolved_cost_model(), cfg)  # (engine_overheads' CPU time)
            kv_blocks = cfg.resolved_kv_blocks()
        except (ValueError, TypeError) as e:
            raise type(e)(f"{name}: {e}") from None
        pools.append(Cluster(ctx, cfg, policy, cost, kv_blocks,
                             stream=sum(len(p.replicas) for p in pools)))
    prefill, decode = pools
    # its own instance of a named router, RoundRobin or Random (random: its own stream)
    decode.route = make_router(config.router, config.seed, stream=1)
    first = decode.replicas[0]
    prefill.max_tokens = (first.capacity_tokens, first.blocks.num_blocks)
    prefill.decode_lookahead = first.num_spec_tokens
    prefill.more_replicas = decode.replicas
    transfers = Transfers(env, prefill, decode, disagg, config.resolved_model(),
                          disagg.bandwidth_bytes(config), prefill.config.kv_dtype)
    simulate(env, config, prefill, decode,
             busy=lambda: any(transfers.pending) or bool(transfers.source),
             conversations=ctx.conversations, path=ctx.closed_path)
    transfers.close()
    if config.check:
        check_finished(requests, prefill.replicas + decode.replicas)
    # where each request's token runs were recorded: its decode replica once handed off
    num_prefill = len(prefill.replicas)
    moved = transfers.decode_of >= 0
    runs_at = np.where(moved, transfers.decode_of + num_prefill, prefill.replica_of)
    reps = prefill.replicas + decode.replicas
    records, counts, offsets, paused = concatenate(prefill.records + decode.records, reps)
    streamed = _trim_first_runs(requests, moved)  # (before the shift: a run may start at -1)
    shift_segments(requests, runs_at, offsets)
    first_gaps = _first_gaps(streamed, records, paused)
    kwargs = dict(wall_seconds=time.perf_counter() - ctx.wall, policy=prefill.processes[0].policy,
                  cost_model=prefill.processes[0].cost)
    res = build_result(requests, records, config, decode.replicas[0].blocks.num_blocks,
                       replicas=(runs_at, counts), first_gaps=first_gaps, paused=paused,
                       columns={"prefill_replica": prefill.replica_of,
                                "kv_transfer_time": transfers.transfer_time}, **kwargs)
    res.replica_pools = ([rep.blocks.num_blocks for rep in reps],
                         [rep.max_batch_size for rep in reps])
    return offload_traffic(res, reps)


def _trim_first_runs(requests, moved):
    """The first token of a handed-off request is streamed at landing, not at the end of an
    iteration: its first decode-side run ``(a, b)`` (``a``: the decode step before it joined,
    -1 when it joined before the replica's first step) becomes ``(a + 1, b)`` (dropped when
    empty). Returns the requests that emit after landing (their first segment is then the
    next token)."""
    out = []
    for r in requests:
        if not moved[r.index] or not r.segments:
            continue
        a, b = r.segments[0]
        r.segments = ([(a + 1, b)] if b > a else []) + r.segments[1:]
        if r.segments and r.first_token_time is not None:
            out.append(r)
    return out


def _first_gaps(streamed, records, paused):
    """``(request indices, gaps)``: for each request of ``streamed``, the gap from landing to
    its next token - the end of its first run's first decode step, or of the prefill-only
    iteration of a point ``(-1 - p, -1)`` (re-prefilled after a retraction) - for the ITL
    pool (the segments already in the concatenated numbering)."""
    from ..core.records import ITERATION_COLUMNS
    rec = np.frombuffer(records, dtype=np.float64).reshape(-1, len(ITERATION_COLUMNS)) \
        if len(records) else np.zeros((0, len(ITERATION_COLUMNS)))
    end = rec[:, 0] + rec[:, 1]
    end_steps = np.delete(end, np.asarray(paused, dtype=np.int64)) if paused else end
    idx = [r.index for r in streamed]
    gaps = [(end[-1 - a] if a < 0 else end_steps[a]) - r.first_token_time
            for r in streamed for a in (r.segments[0][0],)]
    return np.array(idx, dtype=np.int64), np.array(gaps, dtype=np.float64)
