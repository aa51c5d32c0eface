"""The compiled engine core: which modules are compiled, and which copy of each one runs.

The modules in :data:`COMPILED` are plain Python; ``pip install`` compiles each with Cython in
pure-Python mode where a C compiler is available (``setup.py``: the types of their hot classes
and locals come from the ``.pxd`` file beside each ``.py``), and the interpreter runs the same
``.py`` otherwise. One source of truth, so one behaviour: the compiled and interpreted engines
give the same bytes (``benchmarks/hashes.py --check`` in both modes, in CI), because the build
keeps floating point as the interpreter does it (``-ffp-contract=off``, no ``-ffast-math``:
no fused multiply-adds, no reassociation) and Cython keeps Python's integer division and
modulo (``cdivision`` off).

Which copy runs is decided at import by :class:`NativeFinder`, installed by ``sim/__init__``
before any engine module loads:

- the compiled module when it, and every other module of the set, was built from the ``.py``
  that is there now (the build records each source's SHA-256 in ``sim/_native_build.json``,
  :data:`RECORD`; the compiled modules share C types, so all or none is compiled);
- the ``.py`` when the source changed since the build (a stale extension never shadows an
  edited source: a ``RuntimeWarning`` says to rebuild), when no extension was built, or when
  the environment sets ``SIM_PURE_PYTHON=1`` (the interpreted engine on demand: CI runs the
  engine tests and the checksums that way too).

:func:`status` says, per module, which copy is loaded and why; :func:`summary` in one word.

Invariant (tests/test_native.py): a module in :data:`COMPILED` is loaded from its extension
only if the recorded hash of every module in the set equals its source's hash and
``SIM_PURE_PYTHON`` is unset.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

# the compiled modules (setup.py reads this tuple without importing the package)
COMPILED = (
    "sim.engine.core.request",
    "sim.engine.core.decoding",
    "sim.engine.core.spec_decoding",
    "sim.engine.core.iteration",
    "sim.engine.core.replica",
    "sim.engine.core.policies",
    "sim.engine.core.process",
    "sim.engine.core.events",
    "sim.engine.core.columns",
    "sim.engine.core.fastforward",
    "sim.engine.kv.blocks",
    "sim.engine.kv.key_ops",
    "sim.engine.kv.prefix_cache",
    "sim.engine.kv.prefix_hits",
    "sim.costs.roofline_price",
    "sim.engine.presets.sglang",
    "sim.engine.presets.vllm",
)
RECORD = "_native_build.json"  # in the package directory: {module: sha256 of its source}
PURE_ENV = "SIM_PURE_PYTHON"


def pure_requested(environ=os.environ) -> bool:
    """Whether ``SIM_PURE_PYTHON`` asks for the interpreter (set, and neither empty nor
    ``0``): the one reading of it, by the finder, ``setup.py`` and the tests."""
    return environ.get(PURE_ENV, "") not in ("", "0")


def source_hash(path) -> str:
    """SHA-256 of a compiled module's source: its ``.py`` and the ``.pxd`` beside it (its C
    types), so an edit to either makes the extension stale."""
    path = Path(path)
    h = hashlib.sha256(path.read_bytes())
    pxd = path.with_suffix(".pxd")
    if pxd.exists():
        h.update(b"\0pxd\0" + pxd.read_bytes())
    return h.hexdigest()


class NativeFinder:
    """A meta-path finder for ``modules`` of the package at ``root`` (a directory): each is
    loaded from its extension module only when ``record`` (module -> source hash) matches
    its ``.py`` and ``pure`` is false; otherwise from its source (see the module docstring).
    Other modules are left to the normal finders."""

    def __init__(self, package: str, root, modules, record: dict, pure: bool):
        self.package, self.root = package, Path(root)
        self.modules, self.record, self.pure = frozenset(modules), dict(record), pure
        self.why = {}  # module -> how it was loaded ("compiled" or why it was not)
        self._stale_set = None

    def _current(self, name) -> bool:
        """Whether ``name``'s extension exists and was built from its source as it is now."""
        source, ext = self._paths(name)
        return ext is not None and source.exists() and \
            self.record.get(name) == source_hash(source)

    def _stale(self) -> list:
        """The modules whose extension is missing or stale (computed once)."""
        if self._stale_set is None:
            self._stale_set = sorted(m for m in self.modules if not self._current(m))
        return self._stale_set

    def _paths(self, name):
        rel = name[len(self.package) + 1:].split(".")  # (the module's path below root)
        base = self.root.joinpath(*rel[:-1])
        ext = next((base / (rel[-1] + s) for s in importlib.machinery.EXTENSION_SUFFIXES
                    if (base / (rel[-1] + s)).exists()), None)
        return base / (rel[-1] + ".py"), ext

    def find_spec(self, name, path=None, target=None):
        if name not in self.modules:
            return None
        source, ext = self._paths(name)
        if ext is None:
            self.why[name] = "interpreted: not built"
            return None  # (the normal finders load the .py)
        if self.pure:
            self.why[name] = f"interpreted: {PURE_ENV}=1"
        elif not self._current(name):
            self.why[name] = "interpreted: source changed since the build"
            warnings.warn(f"{name}: the compiled module was built from another version of "
                          f"{source.name}; running the source (rebuild: pip install -e .)",
                          RuntimeWarning, stacklevel=2)
        elif self._stale():
            # (the compiled modules share C types: one built against another's old layout
            # fails to import, so one stale module runs them all from source)
            self.why[name] = f"interpreted: {', '.join(self._stale())} not current"
        else:
            self.why[name] = "compiled"
            loader = importlib.machinery.ExtensionFileLoader(name, str(ext))
            return importlib.machinery.ModuleSpec(name, loader, origin=str(ext))
        loader = importlib.machinery.SourceFileLoader(name, str(source))
        return importlib.util.spec_from_file_location(name, source, loader=loader)


_FINDER = None


def install() -> NativeFinder:
    """Install the finder for :data:`COMPILED` (once; ``sim/__init__`` calls it)."""
    global _FINDER
    if _FINDER is None:
        root = Path(__file__).resolve().parent
        try:
            record = json.loads((root / RECORD).read_text())
        except (OSError, ValueError):
            record = {}
        _FINDER = NativeFinder("sim", root, COMPILED, record, pure_requested())
        sys.meta_path.insert(0, _FINDER)
    return _FINDER


def status() -> dict:
    """``{module: "compiled" | "interpreted: <why>"}`` for every module in :data:`COMPILED`
    (importing each)."""
    finder = install()
    for name in COMPILED:
        importlib.import_module(name)
    return {name: finder.why.get(name, "interpreted: loaded before the finder")
            for name in COMPILED}


def summary() -> str:
    """One word for the engine core that ran: ``"compiled"`` when every module of
    :data:`COMPILED` is its extension, else ``"interpreted"`` (``sim run`` writes it to
    ``timing.json``, beside the wall time it explains)."""
    return "compiled" if set(status().values()) == {"compiled"} else "interpreted"
