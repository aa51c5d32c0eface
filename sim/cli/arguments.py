"""Checks of what the user names on any command, before any work: :func:`number` (an argparse
``type``: a finite number > 0 or >= 0), :func:`output_folder` and :func:`output_file` (writable,
created by nothing here), :func:`read_profile` (a calibration profile's JSON object),
:func:`not_beside_file` (a TOML file's relative path that exists only beside the file),
:func:`as_flag` and :func:`preset` (a library message in the flag's words). Each raises
``ValueError`` naming the flag and the value (``argparse.ArgumentTypeError`` for
:func:`number`), which ``sim`` prints as one line. Last, the checks of the settings table's
rows (:mod:`sim.cli.table`): ``check(shown, value) -> value``, the same for a flag's value and a
TOML file's, ``shown`` being the setting as the user wrote it.

A relative path in a TOML file (``workload``, ``profile``, ``output``) is read from the working
directory, as a flag's is, not from the TOML file's folder; :func:`not_beside_file` only makes
the error say so when the file's folder holds the path."""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from pathlib import Path

from ..checks import positive_float, positive_int


def number(kind=float, *, allow_zero=False):
    """An argparse ``type``: a finite ``kind`` (int or float) > 0 (or >= 0)."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{what} expected, got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            raise argparse.ArgumentTypeError(f"must be {'>= 0' if allow_zero else '> 0'}, "
                                             f"got {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


def _writable(path, name, shown) -> None:
    """Raise unless ``path`` is, or could be created as, a writable folder. Leaves nothing
    behind, so a run stopped by a later error leaves no empty folder: the nearest existing
    folder is probed with a temporary file, created and removed (``os.access`` alone says yes
    to root in ``/proc`` or on a read-only mount, and the run then failed after simulating)."""
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{name} {str(shown)!r}: cannot write there ({existing} is a file, "
                         f"not a folder)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{name} {str(shown)!r}: cannot write there (permission denied in "
                         f"{existing})")
    try:
        tempfile.NamedTemporaryFile(dir=existing, prefix=".sim-probe").close()
    except OSError as e:
        raise ValueError(f"{name} {str(shown)!r}: cannot write there ({e.strerror or e} in "
                         f"{existing})") from None


def output_folder(path, name="--output") -> Path:
    """Check the output folder can be created and written (before any work; see
    :func:`_writable`). An empty name is an error: ``Path('')`` is the working directory."""
    if isinstance(path, str) and not path.strip():
        raise ValueError(f"{name} must be a folder name, got {path!r} (the working directory "
                         f"is '.')")
    _writable(path, name, path)
    return Path(path)


def out_named(error, parquet, folder, shown) -> ValueError:
    """A library error naming ``out=`` (a sweep's or plan's parquet file) in the words the
    user typed: the ``--output`` flag or the file's ``output`` key, and the folder given."""
    said = f"out={str(parquet)!r}"
    if said not in str(error):
        return error
    return ValueError(str(error).replace(said, f"{shown} {str(folder)!r}: its "
                                               f"{Path(parquet).name}", 1))


def output_file(path, name="--output") -> Path:
    """Check the file ``path`` can be written, its folder created if missing."""
    if isinstance(path, str) and not path.strip():
        raise ValueError(f"{name} must be a file name, got {path!r}")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{name} {str(path)!r} is a folder; give a file name")
    _writable(path.parent, name, path)
    return path


def not_beside_file(path, key, config) -> None:
    """Raise when ``path``, which the TOML file ``config`` gave as ``key``, is relative, does not
    exist from the working directory (where it is read) but does from ``config``'s folder: the
    message names the file and key, the path tried and the path that exists. Else nothing (the
    caller's own check reports a path missing everywhere)."""
    path = Path(path)
    if config is None or path.is_absolute() or path.exists():
        return
    beside = Path(config).parent / path
    if not beside.exists():
        return
    also = "" if beside.is_absolute() else " (or an absolute path)"
    raise ValueError(f"{config}: {key} {str(path)!r} does not exist: a relative path in a TOML "
                     f"file is read from the working directory, not from the file's folder "
                     f"(tried {Path.cwd() / path}); {str(beside)!r} exists: write {key} = "
                     f"\"{beside.as_posix()}\"{also}, or run from {str(Path(config).parent)!r}")


def as_flag(error, flag, key) -> ValueError:
    """``error`` (a library ``ValueError`` about its argument ``key``: ``model 'x' is not a
    preset ...``) in the words of ``flag``: ``--model 'x' is not a preset ...``."""
    msg = str(error)
    return ValueError(f"{flag}{msg[len(key):]}" if msg.startswith(f"{key} ") else
                      f"{flag}: {msg}")


def preset(get, value, flag):
    """``get(value)`` (``get_model``, ``get_gpu``: a preset by name); its ``ValueError`` in the
    words of ``flag`` (``--model 'x' is not a preset ...``)."""
    try:
        return get(value)
    except ValueError as e:
        raise as_flag(e, flag, flag.lstrip("-")) from None


def read_profile(path, name="--profile") -> dict:
    """A calibration profile (from ``sim calibrate``): the JSON object in ``path``."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{name} {str(path)!r}: no such file")
    try:
        profile = json.loads(path.read_text())
    except (ValueError, OSError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{name} {str(path)!r}: not a JSON file ({e})") from None
    if not isinstance(profile, dict):
        raise ValueError(f"{name} {str(path)!r}: not a calibration profile (write one with "
                         f"'sim calibrate')")
    return profile


# checks of a setting's value (sim.cli.table), each ``check(shown, value) -> value``: ``shown``
# is the setting as the user wrote it
def count(shown, value):
    return positive_int(shown, value)


def count_or_zero(shown, value):
    return positive_int(shown, value, allow_zero=True)


def positive(shown, value):
    return positive_float(shown, value)


def request_rate(shown, value):
    """> 0 and finite; inf (vllm bench serve's --request-rate default) says how to get it."""
    if value == math.inf:
        raise ValueError(f"{shown} must be a finite number > 0, got inf: omit it to send "
                         f"a vllm-random or vllm-sharegpt workload all at t = 0, as vllm bench "
                         f"serve's --request-rate inf does")
    return positive_float(shown, value)


def at_least_zero(shown, value):
    return positive_float(shown, value, allow_zero=True)


def num_requests(shown, value):
    """An integer >= 1 (0 and negatives said the same way: ``>= 1``)."""
    if isinstance(value, int) and not isinstance(value, bool) and value < 1:
        raise ValueError(f"{shown} must be >= 1, got {value}" + (
            ": an empty workload has nothing to simulate" if value == 0 else ""))
    return positive_int(shown, value)


def name_any_case(shown, value):
    """A name in any case, as the flags take it (``str.lower``); the target checks which."""
    return value.strip().lower() if isinstance(value, str) else value


def bench_format(shown, value):
    """A benchmark tool's file format (``sim run --format``), any case."""
    from ..results.bench import FORMATS
    name = value.strip().lower() if isinstance(value, str) else value
    if name not in FORMATS:
        raise ValueError(f"{shown} {value!r} is not a format; known: {', '.join(FORMATS)}")
    return name


def prefix_caching(shown, value):
    """A prefix-cache mode in any case; ``off`` (or ``false``, ``none``) is ``False``, the
    API's off; SimConfig checks the others."""
    value = name_any_case(shown, value)
    return False if value in (False, "off", "false", "none") else value


def typed(kind, what):
    """A check that the value is a ``kind`` (and not a bool unless ``kind`` is bool)."""
    def check(shown, value):
        if value is not None and (isinstance(value, bool) is not (kind is bool)
                                  or not isinstance(value, kind)):
            raise TypeError(f"{shown} must be {what}, got {value!r}")
        return value
    return check


def repeats(shown, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{shown} must be an integer >= 1, got {value!r}")
    return value
