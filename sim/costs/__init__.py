"""Cost models: ``cost(batch) -> seconds`` prices an engine iteration.

``simple`` (``ConstantCost``, ``LinearCost``), ``roofline`` (per-op roofline fitted to measured
A100/H100 kernels; the default: ``RooflineCost``, its memoised token-count path and hot path),
its terms ``roofline_ops`` (a layer's linear and elementwise ops), ``roofline_attention``
(prefill and decode attention, MLA), ``roofline_collectives`` (tensor parallelism's
all-reduces) and ``roofline_params`` (its efficiencies and fixed costs, fitted per GPU), ``moe``
(a MoE layer's routed work), ``calibrated`` (``CalibratedCost`` from a profile measured on a
device), ``kernels`` (attention kernels: NumPy reference, CuPy and a CUDA ``RawKernel``; the only
module that imports CuPy), ``executor`` (runs a batch for real; ``ExecutedCost``), ``timing``
(times the kernels and fits the profile's tables). A cost model reads only the batch snapshot
(:class:`sim.engine.core.batch.Batch`) it is given; ``needs_decode_lengths = True`` asks for
per-decode detail.

May import: ``sim.checks``, ``sim.constants``, ``sim.specs``. Never the engine (the in-engine
part of calibration lives in :mod:`sim.tools.calibration`).
"""
