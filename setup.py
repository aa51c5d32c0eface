"""Build the compiled engine core (sim/native.py says which modules and why).

Everything else is in pyproject.toml. The modules stay plain Python: where Cython or a C
compiler is missing, or a module fails to compile, the install goes on without that extension
(``optional``) and the interpreter runs the ``.py`` (sim/native.py's finder;
``sim.native.status()`` says which copy runs).
"""

import json
import os
import runpy
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
NATIVE = runpy.run_path(str(ROOT / "sim" / "native.py"))  # (not importing the package)
# floating point exactly as the interpreter does it: no FMA contraction, no fast-math
CFLAGS = ["-O2", "-ffp-contract=off", "-fno-fast-math"]


def _extensions():
    if os.environ.get(NATIVE["PURE_ENV"], "") not in ("", "0"):
        return []  # (an install that builds nothing: the interpreted engine)
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("sim: Cython is not installed; the engine runs interpreted")
        return []
    from setuptools import Extension
    exts = [Extension(name, [name.replace(".", "/") + ".py"], extra_compile_args=CFLAGS,
                      optional=True) for name in NATIVE["COMPILED"]]
    return cythonize(exts, build_dir="build/cython", quiet=True,
                     compiler_directives={"language_level": 3, "binding": True,
                                          "cdivision": False, "boundscheck": True, "annotation_typing": False,
                                          "wraparound": True, "embedsignature": True})


class BuildExt(build_ext):
    """build_ext that records, beside the extensions, the hash of each one's source (.py and
    .pxd: sim/native.py's ``source_hash``), for the import-time stale check."""

    def run(self):
        super().run()
        record = {ext.name: NATIVE["source_hash"](ROOT / (ext.name.replace(".", "/") + ".py"))
                  for ext in self.extensions if Path(self.get_ext_fullpath(ext.name)).exists()}
        out = Path(self.get_ext_fullpath("sim._x")).parent / NATIVE["RECORD"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExt})
