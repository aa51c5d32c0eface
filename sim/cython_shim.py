"""The few names of Cython's pure-Python mode the compiled modules use, for an interpreter
without Cython installed (Cython is a build requirement, not a run-time one: sim/native.py).

Each compiled module does ``try: import cython`` / ``except ImportError: from sim import
cython_shim as cython``: compiled, Cython reads the decorators and types at build time (``import
cython`` is its own); interpreted, these do nothing - the decorators return the function as it
is and the type names are placeholders - so the same source runs unchanged and no slower.
"""

compiled = False



class _CType:
    """A C type's placeholder in ``@cython.locals``: never called; ``T[:]`` (a typed view)
    is a placeholder too."""

    def __getitem__(self, item):
        return self


# C types named in @cython.locals (placeholders: never called)
longlong = double = bint = int = Py_ssize_t = int32_t = int64_t = _CType()


def locals(**types):
    """``@cython.locals(name=type, ...)``: the types of a function's locals, compiled only."""
    def keep(function):
        return function
    return keep
