"""Speculative decoding: its settings, the seeded acceptance draws, and the draft's price.

Modules: ``settings`` (:class:`~sim.engine.speculation.settings.SpeculativeConfig`,
``SimConfig.speculative``), ``acceptance`` (tokens per verification, drawn per request from the
run's seed: ``make_drawer``), ``draft_cost`` (``DraftCost``: the target's cost model plus the
draft's). The decode bookkeeping under speculation is the core's
(``sim.engine.core.spec_decoding``): the replica knows speculation only as ``k`` lookahead slots
and a ``draw(r, n)`` callable.

May import: ``sim.engine.core`` (the ``Batch`` the draft prices); ``sim.checks``,
``sim.specs``; NumPy.
"""
