"""The one request schema, and its validation.

A workload is a pandas DataFrame with one row per request:

| column | type | meaning |
|---|---|---|
| ``request_id`` | numbers or text, one kind, unique, none empty (optional; default ``0..n-1``) | identity, carried into the results |
| ``arrival_time`` | float seconds from start, non-decreasing, >= 0 (timestamps: see below) | when the request arrives |
| ``num_prompt_tokens`` | int >= 1 | prompt (prefill) length |
| ``num_output_tokens`` | int >= 1 | tokens to generate |
| ``hash_ids`` | list of ints (optional) | prefix-block ids, ``attrs["block_size"]`` tokens each |
| ``session_id``, ``turn`` | optional (``turn``: integers, or empty) | multi-turn conversations |
| ``gap_s``, ``parent``, ``join`` | optional | agentic sessions: tool gaps, sub-agents (:mod:`workloads.agentic`) |
| ``acceptance_rate`` | float in [0, 1] (optional) | speculative decoding: the request's own draft acceptance rate |
| ``lora_id`` | any id, missing: the base model (optional) | its LoRA adapter (``workloads.lora``) |

An ``arrival_time`` of timestamps (``datetime64``: a parquet file's, a JSONL file's epoch or
ISO times, which pandas reads as dates, or a CSV file's ISO text, which ``load_file`` parses)
becomes seconds since the earliest; durations
(``timedelta64``) become their seconds. Taken as numbers they were nanoseconds or microseconds
read as seconds: gaps a million times too long and, at ~1e18, latencies rounded to 0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

REQUIRED = ("arrival_time", "num_prompt_tokens", "num_output_tokens")
COLUMNS = ("request_id",) + REQUIRED


MAX_TOKENS = 2 ** 53  # above this a float64 no longer holds every integer exactly
# what a number column must hold, as its errors say it (a JSON file's booleans too: json_bools)
MUST = {"arrival_time": "must be a finite number of seconds >= 0",
        "acceptance_rate": "must be a probability from 0 to 1, or empty for the run's",
        "turn": "must be an integer, its place in the conversation, or empty",
        "gap_s": "must be seconds >= 0, or empty for none"}


def _first_bad(mask) -> int:
    return int(np.flatnonzero(mask)[0])


def _plain(value):
    """``value`` as a plain Python scalar for messages (``-200``, not ``np.int64(-200)``)."""
    return value.item() if isinstance(value, np.generic) else value


def _booleans(col) -> np.ndarray:
    """Where ``col`` holds a boolean (a JSON ``true``, a bool column): not a number of tokens
    or seconds, though ``pd.to_numeric`` would read it as 1 or 0."""
    if pd.api.types.is_bool_dtype(col):
        return np.ones(len(col), dtype=bool)
    if col.dtype != object:
        return np.zeros(len(col), dtype=bool)
    return np.fromiter((isinstance(x, (bool, np.bool_)) for x in col), dtype=bool,
                       count=len(col))


def _has(value) -> str:
    """A bad cell in a message: ``has -200``, or ``has no value`` (an empty CSV cell, a key a
    JSONL line lacks, a NaN), not ``has nan``."""
    value = _plain(value)
    if value is None or value is pd.NA or isinstance(value, float) and value != value:
        return "has no value"
    return f"has {value!r}"


def _seconds(col) -> np.ndarray:
    """``arrival_time`` as float seconds: timestamps since the earliest, durations as seconds,
    numbers as they are (anything else NaN, reported by the caller)."""
    if pd.api.types.is_datetime64_any_dtype(col):
        col = col - col.min()
    if pd.api.types.is_timedelta64_dtype(col):
        return col.dt.total_seconds().to_numpy(dtype=np.float64)
    return pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64)


def validate(df, *, source=None) -> pd.DataFrame:
    """Check a workload and return it normalised (integer lengths, float arrivals, request ids).

    Raises ``ValueError`` naming the column, the first offending row (0-based position) and its
    value; ``TypeError`` when ``df`` is not a DataFrame. ``source`` (a file name) prefixes errors.
    A workload without rows is an error (there is nothing to simulate); token counts above
    ``MAX_TOKENS`` (2**53) are rejected rather than wrapped round by the int64 cast.
    """
    where = f"{source}: " if source else ""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{where}workload must be a pandas DataFrame, got {type(df).__name__}")
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"{where}workload is missing column(s) {missing}; it has "
                         f"{list(df.columns)}")
    if len(df) == 0:
        raise ValueError(f"{where}workload has no requests: nothing to simulate")
    # a shallow copy: every checked column is replaced below and the others are shared
    # read-only (a deep copy consolidated the columns: 0.24 s of 0.25 s at 1M requests)
    out = df.copy(deep=False)
    out.attrs = dict(df.attrs)
    arrival = _seconds(out["arrival_time"])
    bad = ~np.isfinite(arrival) | (arrival < 0) | _booleans(out["arrival_time"])
    if bad.any():
        i = _first_bad(bad)
        raise ValueError(f"{where}arrival_time: row {i} {_has(df['arrival_time'].iloc[i])} "
                         f"({MUST['arrival_time']})")
    if len(arrival) > 1:
        dec = np.diff(arrival) < 0
        if dec.any():
            i = _first_bad(dec) + 1
            raise ValueError(f"{where}arrival_time: row {i} has {_plain(arrival[i])!r}, earlier "
                             f"than row {i - 1} ({_plain(arrival[i - 1])!r}); arrival times must "
                             f"be non-decreasing")
    out["arrival_time"] = arrival
    for col in ("num_prompt_tokens", "num_output_tokens"):
        raw = out[col]
        vals = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(vals) | (vals < 1) | (vals > MAX_TOKENS) | (vals != np.round(vals)) \
            | _booleans(raw)
        if bad.any():
            i = _first_bad(bad)
            raise ValueError(f"{where}{col}: row {i} {_has(raw.iloc[i])} (must be an integer "
                             f"from 1 to 2**53)")
        out[col] = vals.astype(np.int64)
    if "acceptance_rate" in out.columns:
        raw = out["acceptance_rate"]
        vals = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
        bad = ~(np.isfinite(vals) & (vals >= 0) & (vals <= 1)) & raw.notna().to_numpy() \
            | _booleans(raw)  # (True is no probability 1)
        if bad.any():
            i = _first_bad(bad)
            raise ValueError(f"{where}acceptance_rate: row {i} has {_plain(raw.iloc[i])!r} "
                             f"({MUST['acceptance_rate']})")
        out["acceptance_rate"] = vals
    if "turn" in out.columns:  # (text in one cell makes a CSV's column text: "10" < "2")
        raw = out["turn"]
        vals = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
        bad = ~(np.isfinite(vals) & (vals == np.round(vals))) & raw.notna().to_numpy() \
            | _booleans(raw)
        if bad.any():
            i = _first_bad(bad)
            raise ValueError(f"{where}turn: row {i} has {_plain(raw.iloc[i])!r} "
                             f"({MUST['turn']})")
        if raw.notna().all():
            out["turn"] = vals.astype(np.int64)
    if "hash_ids" in out.columns:
        for i, ids in enumerate(out["hash_ids"].tolist()):
            if not (ids is None or ids is pd.NA or isinstance(ids, (list, tuple, np.ndarray))
                    or isinstance(ids, float) and ids != ids):
                hint = " (JSON text: json.loads it, or read the file with workloads.load_file)" \
                    if isinstance(ids, str) else ""
                raise ValueError(f"{where}hash_ids: row {i} has {_plain(ids)!r:.60}, not a list "
                                 f"of ids or empty{hint}")
    if "request_id" not in out.columns:
        out.insert(0, "request_id", np.arange(len(out), dtype=np.int64))
    else:
        _check_ids(out["request_id"], where)
    if "gap_s" in out.columns or "parent" in out.columns:  # agentic sessions
        from .agentic import check_columns
        check_columns(out, where)
    return out.reset_index(drop=True)


def check_hash_id_counts(df, unit, where="") -> None:
    """Every row's ``hash_ids`` fit its prompt: at most ``ceil(num_prompt_tokens / unit)`` ids of
    ``unit`` tokens each (``df`` validated). An id past the prompt names tokens it does not have
    (the radix cache made nodes of them; the block cache ignored them): a ``ValueError`` naming
    the first such row, its count and its prompt."""
    if "hash_ids" not in df.columns or unit is None:
        return
    ids = df["hash_ids"].tolist()
    counts = np.fromiter((len(x) if isinstance(x, (list, tuple, np.ndarray)) else 0
                          for x in ids), dtype=np.int64, count=len(ids))
    prompts = df["num_prompt_tokens"].to_numpy(dtype=np.int64)
    most = -(-prompts // int(unit))
    bad = counts > most
    if bad.any():
        i = _first_bad(bad)
        raise ValueError(f"{where}hash_ids: row {i} has {counts[i]} ids for its "
                         f"{prompts[i]} prompt tokens: at {int(unit)} tokens per hash id at most "
                         f"{most[i]} (ceil({prompts[i]} / {int(unit)})); the ids past the prompt "
                         f"name tokens it does not have")


def _id_kind(x) -> str:
    """What an id is, for the message on ids of mixed kinds: a number or its type's name."""
    if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_)):
        return "number"
    return type(x).__name__


def _check_ids(ids, where) -> None:
    """Every row has an id, all of one kind (numbers, or text: a parquet column holds one type,
    so ``sim run`` could not write ids 1 and 'x' after simulating), none repeated."""
    empty = ids.isna().to_numpy()
    if empty.any():
        raise ValueError(f"{where}request_id: row {_first_bad(empty)} is empty (give every "
                         f"request an id, or drop the column for ids 0..n-1)")
    if ids.dtype == object and pd.api.types.infer_dtype(ids, skipna=False) in ("mixed",
                                                                               "mixed-integer"):
        kinds = [_id_kind(x) for x in ids.tolist()]
        i = next((k for k, kind in enumerate(kinds) if kind != kinds[0]), None)
        if i is not None:
            raise ValueError(f"{where}request_id: row {i} has {_plain(ids.iloc[i])!r} "
                             f"({kinds[i]}) where row 0 has {_plain(ids.iloc[0])!r} "
                             f"({kinds[0]}); ids must be all numbers or all text")
    dup = ids.duplicated().to_numpy()
    if dup.any():
        i = _first_bad(dup)
        raise ValueError(f"{where}request_id: row {i} repeats id {_plain(ids.iloc[i])!r}")


def from_records(records) -> pd.DataFrame:
    """A DataFrame from an iterable of dicts (or objects with the schema's attributes)."""
    rows = []
    for i, rec in enumerate(records):
        if isinstance(rec, dict):
            rows.append(rec)
        else:
            try:
                rows.append({c: getattr(rec, c) for c in REQUIRED}
                            | ({"request_id": rec.request_id} if hasattr(rec, "request_id") else {}))
            except AttributeError as e:
                raise TypeError(f"request record {i} lacks a field: {e}") from None
    return pd.DataFrame(rows)
