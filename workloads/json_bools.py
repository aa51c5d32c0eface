"""A JSON or JSONL workload's booleans in its number columns: an error naming the file, the
row (``line N`` of a JSONL file, by :func:`workloads.lines.as_lines`) and the column.

pandas reads ``true`` in a column of numbers as 1 (``0, true, 2.5`` is ``0.0, 1.0, 2.5``), and
for ``arrival_time`` its date parsing runs before any ``dtype=`` could keep the cell as read, so
:func:`workloads.validate` never sees the boolean. The token counts are read as objects
(``traces._AS_READ``) and checked there; the other number columns are checked here, on the
file read again without conversions, only when its text holds ``true`` or ``false`` at all
(a file of numbers is read once, as before). :func:`first_bad_line` names the line of a JSONL
file that is not JSON (pandas names a byte position)."""

from __future__ import annotations

import gzip
import io
import warnings

import numpy as np
import pandas as pd

from .schema import MUST, _booleans


def check_json_booleans(path, suffix, where="") -> None:
    """A ``ValueError`` (``{where}COLUMN: row i has True (must be ...)``) for the first boolean
    in a number column (:data:`workloads.schema.MUST`) of the JSON or JSONL file ``path``."""
    opener = gzip.open if suffix.endswith(".gz") else open
    with opener(path, "rb") as fh:
        text = fh.read()
    if b"true" not in text and b"false" not in text:
        return
    with warnings.catch_warnings():  # (pandas 3 deprecates it; pandas 2 needs it to keep
        warnings.filterwarnings("ignore", message="The 'convert_dates' keyword")  # the cells)
        raw = pd.read_json(io.BytesIO(text), lines=suffix.startswith(".jsonl"), dtype=False,
                           convert_dates=False)
    if not isinstance(raw, pd.DataFrame):
        return
    for col, must in MUST.items():
        if col in raw.columns:
            bad = _booleans(raw[col].astype(object))
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(f"{where}{col}: row {i} has {bool(raw[col].iloc[i])!r} "
                                 f"({must})")


def first_bad_line(path) -> None:
    """Raise a ``ValueError`` naming the first line of the JSON Lines file ``path`` that is not
    JSON (1-based, as an editor counts, and the column); return when every line parses."""
    import json
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"line {i} is not JSON: {e.msg} (column {e.colno})") from None
