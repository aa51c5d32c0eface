# The compiled types sim/engine/core/process.py names (sim/native.py).
from sim.engine.core.iteration cimport Iteration
from sim.engine.core.request cimport Request
from sim.costs.roofline_price cimport RooflinePrice
from sim.engine.kv.blocks cimport BlockManager
