# The compiled types sim/engine/core/columns.py names (sim/native.py).
from sim.engine.core.request cimport Request
