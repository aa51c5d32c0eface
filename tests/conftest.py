import os

import matplotlib
import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
matplotlib.use("Agg")


@pytest.fixture
def rng():
    import numpy as np
    return np.random.default_rng(12345)
