# The compiled types sim/engine/presets/vllm.py names (sim/native.py).
from sim.engine.core.replica cimport Replica
from sim.engine.core.request cimport Request
