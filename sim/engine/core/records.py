"""From the engine's requests and iteration records to a :class:`~sim.results.metrics.Result`.

Columns are built once, at the end, from the request objects and the flat float64 buffer of
per-iteration rows the engine filled (``ITERATION_COLUMNS``, read without a copy). Token times are never stored: ITL comes from each
request's runs of emitting iterations and the iteration end times
(:func:`sim.engine.core.decoding.inter_token_gaps`). Metric definitions: :mod:`sim.results.metrics`.
"""

from __future__ import annotations

import gc
import struct
from contextlib import contextmanager
from itertools import repeat
from operator import attrgetter, is_not

import numpy as np
import pandas as pd

from ...results.metrics import Result
from ..kv import key_ops
from .columns import INT_COLUMNS, TIME_COLUMNS, request_columns
from .decoding import inter_token_gaps
from .request import FINISHED, STATUS_NAMES

ITERATION_COLUMNS = ("start", "duration", "num_running", "num_waiting", "num_prefill_tokens",
                     "num_decode_tokens", "kv_blocks_used", "num_preemptions")
# one iteration's row as the engine writes it into its flat buffer (``array("d").frombytes``):
# native float64s, the bytes ``array.extend`` of the same values gives
ROW = struct.Struct(f"={len(ITERATION_COLUMNS)}d")


def packed_rows(values) -> bytes:
    """Several rows' values, one row after another, in :data:`ROW`'s layout."""
    return struct.pack(f"={len(values)}d", *values)


@contextmanager
def gc_paused():
    """No cyclic garbage collection inside the block: for building or reading a million plain
    objects at once (the requests, their columns), whose allocations would otherwise trigger
    full collections that traverse all of them again and again (measured: 1M ``Request``
    objects built in 2.1-2.5 s of CPU with the collector on, 0.49 s with it paused; nothing
    built there is cyclic garbage). Re-enables only a collector it found enabled, so nested or
    concurrent uses (threads) leave it enabled once the last one is done."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextmanager
def gc_frozen():
    """The objects alive on entry (the requests, the workload, the replicas) moved to the
    collector's permanent generation for the block (``gc.freeze``): the event loop's
    collections then traverse only what it made since, not every request again (measured on
    scenario 1, 100k requests: engine 1.80 -> 1.68 s CPU, the same as pausing the collector,
    which this does not do: cyclic garbage made in the loop - a user's cost model or policy -
    is still collected). Leaves a freeze it did not make alone: when objects are already
    frozen on entry (the caller froze them), it does nothing. Results do not depend on it."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def release(buffer) -> None:
    """Empty a flat record buffer whose contents were copied, so its memory is free at once.
    A buffer something still views is kept (e.g. a sampling profiler holding the frame of
    :func:`iterations_frame`, as Dask's workers do: resizing it would raise)."""
    try:
        del buffer[:]
    except BufferError:
        pass


# the dtype pandas gives a column of status names (object in pandas 2, ``str`` in pandas 3)
STATUS_DTYPE = pd.Series(np.array(STATUS_NAMES, dtype=object)).dtype


def status_column(codes):
    """The ``status`` column of the status codes ``codes``: what pandas makes of the names as
    Python strings, value and dtype, built in C where pandas stores strings in Arrow (pandas
    3's ``str``: inferring it from 1M Python strings took 0.13-0.35 s, taking from the five
    names 0.02 s)."""
    names = np.array(STATUS_NAMES, dtype=object)
    if not len(codes) or getattr(STATUS_DTYPE, "storage", None) != "pyarrow":  # (none: object)
        return names[codes]
    import pyarrow as pa  # (loaded already: pandas keeps these strings in it)
    return pd.array(pa.array(STATUS_NAMES, type=pa.large_string()).take(pa.array(codes)),
                    dtype=STATUS_DTYPE)


# rows of the record buffer split into columns at a time (2 MB: in the CPU's cache): column by
# column over the whole buffer read it 8 times from memory (2.44M rows: 0.10-0.25 s -> 0.06 s)
ROWS_PER_BLOCK = 1 << 15


def iterations_frame(records) -> pd.DataFrame:
    """One row per iteration: ``iteration`` then :data:`ITERATION_COLUMNS`. ``records``: the
    flat float64 buffer the engine filled (``array("d")``, one row after another), read
    without a copy."""
    k = len(ITERATION_COLUMNS)
    arr = np.frombuffer(records, dtype=np.float64).reshape(-1, k) if len(records) else \
        np.zeros((0, k))
    n = len(arr)
    cols = {"iteration": np.arange(n, dtype=np.int64)}
    out = [np.empty(n, dtype=np.float64 if j < 2 else np.int64) for j in range(k)]
    for s in range(0, n, ROWS_PER_BLOCK):  # block by block: each block's rows read once
        block = arr[s:s + ROWS_PER_BLOCK]
        for j, col in enumerate(out):
            col[s:s + ROWS_PER_BLOCK] = block[:, j]  # (counts: exact integers as floats)
    cols.update(zip(ITERATION_COLUMNS, out))
    return pd.DataFrame(cols, copy=False)


def build_result(requests, records, config, kv_blocks, *, wall_seconds, policy,
                 cost_model, replicas=None, columns=None, first_gaps=None,
                 paused=None) -> Result:
    """``replicas``: a cluster's ``(replica of each request, iterations per replica)``, the
    records concatenated replica by replica (:mod:`sim.engine.fleet.cluster`); None: one replica.
    ``columns``: further request columns (name -> array in request order); ``first_gaps``:
    ``(request indices, gaps)`` between a first token streamed outside any iteration
    (disaggregation) and the request's next token, pooled into ITL like the others;
    ``paused``: the iterations whose decodes the policy paused (numbered as ``records``). ``records`` is
    emptied once read (at 1M requests it held 156 MB through the ITL computation)."""
    key_ops.forget()  # (the loop is over: the views it kept let go of the run's arrays)
    with gc_paused():
        return _build_result(requests, records, config, kv_blocks, wall_seconds, policy,
                             cost_model, replicas, columns, first_gaps, paused)


def _build_result(requests, records, config, kv_blocks, wall_seconds, policy, cost_model,
                  replicas, columns, first_gaps, paused) -> Result:
    iters = iterations_frame(records)
    release(records)  # read (copied into columns): its memory is free for what follows
    if replicas is None:
        replica_of = np.zeros(len(requests), dtype=np.int64)
        iters["replica"] = np.zeros(len(iters), dtype=np.int64)
    else:
        replica_of, counts = replicas
        iters["replica"] = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        iters["iteration"] = np.concatenate([np.arange(c, dtype=np.int64) for c in counts])
    end = (iters["start"] + iters["duration"]).to_numpy()  # == env.now after each timeout
    # paused: iterations whose decodes a policy paused (token runs count decode steps)
    end_steps = np.delete(end, np.asarray(paused, dtype=np.int64)) if paused else end
    cols = request_columns(requests)  # (compiled: one pass over the requests)
    itl_data, max_itl = inter_token_gaps(requests, end_steps, end,
                                         None if cols is None else cols.pop("runs"))
    if first_gaps is not None and len(first_gaps[0]):
        idx, gaps = first_gaps
        itl_data = (itl_data[0], itl_data[1], np.concatenate([itl_data[2], gaps]))
        np.fmax.at(max_itl, idx, gaps)
    if cols is None:  # None (never scheduled / no token / not finished) becomes NaN
        cols = {"arrival_time": _numbers(requests, "arrival_time", np.float64)}
        cols.update((name, _times(requests, name)) for name in TIME_COLUMNS)
        cols.update((name, _numbers(requests, name)) for name in INT_COLUMNS)
        cols["request_id"] = list(map(attrgetter("request_id"), requests))
        cols["reason"] = list(map(attrgetter("reason"), requests))
    arrival = cols["arrival_time"]
    first_sched = cols["first_scheduled_time"]
    first_tok = cols["first_token_time"]
    finish = cols["finish_time"]
    n_out = cols["num_output_tokens"]
    status = status_column(cols["status"])
    done = cols["status"] == FINISHED
    ttft = np.where(done, first_tok - arrival, np.nan)
    e2e = np.where(done, finish - arrival, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(done & (n_out > 1), (e2e - ttft) / (n_out - 1), np.nan)
    df = pd.DataFrame({
        "request_id": cols["request_id"],
        "replica": replica_of,
        "arrival_time": arrival,
        "first_scheduled_time": first_sched,
        "first_token_time": first_tok,
        "finish_time": finish,
        "num_prompt_tokens": cols["num_prompt_tokens"],
        "num_output_tokens": n_out,
        "num_preemptions": cols["num_preemptions"],
        "num_cached_tokens": cols["num_cached_tokens"],
        "num_prefill_computed": cols["num_prefill_computed"],
        "status": status,
        "reason": cols["reason"],
        "ttft": ttft,
        "e2e": e2e,
        "tpot": tpot,
        "tpot_incl_ttft": np.where(done, e2e / n_out, np.nan),
        "queueing_delay": first_sched - arrival,
        "max_itl": max_itl,
    }, copy=False)  # (every array is the frame's own: copying them was 0.2 s at 1M requests)
    if config.speculative is not None:
        steps = _numbers(requests, "spec_steps")
        df["spec_steps"] = steps
        df["spec_drafted"] = steps * config.speculative.num_speculative_tokens
        # accepted as vLLM counts them: the last verification's accepted drafts beyond the
        # request's end included (its output is cut at max_tokens after verification)
        df["spec_accepted"] = (_numbers(requests, "spec_accepted")
                               + _numbers(requests, "spec_overshoot"))
    if config.kv_offload is not None:  # an offload tier (sim.engine.kv.offload)
        df["num_offload_tokens"] = _numbers(requests, "num_offload_tokens")
        df["load_time"] = _numbers(requests, "load_time", np.float64)
    for name, values in (columns or {}).items():
        df[name] = values
    res = Result(df, iters, config, kv_blocks, wall_seconds, itl_data,
                 getattr(policy, "name", type(policy).__name__),
                 getattr(cost_model, "name", type(cost_model).__name__))
    if config.prefix_caching:  # diagnose: a workload naming no prefix block cannot hit
        # (a request's keys: None, or a non-empty list or id array)
        res.num_prefix_keyed = sum(map(is_not, map(attrgetter("block_keys"), requests),
                                       repeat(None)))
    return res


def _numbers(requests, name, dtype=np.int64) -> np.ndarray:
    """The attribute ``name`` of every request as an array (measured at 1M requests: 58 ms a
    column, against 86 ms through a list comprehension and ``np.array``)."""
    return np.fromiter(map(attrgetter(name), requests), dtype=dtype, count=len(requests))


def _times(requests, name) -> np.ndarray:
    """A time attribute that may be None (never reached) as float64, None as NaN."""
    try:
        return _numbers(requests, name, np.float64)
    except TypeError:  # a None among them
        return np.array(list(map(attrgetter(name), requests)), dtype=np.float64)


def offload_traffic(res, replicas):
    """Record on ``res`` the bytes the replicas' offload tiers stored and loaded, in all
    (``offload_bytes``: ``(stored, loaded)``, plus a chain's ``(written, read, blocks read)``
    per tier summed over replicas (kv.tiers); None without a tier)."""
    tiers = [rep.tier for rep in replicas if rep.tier is not None]
    if tiers:
        res.offload_bytes = (sum(t.bytes_stored for t in tiers),
                             sum(t.bytes_loaded for t in tiers))
        if hasattr(tiers[0], "blocks_read"):  # a chain: per tier
            res.offload_bytes += (tuple(
                (sum(t.bytes_written[k] for t in tiers), sum(t.bytes_read[k] for t in tiers),
                 sum(t.blocks_read[k] for t in tiers) * tiers[0].block_size)
                for k in range(len(tiers[0].bytes_written))),)
    slots = [rep.lora for rep in replicas if getattr(rep, "lora", None) is not None]
    if slots:  # LoRA adapters (kv.lora): loads, distinct adapters per batch
        from ..kv.lora import lora_stats
        res.lora_stats = lora_stats(slots)
    return res
