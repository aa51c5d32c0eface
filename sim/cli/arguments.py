"""Checks of what the user names on any command, before any work: :func:`number` (an argparse
``type``: a finite number > 0 or >= 0), :func:`output_folder` and :func:`output_file` (writable,
created by nothing here) and :func:`read_profile` (a calibration profile's JSON object). Each
raises ``ValueError`` naming the flag and the value (``argparse.ArgumentTypeError`` for
:func:`number`), which ``sim`` prints as one line."""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from pathlib import Path


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
    :func:`_writable`)."""
    _writable(path, name, path)
    return Path(path)


def output_file(path, name="--output") -> Path:
    """Check the file ``path`` can be written, its folder created if missing."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{name} {str(path)!r} is a folder; give a file name")
    _writable(path.parent, name, path)
    return path


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
