"""Files written whole or not at all: a temporary file beside the target, renamed into place.

    with atomic_path(out / "sweep.csv") as tmp:
        table.to_csv(tmp, index=False)

Invariant: the target path holds either its previous content or the complete new one, never
half a file: a write that fails (a full disk, ``OSError(ENOSPC)``; a killed process) leaves the
previous file as it was and removes its temporary file (a ``kill -9`` may leave the hidden
``.NAME.<hex>.tmp<suffix>`` beside it, never in its place). The temporary name keeps the
target's suffix, so writers that infer a format from it (``savefig``) write the same bytes.
"""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path):
    """A temporary path in ``path``'s folder (created if missing) to write to; renamed onto
    ``path`` when the block ends without an error, removed when it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.stem}.{uuid.uuid4().hex[:12]}.tmp{path.suffix}"
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
