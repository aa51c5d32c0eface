"""A sweep's parquet file, for resuming: the fingerprint of a sweep, the identity of a row,
and the rows read back and written.

With ``sweep(..., out=path)`` the file is rewritten as points finish (:func:`write_rows`); a
later sweep with the same ``out`` reads it back (:func:`read_done`) and runs only the (point,
repeat) pairs not there, or there with an error.

Invariants: every row carries ``sweep_context``, the :func:`fingerprint` of what all points
share (the workload, the base config, the SLOs and the grid's fields), and a file holding a row
of another fingerprint, or without a grid field, is refused rather than mixed in; a row is found
again by :func:`row_key`, the same before and after a parquet round trip (numpy scalars, 1 and
1.0, None and NaN, an object and the :func:`plain` repr the file holds it as are each one key);
fingerprints and reprs carry no memory address, so they are stable across processes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import pandas as pd


def fingerprint(df, base, slo, fields) -> str:
    """A fingerprint of what every point shares - the workload (its columns, or the function
    and arguments that draw it), the base config, the SLOs and the grid's ``fields`` (which
    identify a row: see :mod:`sim.tools.sweep`) - so that a resumed sweep never mixes rows of
    another (reprs without memory addresses: stable across processes)."""
    h = hashlib.sha1()
    if callable(df):
        f = getattr(df, "func", df)
        h.update(plain((getattr(f, "__module__", ""), getattr(f, "__qualname__", ""),
                        getattr(df, "args", ()), sorted(getattr(df, "keywords", {}).items())))
                 .encode())
    else:
        for c in ("arrival_time", "num_prompt_tokens", "num_output_tokens"):
            h.update(df[c].to_numpy().tobytes())
        h.update(plain(sorted(set(df.columns))).encode())
        if df.attrs.get("arrival_rate") is not None:  # (drawn: scaled by its nominal rate)
            h.update(plain(("arrival_rate", df.attrs["arrival_rate"])).encode())
    if base is not None:
        h.update(plain([(f.name, getattr(base, f.name))
                        for f in dataclasses.fields(base)]).encode())
    h.update(plain(sorted((slo or {}).items())).encode())
    h.update(plain(sorted(fields, key=str)).encode())
    return h.hexdigest()[:16]


def plain(v) -> str:
    """``repr(v)`` without memory addresses: stable across processes."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(v))


def _stored(v):
    """A grid value as the parquet file holds it: a number, string, bool or None as is, any
    other object (a ``SpeculativeConfig``, ``Disaggregation``, ``ClosedLoop``, a router
    function) as its :func:`plain` repr, which Arrow can write and :func:`row_key` reads back."""
    if v is None or isinstance(v, (bool, int, float, str)) or hasattr(v, "item"):
        return v
    return plain(v)


def _key_value(v):
    v = v.item() if hasattr(v, "item") else v  # numpy scalars
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, (int, float)):  # a column of ints and floats (rate = [1, 2.5]) reads
        return None if v != v else float(v)  # back as floats, None beside numbers as NaN
    return plain(v)


def row_key(params, repeat) -> str:
    """A (point, repeat)'s identity, the same before and after a parquet round trip: numpy
    scalars, 1 and 1.0, None and NaN, an object and the repr the file holds are each one."""
    key = {k: _key_value(v) for k, v in params.items()}
    key["\0repeat"] = int(repeat)  # a name no grid field can have
    return json.dumps(key, sort_keys=True)


def read_done(out, context, names) -> dict:
    """The rows of the sweep file ``out`` by :func:`row_key` (``{}`` when there is no file), a
    ``ValueError`` if one of them is another sweep's (another ``context``, or without one of the
    grid fields ``names``)."""
    if out is None or not Path(out).exists():
        return {}
    old = pd.read_parquet(out)
    if len(old) and ("sweep_context" not in old or (old["sweep_context"] != context).any()
                     or set(names) - set(old.columns)):
        raise ValueError(f"out={str(out)!r} holds rows of another sweep (a different "
                         f"workload, base config, SLOs or grid fields): resuming would mix "
                         f"them; write to another file or delete it")
    return {row_key({k: row[k] for k in names}, row.get("repeat", 0)): row
            for row in old.to_dict("records")}


def write_rows(out, rows, names) -> None:
    """Write ``rows`` (dicts) to the parquet file ``out`` (its folder created if missing), the
    values of the grid fields ``names`` as the file holds them (:func:`_stored`); atomically
    (:mod:`sim.results.atomic`): the file holds the previous rows or all the new ones."""
    from ..results.atomic import atomic_path
    stored = [{k: _stored(v) if k in names else v for k, v in row.items()} for row in rows]
    with atomic_path(out) as tmp:  # (a kill or a full disk mid-write: the previous rows stay)
        pd.DataFrame(stored).to_parquet(tmp, index=False)
