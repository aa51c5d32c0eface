"""The benchmark tools' result files of a run: :func:`export` gives each file's name and text
(strict JSON: a NaN is ``null``, :mod:`.strict`), the writers of :mod:`.vllm`, :mod:`.aiperf` and
:mod:`.guidellm` by format; the caller writes them (``sim run --format``).

``info``, what the run does not hold but the files say: ``model`` (its name), ``rate`` (the
open loop's mean rate, req/s, or None), ``concurrency`` (the closed loop's users, or None),
``burstiness`` (vLLM's gamma shape of the arrivals, or None: 1).
"""

from __future__ import annotations

from . import FORMATS


def export(result, fmt, info) -> dict:
    """``{file name: text}`` of ``result`` in the format ``fmt`` (one of :data:`FORMATS`)."""
    from . import aiperf, guidellm, vllm
    writers = {"vllm-bench": vllm.files, "aiperf": aiperf.files, "guidellm": guidellm.files}
    if fmt not in writers:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return writers[fmt](result, info)
