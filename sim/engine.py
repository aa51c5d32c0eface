"""The SimPy serving engine and ``run(workload, ...) -> Result``.

One SimPy environment; an arrival process feeds requests to one replica process. The replica
runs **one SimPy event per engine iteration**::

    batch = scheduler.schedule(state, now)      # form the batch (admit, allocate, preempt)
    dt = cost_model(batch)                      # price it
    yield env.timeout(dt)                       # the iteration runs
    state.postprocess(batch, env.now)           # emit tokens, finish, free blocks

and, with nothing to do, sleeps until the next arrival (open loop: arrivals due by each
iteration are pulled from the sorted workload; closed loop: the next issued request wakes it).
Token convention (vLLM): the iteration completing a prefill emits the first token, every later
iteration one more. ``run`` is pure: no files, no global state; same inputs, same output.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import pandas as pd
import simpy

from ._validate import positive_int
from .constants import CHUNK_SIZE, KV_BLOCK_SIZE, KV_BLOCKS_AVAILABLE
from .metrics import Result, build_result
from .replica import ReplicaState
from .request import Request
from .schedulers import ChunkedPrefill, make_scheduler


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything a run needs besides the workload; ``dataclasses.replace`` it for sweeps.

    ``kv_blocks=None``: derived from ``memory_budget(model, gpu)`` when both are given, else
    ``KV_BLOCKS_AVAILABLE``. ``cost_model=None``: the roofline model of ``model`` on ``gpu``
    (defaults: ``"llama-3.1-8b"`` on ``"h100"``).
    """

    scheduler: object = "chunked"
    cost_model: object = None
    max_batch_size: int = 256
    chunk_size: int = CHUNK_SIZE
    token_budget: int | None = None
    kv_blocks: int | None = None
    block_size: int = KV_BLOCK_SIZE
    model: object = None
    gpu: object = None
    gpu_memory_utilization: float = 0.9
    tensor_parallel: int = 1
    closed_loop: object = None  # workloads.ClosedLoop: issue on completions, not arrival_time
    seed: int = 0
    progress: bool = False

    def __post_init__(self):
        positive_int("max_batch_size", self.max_batch_size)
        positive_int("chunk_size", self.chunk_size)
        positive_int("block_size", self.block_size)
        positive_int("tensor_parallel", self.tensor_parallel)
        positive_int("seed", self.seed, allow_zero=True)
        if self.token_budget is not None:
            positive_int("token_budget", self.token_budget)
        if self.kv_blocks is not None:
            positive_int("kv_blocks", self.kv_blocks)
        policy = self.policy()
        if isinstance(policy, ChunkedPrefill) and policy.chunk_size < self.max_batch_size:
            raise ValueError(
                f"chunk_size ({policy.chunk_size}) must be >= max_batch_size "
                f"({self.max_batch_size}): every running decode needs one token of the budget "
                f"(vLLM's max_num_batched_tokens >= max_num_seqs)")
        if self.closed_loop is not None and not (hasattr(self.closed_loop, "num_users")
                                                 and hasattr(self.closed_loop, "think_time")):
            raise TypeError(f"closed_loop must be a workloads.ClosedLoop, got {self.closed_loop!r}")
        if self.cost_model is not None and not callable(self.cost_model):
            raise TypeError(f"cost_model must be callable(batch) -> seconds, got "
                            f"{self.cost_model!r}")

    def policy(self):
        return make_scheduler(self.scheduler, chunk_size=self.chunk_size,
                              token_budget=self.token_budget)

    def resolved_kv_blocks(self) -> int:
        if self.kv_blocks is not None:
            return self.kv_blocks
        if self.model is not None and self.gpu is not None:
            from .gpus import get_gpu
            from .memory import memory_budget
            budget = memory_budget(self.model, get_gpu(self.gpu).memory_gb,
                                   tensor_parallel=self.tensor_parallel,
                                   gpu_memory_utilization=self.gpu_memory_utilization,
                                   block_size=self.block_size)
            if not budget.fits:
                raise ValueError(f"model {self.model!r} on gpu {self.gpu!r}: {budget.advice}")
            return budget.kv_blocks
        return KV_BLOCKS_AVAILABLE

    def resolved_cost_model(self):
        if self.cost_model is not None:
            return self.cost_model
        from .roofline import RooflineCost
        return RooflineCost(self.model or "llama-3.1-8b", self.gpu or "h100",
                            tensor_parallel=self.tensor_parallel)


def _requests_from(workload):
    from workloads import from_records, validate
    if not isinstance(workload, pd.DataFrame):
        if isinstance(workload, (str, bytes)) or not hasattr(workload, "__iter__"):
            raise TypeError(f"workload must be a DataFrame or an iterable of request records, "
                            f"got {type(workload).__name__}")
        workload = from_records(workload)
    df = validate(workload)
    hashes = df["hash_ids"].tolist() if "hash_ids" in df.columns else [None] * len(df)
    reqs = [Request(i, rid, a, p, o, h) for i, (rid, a, p, o, h) in enumerate(zip(
        df["request_id"].tolist(), df["arrival_time"].tolist(), df["num_prompt_tokens"].tolist(),
        df["num_output_tokens"].tolist(), hashes))]
    return df, reqs


def run(workload, config: SimConfig | None = None, **overrides) -> Result:
    """Simulate ``workload`` (DataFrame or request records) and return a :class:`Result`.

    Settings come from ``config`` and/or keyword overrides of :class:`SimConfig` fields, e.g.
    ``run(df, scheduler="continuous", cost_model=LinearCost(...), max_batch_size=64)``.
    """
    config = dataclasses.replace(config or SimConfig(), **overrides) if overrides else (
        config or SimConfig())
    df, requests = _requests_from(workload)
    policy = config.policy()
    cost = config.resolved_cost_model()
    kv_blocks = config.resolved_kv_blocks()
    wall = time.perf_counter()
    env = simpy.Environment()
    state = ReplicaState(kv_blocks, config.block_size, config.max_batch_size)
    records = []
    replica = _Replica(env, state, policy, cost, records, config.progress, len(requests))
    if config.closed_loop is None:
        replica.arrivals = requests  # open loop: the replica pulls arrivals due by each iteration
    else:
        _ClosedLoopClients(env, state, requests, replica, config.closed_loop)
    env.process(replica.loop())
    env.run()
    replica.close()
    if len(state.finished) != len(requests):  # a bug, never a silent loss
        raise RuntimeError(f"{len(requests) - len(state.finished)} request(s) neither finished "
                           f"nor rejected")
    return build_result(requests, records, config, kv_blocks,
                        wall_seconds=time.perf_counter() - wall, policy=policy, cost_model=cost)


def _submit(state, replica, r, now) -> bool:
    """Queue an arriving request, or reject it when it could never fit; True if queued."""
    need = r.num_prompt_tokens + r.num_output_tokens
    if need > state.kv_blocks * state.block_size:
        state.reject(r, f"needs {-(-need // state.block_size)} KV blocks for "
                        f"{need} tokens but the pool has {state.kv_blocks}")
        return False
    state.waiting.append(r)
    replica.wake()
    return True


class _ClosedLoopClients:
    """Closed loop: ``num_users`` users; each issues the next request (in workload order)
    ``think_time`` after its previous one finished or was rejected. One event per request."""

    def __init__(self, env, state, requests, replica, loop):
        self.env, self.state, self.replica = env, state, replica
        self.pending = iter(requests)
        self.think = float(loop.think_time)
        state.on_finish = self._done
        for _ in range(int(loop.num_users)):
            self._issue()

    def _issue(self, _event=None):
        r = next(self.pending, None)
        if r is None:
            return
        r.arrival_time = self.env.now
        if not _submit(self.state, self.replica, r, self.env.now):
            self._done(r, self.env.now)

    def _done(self, r, now):
        if self.think > 0:
            self.env.timeout(self.think).callbacks.append(self._issue)
        else:
            self._issue()


class _Replica:
    """One serving replica: one SimPy process, one event per iteration.

    Open-loop arrivals are pulled, not pushed: before forming each batch the replica queues
    every request whose ``arrival_time`` has come (in order), and an idle replica sleeps until
    the next arrival. That is the same arrival process as one SimPy event per request, minus
    those events (measured: ~15% of the run time at 100k requests).
    """

    def __init__(self, env, state, policy, cost, records, progress, total):
        self.env, self.state, self.policy, self.cost = env, state, policy, cost
        self.records = records
        self.arrivals = ()
        self.idle = None
        self.bar = None
        if progress:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total, unit="req", desc="simulating", leave=False)

    def wake(self):
        if self.idle is not None and not self.idle.triggered:
            self.idle.succeed()

    def loop(self):
        env, state, policy, cost, records = self.env, self.state, self.policy, self.cost, \
            self.records
        append = records.append
        timeout = env.timeout
        arrivals = self.arrivals
        n_arrivals = len(arrivals)
        bar = self.bar
        nxt = 0
        while True:
            now = env.now
            while nxt < n_arrivals and arrivals[nxt].arrival_time <= now:
                _submit(state, self, arrivals[nxt], arrivals[nxt].arrival_time)
                nxt += 1
            if not state.has_work():
                if nxt < n_arrivals:
                    yield timeout(arrivals[nxt].arrival_time - now)
                else:
                    self.idle = env.event()
                    yield self.idle
                    self.idle = None
                continue
            state.num_preempted_now = 0
            batch = policy.schedule(state, now)
            if not batch.prefills and not batch.num_decode_tokens:
                raise RuntimeError(f"scheduler {policy!r} formed an empty batch with "
                                   f"{len(state.waiting)} waiting and {len(state.running)} running")
            dt = cost(batch)
            if not dt >= 0 or dt == math.inf:
                raise ValueError(f"cost model returned {dt!r} seconds for {batch!r}")
            append((now, dt, len(state.running), len(state.waiting), batch.num_prefill_tokens,
                    batch.num_decode_tokens, state.kv_blocks - state.free_blocks,
                    state.num_preempted_now))
            yield timeout(dt)
            state.postprocess(batch, env.now)
            if bar is not None and not state.iteration & 1023:
                bar.n = len(state.finished)
                bar.refresh()

    def close(self):
        if self.bar is not None:
            self.bar.n = len(self.state.finished)
            self.bar.close()


__all__ = ["SimConfig", "run", "Result"]
