"""The engine core: requests, the replica and its iteration loop, policies and records.

Modules: ``request`` (the request state machine), ``queues`` (the waiting queue and running set
as policies see them), ``replica`` (a replica's state and the verbs policies act through) with
its base classes ``iteration`` (form a batch, apply it) and ``handoff`` (disaggregation's KV
verbs), ``decoding`` (how many tokens an iteration emits: the lazy decode bookkeeping, ITL from
token runs) and ``spec_decoding`` (the same under speculative decoding), ``batch`` (the
immutable snapshot a cost model prices), ``policies`` (the policy contract and the simple
policies), ``events`` (the SimPy environment and the engine's pre-made events),
``process`` (a replica's SimPy process: the iteration loop, the arrival verb),
``fastforward`` (pure-decode stretches in one event), ``invariants`` (the checks of
``SimConfig.check``), ``records`` (the results' columns, ``build_result``).

May import: ``sim.engine.kv``; ``sim.cython_shim`` (the compiled modules' no-op shim,
``sim.native``); ``sim.checks``, ``sim.constants``, ``sim.specs``,
``sim.results`` (the ``Result`` it builds); SimPy, NumPy, pandas. Not the presets, the fleet,
speculation's settings or the engine's top-level modules (they build on the core).
"""
