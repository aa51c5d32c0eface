"""Disaggregation's verbs on a replica: a request's KV leaves one replica for another.

:class:`KVHandoff` is a base class of :class:`~sim.engine.core.replica.Replica`, used by
:mod:`sim.engine.fleet.disaggregation`: a prefill replica hands a request off when its prefill
completes (:meth:`KVHandoff._hand_off`) and frees its blocks when the KV has left
(:meth:`KVHandoff.release`); a decode replica takes blocks for a transfer on its way
(:meth:`KVHandoff.reserve`) and starts the request decoding when it lands
(:meth:`KVHandoff.receive`).

Invariant (tests/test_disaggregation.py): ``num_free + blocks held + blocks of the
``num_in_transit`` transfers leaving or reaching this replica == num_blocks``.
"""

from __future__ import annotations

from .queues import _del_running, _set_running
from .request import DECODE


class KVHandoff:
    """A replica's KV hand-off verbs (see the module docstring)."""

    def _hand_off(self, r, now) -> None:
        """``r`` completed its prefill here and decodes elsewhere: it leaves the running set
        (its batch slot is free) but keeps its blocks until :meth:`release` (its KV is being
        sent); status DECODE-bound (``DECODE``, tracked by no replica meanwhile)."""
        r.status = DECODE
        _del_running(self.running, r.index)
        self.num_in_transit += 1
        self.on_prefilled(r, now)

    def release(self, r) -> None:
        """A handed-off request's KV has left: free the blocks it held here."""
        self._free_blocks(r, -(-r.num_computed // self.block_size))
        self.num_in_transit -= 1

    def reserve(self, num_blocks: int) -> bool:
        """Take ``num_blocks`` free blocks for a KV transfer on its way here (False, nothing
        taken, when fewer are free)."""
        if num_blocks > self.blocks.num_free:
            return False
        self.blocks.allocate(num_blocks)
        self.num_in_transit += 1
        return True

    def stand_by(self) -> None:
        """The batch just formed is empty and will not run (the engine sleeps until a KV
        transfer frees or brings blocks): no iteration is in flight."""
        self._decodes_reserved = -1

    def receive(self, r) -> None:
        """``r``'s KV (``r.num_computed`` tokens, blocks taken with :meth:`reserve`) has
        arrived: it joins the running set and decodes from the next iteration this replica
        forms (the one after the iteration in flight, if any)."""
        in_flight = self._decodes_reserved == self.clock
        self.num_in_transit -= 1
        _set_running(self.running, r.index, r)
        r.kv_keys = ()
        r.tree_tokens = 0
        r.output_keys = None  # its prompt's blocks are not cached here: neither is its answer
        self.decodes.start(r, self.clock if in_flight else self.clock - 1)
        if self.num_spec_tokens:
            self.decodes.flush()
