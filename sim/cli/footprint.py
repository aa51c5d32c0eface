"""The memory a run will need, checked before the workload is drawn: ``-n 1e8`` was killed by
the out-of-memory killer without a word after minutes of allocating.

A run keeps every request (the engine's record, then a row of ``Result.requests``) and every
iteration (a row of ``Result.iterations``) until it ends. Measured on ``benchmarks/soak.py``
(0.1M-1M requests, Llama-3.1-8B on an H100, peak RSS of the process): about
``BYTES_PER_REQUEST`` per request, ``BYTES_PER_ITERATION`` per iteration (one to 25 per request
there, by load and output length) and ``BASE_BYTES`` for the interpreter and libraries. The
number of iterations is not known before the run, so the estimate counts one per request: a
lower bound. Invariant: a run whose lower bound exceeds the memory available
(:func:`available_bytes`: ``MemAvailable`` of ``/proc/meminfo``, capped by a cgroup limit) is
refused with the estimate and the largest request count that fits; above half of it, a warning.
Where the memory available cannot be read, nothing is checked.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

BYTES_PER_REQUEST = 1100  # benchmarks/soak.py, 2026-12-02: 1.09 KB per request
BYTES_PER_ITERATION = 120  # and 0.12 KB per iteration (three runs, solved for both)
BASE_BYTES = 120e6  # python, numpy, pandas, simpy and the simulator imported


def estimate_bytes(n) -> float:
    """A lower bound on the peak memory of a run of ``n`` requests (one iteration each)."""
    return BASE_BYTES + n * (BYTES_PER_REQUEST + BYTES_PER_ITERATION)


def _cgroup_room():
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = Path("/sys/fs/cgroup/memory.current").read_text().strip()
    except OSError:
        return None
    return None if limit == "max" else max(int(limit) - int(used), 0)


def available_bytes():
    """Memory this process may still take, bytes (None: unknown on this system)."""
    room = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                room = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        try:
            room = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            room = None
    cgroup = _cgroup_room()
    if cgroup is not None:
        room = cgroup if room is None else min(room, cgroup)
    return room


def check_footprint(n, name="--num-requests") -> None:
    """Refuse (``ValueError``) a run of ``n`` requests whose lower-bound memory exceeds what is
    available, naming the setting ``name``; warn above half of it."""
    if n is None:
        return
    room = available_bytes()
    if room is None:
        return
    need = estimate_bytes(n)
    fits = max(int((room - BASE_BYTES) / (BYTES_PER_REQUEST + BYTES_PER_ITERATION)), 0)
    said = (f"{name} {n:,}: a run keeps every request and iteration until it ends, at least "
            f"{need / 1e9:.3g} GB here ({BYTES_PER_REQUEST + BYTES_PER_ITERATION:,} bytes per "
            f"request, more with long outputs)")
    if need > room:
        raise ValueError(f"{said}, more than the {room / 1e9:.3g} GB of memory available: "
                         f"run at most about {fits:,} requests, or free memory")
    if need > room / 2:
        warnings.warn(f"{said}, over half of the {room / 1e9:.3g} GB of memory available",
                      UserWarning, stacklevel=2)
