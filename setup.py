"""Build the compiled engine core (sim/native.py says which modules and why).

Everything else is in pyproject.toml. The modules stay plain Python: where Cython or a C
compiler is missing, or a module fails to compile, the install goes on without that extension
(``optional``) and the interpreter runs the ``.py`` (sim/native.py's finder;
``sim.native.status()`` says which copy runs).
"""

import json
import runpy
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
NATIVE = runpy.run_path(str(ROOT / "sim" / "native.py"))  # (not importing the package)
# floating point exactly as the interpreter does it: no FMA contraction, no fast-math
CFLAGS = ["-O2", "-ffp-contract=off", "-fno-fast-math"]


def _extensions():
    if NATIVE["pure_requested"]():
        return []  # (an install that builds nothing: the interpreted engine)
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("sim: Cython is not installed; the engine runs interpreted")
        return []
    from setuptools import Extension
    exts = [Extension(name, [name.replace(".", "/") + ".py"], extra_compile_args=CFLAGS)
            for name in NATIVE["COMPILED"]]
    exts = cythonize(exts, build_dir="build/cython", quiet=True,
                     compiler_directives={"language_level": 3, "binding": True,
                                          "cdivision": False, "boundscheck": True,
                                          "wraparound": True, "embedsignature": True,
                                          # the types: the .pxd files and @cython.locals only
                                          "annotation_typing": False})
    for ext in exts:  # (cythonize's copies drop the flag: set it on what it returns)
        ext.optional = True  # a module that fails to compile runs interpreted
    return exts


class BuildExt(build_ext):
    """build_ext that records, beside the extensions, the hash of each one's source (.py and
    .pxd: sim/native.py's ``source_hash``), for the import-time stale check; only the
    extensions this build made (an optional one that failed to compile is left out)."""

    def build_extension(self, ext):
        super().build_extension(ext)  # (raises for a failed one: then it is not recorded)
        self._built.add(ext.name)  # (set.add: safe from build_ext's -j threads)

    def run(self):
        self._built = set()
        super().run()
        record = {name: NATIVE["source_hash"](ROOT / (name.replace(".", "/") + ".py"))
                  for name in sorted(self._built)}
        out = Path(self.get_ext_fullpath("sim._x")).parent / NATIVE["RECORD"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


setup(ext_modules=_extensions(), cmdclass={"build_ext": BuildExt})
