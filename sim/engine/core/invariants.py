"""The engine's invariants, checked inside a run when ``SimConfig(check=True)`` (off by default:
each check is O(running + the cached blocks they hold + queue): with 1-token pages every
token held; the tests turn it on).

After every batch is formed, and after each segment of a fast-forwarded pure-decode stretch
(:func:`sim.engine.core.fastforward.decode_stretch`), on every replica (:func:`check_replica`):

- the KV pool is exact: ``num_free`` + blocks the running requests hold ``== num_blocks``
  (a cached block shared by several requests counts once; radix mode: the pages of the tree
  nodes the running requests reference plus each request's own pages); with disaggregation, KV in transit holds the rest, so held
  ``<= num_blocks`` there; ``0 <= num_free``;
- ``len(running) <= max_batch_size``; every running request is prefilling or decoding, every
  queued one waiting, none in both;
- every request's progress is in range: ``0 <= num_computed <= prefill_target``.

At the end of a run (:func:`check_finished`): every request came out once, finished or rejected
with a reason, times ordered ``arrival <= first scheduled <= first token <= finish``, every
finished request emitted exactly its output tokens, and every replica's pool is free again
(cached blocks nobody references count as free).

A violation raises :class:`InvariantError` naming the replica's iteration and what broke.
"""

from __future__ import annotations

from .request import DECODE, FINISHED, PREFILL, REJECTED, WAITING


class InvariantError(RuntimeError):
    """An engine invariant does not hold (a bug in the engine or in a custom policy)."""


def _fail(replica, what):
    raise InvariantError(f"iteration {replica.iteration}: {what} ({replica!r})")


def _held(replica) -> int:
    """Blocks the running requests hold, shared cached blocks counted once."""
    pool = replica.blocks
    running = replica.running.values()
    if replica.radix:  # the tree nodes the running requests hold (O(their paths), not O(tree)):
        # a reference nobody running holds shows as a block missing, in the iteration it leaks
        bs = pool.block_size
        own = 0
        nodes = set()
        for r in running:
            mine = replica.held_blocks(r) - r.tree_tokens // bs
            if mine < 0:
                _fail(replica, f"{r!r} holds fewer blocks than its cached prefix")
            own += mine
            nodes.update(r.kv_keys)
        return own + pool.pages_of(nodes)
    if replica.caching:
        keyed, anonymous = set(), 0
        for r in running:
            keyed.update(r.kv_keys)
            anonymous += replica.held_blocks(r) - len(r.kv_keys)
        return anonymous + len(keyed)
    return sum(replica.held_blocks(r) for r in running)


def check_replica(replica) -> None:
    """The per-iteration invariants of one replica (see the module docstring)."""
    pool = replica.blocks
    if not 0 <= pool.num_free <= pool.num_blocks:
        _fail(replica, f"{pool.num_free} free KV blocks of {pool.num_blocks}")
    held = _held(replica)
    total = pool.num_free + held
    if total != pool.num_blocks and not (replica.num_in_transit and total < pool.num_blocks):
        _fail(replica, f"{pool.num_free} free + {held} held KV blocks != {pool.num_blocks}")
    if len(replica.running) > replica.max_batch_size:
        _fail(replica, f"{len(replica.running)} running > max_batch_size "
                       f"{replica.max_batch_size}")
    for r in replica.running.values():
        if r.status not in (PREFILL, DECODE):
            _fail(replica, f"running {r!r} is neither prefilling nor decoding")
        if not 0 <= r.num_computed <= r.prefill_target:
            _fail(replica, f"{r!r} computed {r.num_computed} of {r.prefill_target} tokens")
    for r in replica.waiting:
        if r.status != WAITING or r.index in replica.running:
            _fail(replica, f"queued {r!r} is not only waiting")


def check_finished(requests, replicas) -> None:
    """The end-of-run invariants (see the module docstring)."""
    for r in requests:
        if r.status == REJECTED:
            if not r.reason:
                raise InvariantError(f"{r!r} was rejected without a reason")
            continue
        if r.status != FINISHED:
            raise InvariantError(f"{r!r} neither finished nor was rejected")
        times = (r.arrival_time, r.first_scheduled_time, r.first_token_time, r.finish_time)
        if not times[0] <= times[1] <= times[2] <= times[3]:
            raise InvariantError(f"{r!r}: arrival, first scheduled, first token and finish "
                                 f"times out of order: {times}")
        if r.num_generated != r.num_output_tokens:
            raise InvariantError(f"{r!r} emitted {r.num_generated} of {r.num_output_tokens} "
                                 f"tokens")
    for replica in replicas:
        pool = replica.blocks
        if pool.num_free != pool.num_blocks or replica.running or replica.waiting:
            _fail(replica, f"the run ended with {pool.num_blocks - pool.num_free} KV blocks "
                           f"held, {len(replica.running)} running, {len(replica.waiting)} "
                           f"waiting")
