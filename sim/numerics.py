"""Sums whose last digit does not depend on the machine: a fixed order, never a BLAS kernel.

A BLAS dot product (``a @ b``, ``np.dot``) accumulates in the order of the kernel OpenBLAS picks
for the CPU (``OPENBLAS_CORETYPE``): its SkylakeX kernel sums even 7 products in another order
than its Haswell one, so a result computed with it moved in the last digit between an Intel and
an AMD machine. :func:`dot` multiplies elementwise and adds with NumPy's pairwise sum, whose
order depends on the length alone. Invariant: ``dot(a, b)`` is the same float on every CPU for
the same inputs. Used wherever a dot product feeds a result (summary means, a calibrated
profile's price, a speculative mean emission). Fitting a profile (``sim.tools.calibration``)
still calls LAPACK's least squares: it runs offline on measured times, which differ between
machines far more than its last digit.
"""

from __future__ import annotations

import numpy as np


def dot(a, b) -> float:
    """``a @ b`` in a fixed order: elementwise products, then NumPy's pairwise sum."""
    return float(np.add.reduce(np.multiply(a, b, dtype=np.float64)))
