# The compiled types sim/engine/presets/sglang.py names (sim/native.py).
from sim.engine.core.replica cimport Replica
from sim.engine.core.request cimport Request
