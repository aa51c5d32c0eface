"""A cluster: ``SimConfig.replicas`` replicas behind a router, in one SimPy environment.

Each replica is the single-replica engine's process
(:class:`~sim.engine.core.process.ReplicaProcess`: one event per iteration, its own policy object,
KV pool and iteration records); only the arrivals differ. A dispatcher wakes once per distinct
arrival time and hands every request due to the replica the router picks (``route(request, views,
now) -> index``, :mod:`sim.engine.fleet.routers`), where it is queued (or rejected, when it could
never fit that replica's pool) and an idle replica is woken. The dispatcher's events are scheduled
with SimPy's URGENT priority, so an arrival at ``t`` is routed before any replica forms its batch at
``t``: the single replica's rule (it pulls every arrival with ``arrival_time <= now``), and a router
sees each replica as it stands at the arrival (an iteration ending at ``t`` not yet post-processed).
Closed loop: each user's next request is routed when it is issued.

A named scheduler is built once per replica; so is a policy object of a named scheduler's
class (a copy per replica: SGLang keeps per-replica state, its ``new_token_ratio`` and chunked
request); any other policy object is shared by all of them (``schedule(replica, now)`` receives
the replica: it must keep no per-replica state).

A policy that pauses the decodes (``pauses_decodes``: SGLang's prefill-only iterations) runs on
each replica's decode clock: that replica's token runs count its decode steps and its first
tokens of prefill-only iterations are points in iteration units (:mod:`sim.engine.core.decoding`).
The records are concatenated replica by replica, so a run is shifted by the decode steps of
the replicas before it and a point by their iterations; the paused iterations, renumbered the
same way, are removed from the end times of the steps (``build_result(paused=...)``).

Invariants (tests/test_cluster.py):
- every request is routed exactly once, at its arrival, and comes out once (finished or
  rejected) at the replica it was routed to (over ``max_model_len``: rejected there at once,
  as each replica's server would);
- a request's token runs (``segments``) index its replica's decode steps (its iterations
  unless the policy pauses decodes): the records are concatenated replica by replica and the
  runs shifted by the replica's offsets, so ITL is computed exactly as for one replica (the gap
  across two replicas' records has weight 0);
- with one replica the cluster path gives the single-replica result (tested), and
  ``run`` keeps the single-replica path for ``replicas == 1``.
"""

from __future__ import annotations

import copy
import math
import time
from array import array
from dataclasses import dataclass

import numpy as np

from ..core.batch import make_batch
from ..core.events import URGENT, Wakeup, delay_until
from ..core.invariants import check_finished
from ..core.fastforward import can_fast_forward
from ..core.process import ReplicaProcess, reject_too_long, submit
from ..core.records import (ITERATION_COLUMNS, build_result, gc_frozen, offload_traffic,
                            release)
from ..core.replica import Replica
from ..kv.layer_groups import LayerPool
from ..kv.lora import adapter_slots
from ..kv.offload import KVTier, OffloadTier
from ..kv.tiers import KVTierChain, TierChain
from ..pool_budget import layer_pool_fields
from ..schedulers import POLICIES, resolve
from ..speculation.acceptance import make_drawer
from ..engine_overheads import client_loop
from .clients import ClosedLoopClients
from .routers import ReplicaView, make_router
from ...results.metrics import KV_POOL




@dataclass(slots=True)
class RunContext:
    """One run as every runner gets it (``simulation.run`` makes it once): the environment,
    the requests, the settings resolved (``given``: as the user gave them, for the pools of a
    disaggregated run to resolve their own), the policy, cost model and KV pool size of the
    run's scheduler, the wall clock at the start and what the workload sets (``cache_unit``,
    ``max_model_len``: ``simulation.cache_unit``, ``context_limit``; ``conversations``: a
    closed loop's turns; ``closed_path``: its request path)."""

    env: object
    requests: list
    config: object
    given: object
    policy: object
    cost: object
    kv_blocks: int
    wall: float
    cache_unit: int | None = None
    max_model_len: int | None = None
    conversations: object = None
    closed_path: object = None  # a closed loop's request path (request_path.ClosedPath)


class Cluster:
    """The replicas, their processes, the router and where each request went."""

    def __init__(self, ctx, config, policy, cost, kv_blocks, stream=0):
        # config, policy, cost, kv_blocks: the pool's (a disaggregated run's pools differ)
        env = self.env = ctx.env
        self.requests = ctx.requests
        n = config.replicas
        self.replicas, self.processes, self.records = [], [], []
        for k in range(n):
            pol = policy if k == 0 else replica_policy(config, policy)
            rep = new_replica(config, pol, kv_blocks, ctx.cache_unit, stream + k,  # its own
                              ctx.max_model_len)  # draws
            rec = array("d")
            proc = ReplicaProcess(env, rep, pol, cost, rec, False, 0)
            proc.check = config.check
            self.replicas.append(rep)
            self.processes.append(proc)
            self.records.append(rec)
        self.config = config
        self.views = tuple(ReplicaView(rep, k) for k, rep in enumerate(self.replicas))
        self.route = make_router(config.router, config.seed)
        self.replica_of = np.full(len(ctx.requests), -1, dtype=np.int64)
        self.max_tokens = None  # disaggregation: (tokens, blocks) a decode replica can hold
        self.decode_lookahead = 0  # disaggregation: a decode replica's speculative slots
        self.more_replicas = ()  # disaggregation: the decode pool (closed-loop completions)
        self.bar = None
        if config.progress:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=len(ctx.requests), unit="req", desc="routing", leave=False)
        self._dispatch = None  # the dispatcher's event (open loop): one arrival time at a time

    def pick(self, r) -> int:
        """The replica the router picks for ``r`` now (checked)."""
        k = self.route(r, self.views, self.env.now)
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) \
                or not 0 <= k < len(self.replicas):
            raise ValueError(f"router {self.route!r} returned {k!r} for {r!r}; expected a "
                             f"replica index in 0..{len(self.replicas) - 1}")
        return int(k)

    def submit(self, r) -> bool:
        """Route ``r`` now and queue it there (or reject it); True if queued."""
        k = self.pick(r)
        self.replica_of[r.index] = k
        if self.bar is not None:
            self.bar.update(1)
        need = r.num_prompt_tokens + r.num_output_tokens + self.decode_lookahead
        if self.max_tokens is not None and need > self.max_tokens[0]:
            if not reject_too_long(self.replicas[k], r):  # (the server's check comes first)
                self.replicas[k].reject(r, f"{KV_POOL}: needs {need} tokens of KV but a decode "
                                           f"replica's pool holds {self.max_tokens[0]} "
                                           f"({self.max_tokens[1]} blocks)")
            return False
        return submit(self.replicas[k], self.processes[k], r)

    def open_loop(self, fast_forward=None):
        """Route each request at its ``arrival_time`` (requests sorted by arrival);
        ``fast_forward`` (the engine's ``can_fast_forward``): the replicas it allows
        fast-forward their pure-decode stretches up to the next arrival (a router then reads
        each as stepping would leave it: no request starts or ends within a stretch, and its
        iterations' blocks are those reserved by then)."""
        self._next = 0
        if fast_forward is not None:
            for proc, rep in zip(self.processes, self.replicas):
                if fast_forward(proc.policy, rep):
                    proc.fast_forward = True
                    proc.next_arrival = self.next_arrival
        if self.requests:
            self._dispatch = Wakeup(self._arrive)
            self.env.wake(self._dispatch, delay_until(self.env.now,
                                                      self.requests[0].arrival_time),
                          priority=URGENT)

    def next_arrival(self) -> float:
        """When the dispatcher routes next (infinity once every request is routed)."""
        i = self._next
        return self.requests[i].arrival_time if i < len(self.requests) else math.inf

    def _arrive(self, _event):
        # (bound methods, not closures that refer to themselves: no reference cycle keeps
        # the cluster and its requests alive after the run)
        arrivals, now = self.requests, self.env.now
        i, n = self._next, len(arrivals)
        i += 1  # the one this event was scheduled for: due (delay_until)
        self.submit(arrivals[i - 1])
        while i < n and arrivals[i].arrival_time <= now:
            self.submit(arrivals[i])
            i += 1
        self._next = i
        if i < n:
            self.env.wake(self._dispatch, delay_until(now, arrivals[i].arrival_time),
                          priority=URGENT)

    def closed_loop(self, loop, conversations=None, path=None):
        """``num_users`` users; each issues its next request (or turn of ``conversations``)
        ``think_time`` after the last finished or was rejected, routed when it reaches the
        engine (at once, or through ``path``: :mod:`sim.engine.fleet.clients`)."""
        ClosedLoopClients(self.env, self.replicas + list(self.more_replicas), self.requests,
                          self.submit, loop, conversations, path)

    def start(self):
        for proc in self.processes:
            proc.start()

    def close(self):
        """The environment has run: close the bar and each replica process (which breaks
        the cycles that would keep every request alive until a garbage collection)."""
        if self.bar is not None:
            self.bar.close()
        self._dispatch = None
        for proc in self.processes:
            proc.close()

    def num_out(self) -> int:
        return sum(len(rep.finished) for rep in self.replicas)

    def result(self, config, kv_blocks, *, wall_seconds, policy, cost_model):
        return assemble(self.requests, self.records, self.replicas, self.replica_of, config,
                        kv_blocks, wall_seconds=wall_seconds, policy=policy,
                        cost_model=cost_model)


def new_replica(config, policy, kv_blocks, cache_unit=None, stream=0,
                max_model_len=None) -> Replica:
    """A replica as ``config`` sets it up, run by ``policy`` (its victim rule; its decodes
    paused on demand if it pauses them), drawing speculative emissions from ``stream``;
    ``max_model_len``: the limit its arrivals are checked against (None: no check, as when no
    request of the run exceeds it: ``simulation.context_limit``); the policy's optional
    ``reject_reason(r)`` checks them next (:mod:`sim.engine.core.policies`)."""
    rep = Replica(kv_blocks, config.block_size, config.max_batch_size,
                  getattr(policy, "select_victim", None), prefix_caching=config.prefix_caching,
                  cache_unit=cache_unit, speculative=config.speculative,
                  draw=make_drawer(config, stream), clip_left=getattr(policy, "clip_left", None),
                  offload=offload_tier(config, policy, cache_unit), layers=layer_pool(config))
    if config.lora is not None:  # LoRA adapters: slots, loads (kv.lora)
        rep.use_lora(adapter_slots(config))
    rep.on_demand_decodes = bool(getattr(policy, "pauses_decodes", False))
    rep.max_model_len = max_model_len
    rep.reject_reason = getattr(policy, "reject_reason", None)  # the policy's arrival check
    return rep


def layer_pool(config):
    """A replica's :class:`~sim.engine.kv.layer_groups.LayerPool` as its model's layer kinds
    set it (:func:`~sim.engine.pool_budget.layer_pool_fields`), None: the plain pool."""
    fields = layer_pool_fields(config)
    return None if fields is None else LayerPool(**fields)


# a request whose blocks land from a tier continues its prefill as a running partial prefill,
# which these never schedule: they prefill a prompt whole at admission (static, continuous,
# orca; sglang continues landed ones as it does its chunked request: presets.sglang)
_NO_LANDING_POLICIES = ("static", "continuous", "orca")


def offload_tier(config, policy=None, cache_unit=None):
    """A replica's :class:`~sim.engine.kv.offload.OffloadTier` or
    :class:`~sim.engine.kv.tiers.TierChain` as ``config.kv_offload`` sets it (None without),
    its blocks priced at the model's KV bytes per GPU; under the radix cache a
    :class:`~sim.engine.kv.radix_tiers.RadixTierChain` of nodes of ``cache_unit`` tokens."""
    if config.kv_offload is None:
        return None
    if config.prefix_caching not in ("block", "radix"):
        raise ValueError(f"kv_offload needs prefix_caching='block' or 'radix', got "
                         f"prefix_caching={config.prefix_caching!r}")
    if getattr(policy, "name", None) in _NO_LANDING_POLICIES or getattr(
            policy, "enable_chunked_context", True) is False:  # (tensorrt-llm's default)
        raise ValueError(f"kv_offload needs a scheduler that continues partial prefills "
                         f"(vllm, chunked, sarathi, sglang, tensorrt-llm with "
                         f"enable_chunked_context), got scheduler={policy.name!r}")
    from ...specs.memory import kv_cache_bytes
    block = kv_cache_bytes(config.block_size, model=config.resolved_model(),
                           dtype=config.kv_dtype, tensor_parallel=config.tensor_parallel)
    setting = config.kv_offload
    if config.prefix_caching == "radix":  # SGLang HiCache: the tiers hold radix nodes
        from ..kv.radix_tiers import RadixTierChain
        unit = cache_unit or config.block_size
        chain = setting if isinstance(setting, KVTierChain) else KVTierChain((setting,))
        return RadixTierChain(chain, block * unit / config.block_size, unit, config.block_size,
                              prefill_pricer(config) if chain.layer_overlap else None)
    if getattr(setting, "prefetch_policy", None) is not None:
        raise ValueError("kv_offload.prefetch_policy needs prefix_caching='radix' (HiCache's), "
                         f"got prefix_caching={config.prefix_caching!r}")
    if isinstance(setting, KVTier) and setting.eviction == "lru":
        return OffloadTier(setting, block)
    if isinstance(setting, KVTier):  # ARC: a one-tier chain
        setting = KVTierChain((setting,))
    return TierChain(setting, block, config.block_size,
                     prefill_pricer(config) if setting.layer_overlap else None)


def prefill_pricer(config):
    """``(r, tokens) -> seconds``: the GPU time of ``r``'s next ``tokens`` prompt tokens (after
    the rest of its prompt, cached) in a batch of their own, by the run's cost model (a layer-
    wise overlapped load hides under it: kv.radix_tiers)."""
    cost = config.resolved_cost_model()

    def price(r, tokens):
        if tokens <= 0:
            return 0.0
        return cost(make_batch(-1, ((tokens, r.prefill_target - tokens),), tokens, 0, 0))
    return price


def replica_policy(config, policy):
    """The policy of a replica after the first: a named scheduler built anew, a copy of a
    policy object of a named scheduler's class (its state is per replica), else ``policy``
    itself (shared)."""
    if isinstance(config.scheduler, str):
        return resolve(config)[1]
    if type(policy) in POLICIES.values():
        return copy.deepcopy(policy)
    return policy


def concatenate(records_per_replica, replicas):
    """``(records, iterations per replica, offsets, paused)``: the replicas' flat iteration
    records one after another (replica ``k``'s iteration ``j`` becomes ``offsets[k][0] + j``,
    its decode step ``j`` becomes ``offsets[k][1] + j``) and every replica's paused iterations
    in that numbering; each replica's buffer is emptied once copied."""
    records, counts, offsets, paused = array("d"), [], [], []
    width = len(ITERATION_COLUMNS)
    steps = 0
    for rec, rep in zip(records_per_replica, replicas):
        first = len(records) // width
        offsets.append((first, steps))
        counts.append(len(rec) // width)
        records.extend(rec)
        release(rec)  # copied: not held twice
        paused.extend(first + p for p in rep.paused)
        steps += counts[-1] - len(rep.paused)
    return records, counts, offsets, paused


def shift_segments(requests, runs_at, offsets):
    """Renumber each request's token runs from its replica's decode steps (``runs_at[index]``:
    that replica) to the concatenated records': a run ``(a, b)`` by the replica's step offset,
    a point ``(-1 - p, -1)`` (a first token of prefill-only iteration ``p``) by its iteration
    offset."""
    for r in requests:
        first, steps = offsets[runs_at[r.index]]
        if (first or steps) and r.segments:
            r.segments = [(a + steps, b + steps) if a >= 0 else (a - first, b)
                          for a, b in r.segments]


def assemble(requests, records_per_replica, replicas, replica_of, config, kv_blocks,
             **kwargs):
    """Concatenate the replicas' iteration records (replica by replica), shift each
    request's token runs to that numbering, and build the Result."""
    records, counts, offsets, paused = concatenate(records_per_replica, replicas)
    shift_segments(requests, replica_of, offsets)
    return offload_traffic(build_result(requests, records, config, kv_blocks,
                                        replicas=(replica_of, counts), paused=paused,
                                        **kwargs), replicas)


def simulate(env, config, entry, *others, busy=False, fast_forward=None,
             conversations=None, path=None) -> None:
    """Run the environment: arrivals (open or closed loop) enter at ``entry``, every pool's
    replicas run; raise if a request was neither finished nor rejected (a bug, never a silent
    loss; ``busy``: some other work was left behind). ``fast_forward``: see
    :meth:`Cluster.open_loop` (open loop only); ``conversations``, ``path``: a closed loop's
    (:func:`~sim.engine.fleet.clients.conversations`, ``request_path.ClosedPath``)."""
    if config.closed_loop is None:
        entry.open_loop(fast_forward)
    else:
        entry.closed_loop(client_loop(config), conversations, path)
    for pool in (entry, *others):
        pool.start()
    with gc_frozen():  # the requests are not traversed by the loop's collections
        env.run()
    for pool in (entry, *others):
        pool.close()
    lost = len(entry.requests) - sum(pool.num_out() for pool in (entry, *others))
    if lost or busy and busy():
        raise RuntimeError(f"{lost} request(s) neither finished nor rejected")


def run_cluster(ctx: RunContext) -> "Result":
    """Simulate ``config.replicas`` replicas behind ``config.router``."""
    config = ctx.config
    cluster = Cluster(ctx, config, ctx.policy, ctx.cost, ctx.kv_blocks)
    simulate(ctx.env, config, cluster, fast_forward=can_fast_forward,
             conversations=ctx.conversations, path=ctx.closed_path)
    if config.check:
        check_finished(ctx.requests, cluster.replicas)
    return cluster.result(config, ctx.kv_blocks, wall_seconds=time.perf_counter() - ctx.wall,
                          policy=ctx.policy, cost_model=ctx.cost)
