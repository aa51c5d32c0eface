"""The inference-optimisation cheat sheet's reference primitives, kept under its names.

``prefix_cache`` (``PrefixCache``: a token trie with optional LRU), ``speculative``
(``DraftModel``, ``speculative_decode``, acceptance maths), ``step_batching``
(``simulate_static_batching`` / ``simulate_continuous_batching``: the step-level reference
models the engine is checked against; the engine's real batching is
:mod:`sim.engine.core.policies`). Small, exact and independent of the engine.

May import: ``sim.checks``, ``sim.constants``, ``sim.specs``.
"""
