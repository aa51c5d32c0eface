"""The fleet: what surrounds the replicas - routers, clusters, disaggregated pools, clients.

Modules: ``routers`` (which replica serves a request), ``cluster`` (replicas behind a router in
one environment; ``new_replica``), ``disaggregation`` (prefill and decode pools joined by
KV-transfer links), ``clients`` (closed-loop users issuing a conversation's turns),
``request_path`` (the client's time outside the engine: front end, tokeniser). Autoscaling goes
here.

May import: ``sim.engine.core`` (the replica and its process), ``sim.engine.kv`` (a
replica's offload tier and layer pool), ``sim.engine.pool_budget`` (the layer pool's fields),
``sim.engine.speculation`` (a
replica's draws), ``sim.engine.schedulers`` (a policy per replica),
``sim.engine.engine_overheads`` (a closed loop's lag, a pool's CPU time); ``sim.checks``,
``sim.specs``, ``sim.results``; SimPy, NumPy, pandas. Not ``sim.engine.config`` or
``sim.engine.simulation`` (they build on the fleet).
"""
