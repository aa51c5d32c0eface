"""The SimPy serving engine and ``run(workload, config) -> Result``.

One SimPy environment (:class:`sim.engine.core.events.Environment`); one replica process running
**one SimPy event per engine iteration**, at most::

    batch = replica.form_batch(policy.schedule, now)
        # reserve the decodes' KV blocks (preempting if short), let the policy add prefill
        # work through the replica's verbs, snapshot the batch (immutable)
    dt = cost_model(batch)               # price it
    if not env.sleep(dt, wakeup): yield  # the iteration runs (SimPy's Timeout(dt), in place)
    replica.postprocess(env.now)         # emit tokens, finish, free blocks

The replica's generator is resumed by its own pre-made event (:class:`~sim.engine.core.events.
Wakeup`), scheduled where SimPy's ``Timeout``, succeeded ``Event`` or ``Process`` start would
be: the same order of events, no SimPy object per iteration. When no other event is scheduled
(one replica in an open loop pulls its arrivals, so it is alone in the environment), the
process does not yield at all: ``env.sleep`` sets the clock to ``now + dt`` and the loop goes
on, which is what SimPy's ``step`` would do next with that timeout the only event - no other
process could act before it, and the clock reads the same float. The same for its sleep until
the next arrival and a fast-forwarded stretch's end. Measured: 7-12 % of a saturated
replica's run time.

With nothing to do the replica sleeps until the next arrival (open loop: arrivals due by each
iteration are pulled from the sorted workload; closed loop: the next issued request wakes it).

**Fast-forward** (:mod:`sim.engine.core.fastforward`): stretches of pure-decode iterations run in
one event, priced and recorded one by one, results bit-identical: in an open loop up to the
next arrival; in a closed loop up to the users' next issue (``env.peek()``) and the first
iteration finishing decodes, finished by the loop at its end (the users' hooks issue then).

Token convention (vLLM): the iteration completing a prefill emits the first token, every later
iteration one more (:mod:`sim.engine.core.decoding`). ``run`` is pure: no files, no global state;
same inputs, same output, bit for bit. Every request comes out once, finished or rejected with
a reason; a request lost is a bug and raises. Rejected at arrival
(:func:`~sim.engine.core.process.submit`), in this order:
a request whose prompt + output tokens exceed ``max_model_len`` (the model's context length
unless set: vLLM's OpenAI server refuses prompt + max_tokens > max_model_len before the
scheduler sees it - vllm-project/vllm@7ded96b3, vllm/entrypoints/openai/serving_engine.py,
``_validate_input`` - and SGLang's tokenizer manager input + max_new_tokens > context_len -
sgl-project/sglang@001067ff, python/sglang/srt/managers/tokenizer_manager.py,
``_validate_one_request``; the workload's output length is the request's max_tokens), then one
the policy refuses (its optional ``reject_reason(r)``: the tensorrt-llm preset's prompt over
``max_num_tokens`` without chunked context), then one that could never fit the KV pool. An
empty batch raises (a policy must make progress), unless its forming preempted running
requests: the iteration is then formed anew,
those preemptions recorded in the one that runs, as long as each round leaves fewer running.

**Runners.** ``run`` resolves the settings once into a
:class:`~sim.engine.fleet.cluster.RunContext` and hands it to one of three runners:
:func:`run_replica` (one replica), :func:`~sim.engine.fleet.cluster.run_cluster` (replicas
behind a router) or :func:`~sim.engine.fleet.disaggregation.run_disaggregated` (two pools).
One replica keeps a runner of its own, not a cluster of one, because that is slower: the
cluster's dispatcher wakes once per arrival, so the replica no longer pulls its arrivals and is
never alone in the environment (every iteration yields to SimPy), and a closed loop's
stretches are not fast-forwarded. Measured on the chunked benchmark scenario (50k requests,
CPU time, 7 alternated pairs): a cluster of one took 1.078x the single replica's median (same
checksum), past the 3 % the engine may lose.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from array import array
from functools import partial

import numpy as np
import pandas as pd

from ..results.metrics import Result
from .bands import run_banded
from .config import SimConfig, as_config
from .core.events import Environment
from .core.fastforward import can_fast_forward
from .core.invariants import check_finished
from .core.process import ReplicaProcess, submit
from .core.records import build_result, gc_frozen, gc_paused, offload_traffic
from .core.columns import make_requests
from .engine_overheads import client_loop, engine_cost
from .kv.lora import assign_adapters
from .fleet.clients import ClosedLoopClients, conversations
from .fleet.sessions import gap_turns
from .fleet.cluster import RunContext, new_replica, run_cluster
from .fleet.disaggregation import run_disaggregated
from .fleet.request_path import as_client_sees, as_client_sees_lag, enter
from .schedulers import override, resolve


SEED_UNUSED = ("seed={seed} changes nothing: the engine draws at random only for speculative "
               "decoding and the random router over replicas; a workload's own draws take its "
               "generator's seed (workloads.load(..., seed=), workloads.synthetic(..., seed=))")


ROUTER_UNUSED = ("router={router!r} routes nothing: there is one replica (give replicas=N, "
                 "N >= 2, or drop the router)")
EPOCH_S = 1e8  # a first arrival past ~3 years: a timestamp, not a trace's own clock
MS_GAP = 50.0  # integer times this far apart (median gap, s): milliseconds, likely
DRAWN_GAPS = 1e3  # a drawn first arrival past this many mean gaps: exp(-1000), never
RESOLUTION_S = 1e-6  # float64's spacing at the last arrival beyond this: latencies lose digits


def arrival_warning(t, rate=None) -> str | None:
    """What looks wrong with the arrival times ``t`` (seconds, sorted or not), or None: epoch
    stamps (a first arrival past ``EPOCH_S``), milliseconds read as seconds (integers with a
    median gap of ``MS_GAP`` s or more, not evenly spaced), or times so large (a rate of
    1e-300 req/s) that float64 cannot resolve a microsecond there, so TTFT, ITL and E2E read
    as 0. ``rate``: the rate a generator drew them at (``attrs["arrival_rate"]``), whose
    first arrival past ``EPOCH_S`` is no timestamp when within ``DRAWN_GAPS`` mean gaps (at
    1e-9 req/s it comes at ~1e9 s; 1e9 s added to arrivals drawn at 7 req/s still warns)."""
    t = np.asarray(t, dtype=np.float64)
    if not len(t):
        return None
    first, last = float(t.min()), float(t.max())
    if first > EPOCH_S and not (rate and first * rate <= DRAWN_GAPS):
        unit = "milliseconds" if first > EPOCH_S * 1e3 else "seconds"
        return (f"arrival times start at {first:.6g} s: they look like epoch timestamps (in "
                f"{unit} since 1970); give them from the first request (arrival_time - its "
                f"minimum{', / 1000' if unit == 'milliseconds' else ''})")
    if float(np.spacing(last)) > RESOLUTION_S:
        return (f"arrival times reach {last:.3g} s, where float64 resolves only "
                f"{float(np.spacing(last)):.2g} s: TTFT, ITL and E2E below that read as 0 (a "
                f"rate so small it spreads the requests over {last:.3g} s?)")
    gaps = np.diff(np.sort(t))
    gaps = gaps[gaps > 0]
    if (len(gaps) >= 10 and np.all(t == np.floor(t)) and float(np.median(gaps)) >= MS_GAP
            and float(np.ptp(gaps)) > 0):  # (evenly spaced: requests spaced on purpose)
        return (f"arrival times are whole numbers {float(np.median(gaps)):g} s apart (median): "
                f"they look like milliseconds read as seconds; divide them by 1000 if so")
    return None


def _requests_from(workload, block_size=None, mode="block", speculative=True):
    """Validated DataFrame and Request objects; ``block_size`` (prefix caching on): each
    request with ``hash_ids`` gets the keys of its full prompt blocks (``mode="radix"``: of its
    hash ids' prefixes, the radix tree's nodes), and with a ``session_id`` column the keys its
    answer is cached under when it finishes (``output_keys``: named by its conversation's next
    turn, whose prompt holds its prompt and answer). An ``acceptance_rate`` column without
    speculative decoding (``speculative`` False) is ignored with a warning."""
    from workloads import from_records, validate
    from workloads.schema import check_hash_id_counts
    from workloads.prefix import (answer_block_keys, answer_unit_keys, block_key_ids,
                                  tokens_per_id, unit_keys_all)
    if not isinstance(workload, pd.DataFrame):
        if isinstance(workload, (str, bytes)) or not hasattr(workload, "__iter__"):
            raise TypeError(f"workload must be a DataFrame or an iterable of request records, "
                            f"got {type(workload).__name__}")
        workload = from_records(workload)
    df = validate(workload)
    with gc_paused():  # a million objects at once: no collector passes over them meanwhile
        reqs = make_requests(df["request_id"].tolist(), df["arrival_time"].tolist(),
                             df["num_prompt_tokens"].tolist(), df["num_output_tokens"].tolist())
    if not speculative and "acceptance_rate" in df.columns \
            and df["acceptance_rate"].notna().any():
        warnings.warn(UNUSED_ACCEPTANCE, UserWarning, stacklevel=3)
    elif "acceptance_rate" in df.columns:  # per-request speculative acceptance (validated)
        for r, a in zip(reqs, df["acceptance_rate"].tolist()):
            r.acceptance_rate = None if a != a else a
    if block_size and "hash_ids" in df.columns:
        hash_bs = tokens_per_id(df)
        name = df.attrs.get("name")
        check_hash_id_counts(df, hash_bs, f"workload {name!r}: " if name else "")
        hash_ids = df["hash_ids"].tolist()
        if mode == "radix":
            keys = unit_keys_all(hash_ids)
        else:
            keys = block_key_ids(hash_ids, hash_bs,
                                 [r.num_prompt_tokens for r in reqs], block_size)
        for r, k in zip(reqs, keys):
            if len(k):
                r.block_keys = k
        if "session_id" in df.columns:  # a finished turn caches the answer its next turn holds
            with gc_paused():  # (new slices among millions of keys: measured 3.4 s -> 2.3 s
                # of _requests_from on 100k radix requests of multi_turn with the pause)
                answers = (answer_unit_keys if mode == "radix" else answer_block_keys)(
                    keys, df["session_id"].tolist(), [r.num_prompt_tokens for r in reqs],
                    [r.num_output_tokens for r in reqs],
                    hash_bs if mode == "radix" else block_size, hash_ids)
            for r, k in zip(reqs, answers):
                r.output_keys = k
    return df, reqs


def cache_unit(df, config):
    """Prefix caching on (``config`` resolved) and a workload with hash_ids: its tokens per
    hash id, checked (radix mode: the tree's node span, which the page ``block_size`` must
    divide); None otherwise."""
    if not config.prefix_caching or "hash_ids" not in df.columns:
        return None
    from workloads.prefix import tokens_per_id
    unit = tokens_per_id(df)
    if config.prefix_caching == "radix" and unit % config.block_size:
        raise ValueError(f"block_size {config.block_size} does not divide the workload's {unit} "
                         f"tokens per hash id (attrs['block_size']): prefix_caching='radix' "
                         f"needs pages that do")
    return unit


def context_limit(df, config):
    """The run's ``max_model_len`` (``config`` resolved) if some request of ``df`` exceeds
    it, else None: one vectorised comparison over the workload, so that a run whose requests
    all fit checks none of them again at arrival."""
    limit = config.resolved_max_model_len()
    if limit is None:
        return None
    total = (df["num_prompt_tokens"].to_numpy(np.int64)
             + df["num_output_tokens"].to_numpy(np.int64))
    return limit if bool((total > limit).any()) else None


UNUSED_ACCEPTANCE = ("workload column acceptance_rate is ignored: speculative decoding is off "
                     "(give SimConfig(speculative=SpeculativeConfig(num_speculative_tokens=K, "
                     "...)) to draw each request's acceptances at its own rate, or drop the "
                     "column)")


def pool_warning(given, kv_blocks) -> str | None:
    """What is wrong with a pool set by ``kv_blocks`` or ``kv_tokens`` (the run keeps it), or
    None: more blocks than the memory budget of the model on the GPU leaves for KV, a cache
    no such GPU holds. Not checked where the budget does not size pools (a cost model of
    one's own with no model or GPU in play) or cannot (the weights do not fit)."""
    knob = "kv_blocks" if given.kv_blocks is not None else "kv_tokens"
    if getattr(given, knob) is None:
        return None
    budget = dataclasses.replace(given, kv_blocks=None, kv_tokens=None)
    if not budget.pool_from_budget():
        return None
    try:
        fits = budget.resolved_kv_blocks()
    except (TypeError, ValueError):
        return None
    if not 0 < fits < kv_blocks:
        return None
    return (f"{knob}={getattr(given, knob):,} is a pool of {kv_blocks:,} KV blocks, more than "
            f"the {fits:,} the memory budget leaves for them: the run keeps it, a KV cache "
            f"larger than the GPU memory (sim memory shows the budget)")


def run(workload, config: SimConfig | None = None, **overrides) -> Result:
    """Simulate ``workload`` (DataFrame or request records) and return a :class:`Result`.

    Settings come from ``config`` and/or keyword overrides of :class:`SimConfig` fields, e.g.
    ``run(df, scheduler="continuous", cost_model=LinearCost(...), max_batch_size=64)``.
    ``bands=0.9``: two more runs at the ends of the central 90 % of the cost model's measured
    step-time error on this GPU give every latency and throughput of the summary its
    ``<metric>_lo`` and ``<metric>_hi`` (:mod:`sim.engine.bands`; ``result.bands``).
    """
    config = as_config(config)
    config = override(config, **overrides) if overrides else config
    if config.bands is not None:  # the point run and the band's two (sim.engine.bands)
        return run_banded(run, workload, config)
    given = config
    if config.seed and not config.draws_at_random():
        warnings.warn(SEED_UNUSED.format(seed=config.seed), UserWarning, stacklevel=2)
    if config.replicas == 1 and config.disaggregation is None and not (
            isinstance(config.router, str) and config.router.strip().lower() == "round_robin"):
        warnings.warn(ROUTER_UNUSED.format(router=config.router), UserWarning, stacklevel=2)
    config, policy = resolve(config)  # every knob filled in: what the Result records
    df, requests = _requests_from(workload, config.block_size if config.prefix_caching else None,
                                  config.prefix_caching,
                                  speculative=config.speculative is not None)
    assign_adapters(df, requests, config.lora)  # LoRA: each request's adapter (kv.lora)
    from workloads.arrivals import nominal_rate  # (a drawn workload's rate, if it is one)
    odd = None if config.closed_loop is not None else arrival_warning(
        df["arrival_time"], nominal_rate(df, warn=False))
    if odd:
        warnings.warn(odd, UserWarning, stacklevel=2)
    unit = cache_unit(df, config)
    limit = context_limit(df, config)
    cost = engine_cost(config.resolved_cost_model(), config)  # (engine_overheads' CPU time)
    kv_blocks = config.resolved_kv_blocks()
    over = pool_warning(given, kv_blocks)
    if over:
        warnings.warn(over, UserWarning, stacklevel=2)
    closed = config.closed_loop is not None
    client = enter(requests, config.request_path, closed)  # None: no time outside the engine
    turns = conversations(df, requests) if closed else None
    wall = time.perf_counter()
    ctx = RunContext(Environment(), requests, config, given, policy, cost, kv_blocks, wall,
                     cache_unit=unit, max_model_len=limit, conversations=turns,
                     closed_path=client if closed else None)
    runner = (run_disaggregated if config.disaggregation is not None
              else run_cluster if config.replicas > 1 else run_replica)
    res = as_client_sees_lag(as_client_sees(runner(ctx), client, config.request_path), config)
    res.sessions = (gap_turns(df, requests, config.block_size)  # (the tool-gap finding)
                    if unit and config.prefix_caching == "block" else None)
    return res


def run_replica(ctx: RunContext) -> Result:
    """Simulate one replica: it pulls its open-loop arrivals itself (no dispatcher) and, alone
    in the environment, runs without yielding (the module docstring); a closed loop's users
    submit to it directly."""
    env, requests, config, policy = ctx.env, ctx.requests, ctx.config, ctx.policy
    replica = new_replica(config, policy, ctx.kv_blocks, ctx.cache_unit,
                          max_model_len=ctx.max_model_len)
    records = array("d")  # ITERATION_COLUMNS per iteration, flat (records.iterations_frame)
    process = ReplicaProcess(env, replica, policy, ctx.cost, records, config.progress,
                             len(requests))
    process.check = config.check
    process.fast_forward = can_fast_forward(policy, replica)
    if config.closed_loop is None:
        process.arrivals = requests  # open loop: the replica pulls arrivals due by each iteration
    else:  # stretches stop at the clients' next issue and leave finishes to the loop's time
        process.closed = True
        ClosedLoopClients(env, [replica], requests, partial(submit, replica, process),
                          client_loop(config), ctx.conversations, ctx.closed_path)
    process.start()
    with gc_frozen():  # the requests are not traversed by the loop's collections
        env.run()
    process.close()
    if len(replica.finished) != len(requests):  # a bug, never a silent loss
        raise RuntimeError(f"{len(requests) - len(replica.finished)} request(s) neither finished "
                           f"nor rejected")
    if config.check:
        check_finished(requests, [replica])
    return offload_traffic(build_result(requests, records, config, ctx.kv_blocks,
                                        wall_seconds=time.perf_counter() - ctx.wall,
                                        policy=policy, cost_model=ctx.cost,
                                        paused=replica.paused), [replica])


