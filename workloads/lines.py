"""A workload file's errors in the file's own terms: ``line N`` of a CSV or JSONL file.

:func:`workloads.validate` names a bad value by its row in the DataFrame (0-based, the header
not counted), which is right for a DataFrame and off by one or two for a file a person opens in
an editor. :func:`as_lines` rewrites each ``row i`` of an error about a CSV or JSONL file as the
line that holds that record: the header is line 1 of a CSV, blank lines (which the readers skip)
are counted. Invariant: the line named is the file's ``i``-th non-blank record line (a record
spanning lines, a quoted newline in a CSV, is not expected in a workload of numbers). A parquet
or JSON file has no lines: its errors keep ``row i`` (0-based).
"""

from __future__ import annotations

import gzip
import re

_ROW = re.compile(r"\brow (\d+)\b")


def as_lines(message, path, suffix) -> str:
    """``message`` with each ``row i`` of the CSV or JSONL file ``path`` as ``line N``."""
    lined = suffix.startswith(".csv") or suffix.startswith(".jsonl")
    if not lined or not _ROW.search(message):
        return message
    opener = gzip.open if suffix.endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            records = [k for k, line in enumerate(fh, 1) if line.strip()]
    except OSError:
        return message
    first = 1 if suffix.startswith(".csv") else 0  # (a CSV's header is its first record line)

    def line(m):
        i = int(m.group(1)) + first
        return f"line {records[i]}" if i < len(records) else m.group(0)
    return _ROW.sub(line, message)
