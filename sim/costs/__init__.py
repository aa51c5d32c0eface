"""Cost models: ``cost(batch) -> seconds`` prices an engine iteration.

``simple`` (``ConstantCost``, ``LinearCost``), ``roofline`` (per-op roofline fitted to measured
A100/H100 kernels; the default), ``roofline_params`` (its efficiencies and fixed costs, fitted
per GPU), ``calibrated`` (``CalibratedCost`` from a profile measured on a
device), ``kernels`` (attention kernels: NumPy reference, CuPy and a CUDA ``RawKernel``; the only
module that imports CuPy), ``executor`` (runs a batch for real; ``ExecutedCost``), ``timing``
(times the kernels and fits the profile's tables). A cost model reads only the batch snapshot
(:class:`sim.engine.core.batch.Batch`) it is given; ``needs_decode_lengths = True`` asks for
per-decode detail.

May import: ``sim.checks``, ``sim.constants``, ``sim.specs``. Never the engine (the in-engine
part of calibration lives in :mod:`sim.tools.calibration`).
"""
