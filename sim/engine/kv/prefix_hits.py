"""The replica's side of the prefix cache: hit lookups, pinned blocks, registering and
inserting computed blocks, caching a finished turn's answer.

:class:`PrefixHits` is a base class of :class:`~sim.engine.core.replica.Replica` (its methods
read the replica's ``blocks``, ``block_size``, ``caching``, ``radix``, ``num_spec_tokens`` and
its per-request memos ``_hits`` and ``_pins``; they never touch the queue or the running set).
Block mode asks a :class:`~sim.engine.kv.prefix_cache.PrefixCachingBlockManager`, radix mode a
:class:`~sim.engine.kv.radix.RadixBlockManager`. A cached prefix only shrinks by evictions and
only grows by additions, so the last answer per waiting request is kept and reused or resumed
(:meth:`PrefixHits._hit`). Block mode's ask is one call, :func:`_block_hit` (compiled, a C call
into the pool: sim/native.py, prefix_hits.pxd).

Invariants (tests/test_prefix_caching.py, tests/test_radix.py, tests/test_answer_cache.py):
a hit is capped so that at least a prompt's last token is computed; a memoised answer equals a
fresh walk's; caching an answer takes no block.
"""

from __future__ import annotations

import numpy as np


def _block_hit(hits, pool, r, bs, remember):
    """Block mode's hit of waiting ``r`` in blocks: its lookup (``hits[r]``, made and kept
    there when ``remember``) refreshed by ``pool`` (:meth:`~sim.engine.kv.prefix_cache.
    PrefixCachingBlockManager.refresh`), capped so that at least its last token is computed.
    (One C call compiled: the pool, lookup and request typed, sim/engine/kv/prefix_hits.pxd.)"""
    look = hits.get(r)
    if look is None:
        look = pool.lookup(r.block_keys)
        if remember:
            hits[r] = look
    return pool.refresh(look, min(len(r.block_keys), (r.prefill_target - 1) // bs))


class PrefixHits:
    """The prefix-cache lookups of a replica (see the module docstring)."""

    def prefix_hit(self, r, remember: bool = True) -> int:
        """Tokens of waiting request ``r`` the prefix cache would serve if admitted now (0
        without caching): its longest cached prefix, capped so that at least its last token is
        computed (block mode: whole blocks; radix mode: whole pages). ``remember=False``: a
        request that may never queue here (a router's look) leaves no memo behind."""
        if not self.caching or r.block_keys is None:
            return 0
        if not self.radix:
            bs = self.block_size
            return _block_hit(self._hits, self.blocks, r, bs, remember) * bs
        return self._hit(r, remember)[0]

    def prefix_pinned(self, r) -> int:
        """KV blocks counted free now that admitting ``r`` would take by referencing its cached
        prefix (SGLang's ``inc_lock_ref`` delta; 0 without caching)."""
        if not self.caching or r.block_keys is None:
            return 0
        blocks = self.blocks
        if not self.radix:  # the lookup just refreshed keeps its free keys
            _block_hit(self._hits, blocks, r, self.block_size, True)
            return blocks.refresh_pinned(self._hits[r])
        cached, nodes = self._hit(r)
        nodes = self._referenced_nodes(r, cached, nodes)
        state = (blocks.num_evictions, blocks.ref_changes, nodes)
        memo = self._pins.get(r)  # valid while no reference and no eviction changed
        if memo is not None and memo[0] == state:
            return memo[1]
        pinned = blocks.pinned(r.block_keys, nodes)
        self._pins[r] = (state, pinned)
        return pinned

    def _hit(self, r, remember=True):
        """``(hit, nodes)`` of waiting request ``r``: block mode ``(blocks, blocks)``, radix mode
        ``(tokens, tree nodes)``. A cached prefix only shrinks by evictions and only grows by
        additions, so the last answer per request is kept (a blocked queue head is asked every
        iteration: a full walk each time cost 117 us per ask on Mooncake's 850-block prompts):
        block mode, as a :class:`~sim.engine.kv.blocks.PrefixLookup` the pool keeps or resumes;
        radix mode, reused while neither happened and resumed while no eviction did."""
        blocks = self.blocks
        keys = r.block_keys
        bs = self.block_size
        if not self.radix:  # the pool keeps the lookup, or resumes or redoes its walk
            hit = _block_hit(self._hits, blocks, r, bs, remember)
            return hit, hit
        evictions, additions = blocks.num_evictions, blocks.additions
        memo = self._hits.get(r)
        if memo is not None and memo[0] == evictions and memo[1] == additions and \
                memo[2] == r.prefill_target:
            return memo[3]  # nothing cached or evicted since: the same answer
        valid = memo is not None and memo[0] == evictions and memo[2] <= r.prefill_target
        limit = min(self._named(r), r.prefill_target - 1) // bs * bs
        found = blocks.match(keys, limit, *memo[3]) if valid else blocks.match(keys, limit)
        if remember:
            self._hits[r] = (evictions, additions, r.prefill_target, found)
        return found


    def _tier_hit(self, r, cached, nodes) -> int:
        """What an offload tier holds of waiting ``r``'s prompt after its GPU hit (``cached``
        tokens over ``nodes`` keys): block mode, blocks (:class:`~sim.engine.kv.tiers.
        TierChain`); radix mode, tokens (:class:`~sim.engine.kv.radix_tiers.RadixTierChain`)."""
        keys, bs = r.block_keys, self.block_size
        if not self.radix:
            return self.tier.hits(keys, nodes, min(len(keys), (r.prefill_target - 1) // bs))
        limit = min(self._named(r), r.prefill_target - 1) // bs * bs
        return self.tier.radix_hits(keys, cached, nodes, limit, r.arrival_time, self.now)[0]

    def _unpin_last(self, nodes, num_tokens, cached):
        """Radix mode: a hit's partly matched last node left unreferenced; its matched tokens
        join the chunk (``(nodes, num_tokens, cached)`` after that)."""
        nodes -= 1
        kept = nodes * self.blocks.unit
        return nodes, num_tokens + cached - kept, kept

    def _referenced_nodes(self, r, cached, nodes) -> int:
        """Radix mode: how many of the ``nodes`` nodes of ``r``'s hit (``cached`` tokens)
        admitting it would reference: all but a partly matched last node that
        :meth:`_pins_past_pool` leaves unreferenced (``Replica._admit_cached``). Its pages are
        then not pinned, so they must not count against the admission either (counted, a
        request the pool holds alone was refused forever: an empty batch)."""
        if nodes and cached < nodes * self.blocks.unit and \
                self._pins_past_pool(r, nodes - 1, cached):
            return nodes - 1
        return nodes

    def _pins_past_pool(self, r, k, upto) -> bool:
        """Radix mode, ``r``'s cached or computed tokens ending at ``upto``, inside its ``k``-th
        node: whether referencing that node (all its cached tokens) would make ``r`` at its
        largest (prompt, outputs and lookahead slots) plus the node's pages it does not use
        exceed the pool. SGLang splits the node there; referenced whole, the request could
        never finish: it preempted itself at the same chunk or decode step forever."""
        blocks, bs = self.blocks, self.block_size
        unused = blocks.pages_of(r.block_keys[k:k + 1]) - (upto - k * blocks.unit) // bs
        top = r.num_prompt_tokens + r.num_output_tokens + self.num_spec_tokens
        return unused > 0 and -(-top // bs) + unused > blocks.num_blocks

    def _insert(self, r):
        """Radix mode: ``r``'s computed named prompt tokens enter the tree (after each
        chunk, as SGLang's ``cache_unfinished_req``)."""
        bs = self.block_size
        named = self._named(r)
        upto = min(r.num_computed, named) // bs * bs
        unit = self.blocks.unit
        k = upto // unit
        if named % unit and k == named // unit and upto > r.tree_tokens and \
                self._pins_past_pool(r, k, upto):  # its prompt ends in a node held further
            upto = k * unit  # (see _pins_past_pool): the tokens there stay its own
        if upto > r.tree_tokens:
            r.tree_tokens = self.blocks.insert(r.block_keys, r.kv_keys, r.tree_tokens, upto)

    def _named(self, r) -> int:
        """Radix mode: ``r``'s prompt tokens its hash ids name (those the tree can hold)."""
        return min(r.num_prompt_tokens, len(r.block_keys) * self.blocks.unit)

    def _register(self, r, done, upto):
        """The full prompt blocks that tokens ``done..upto`` complete become cached."""
        keys = r.block_keys
        if keys is not None:
            bs = self.block_size
            start, stop = done // bs, min(len(keys), upto // bs)
            new = self.blocks.register(keys[start:stop])
            if len(new) == stop - start > 0 and len(r.kv_keys) == start:  # it holds all its
                r.kv_keys = keys[:stop]  # keys so far (chunks tile them): a view, not a copy
            elif len(new):
                r.kv_keys = np.concatenate((r.kv_keys, new)) if len(r.kv_keys) else new

    def _cache_answer(self, r):
        """Finished ``r``'s answer's full blocks become cached under its ``output_keys`` (as
        vLLM v1 caches every full block of a request's tokens, prompt and output, and SGLang's
        ``cache_finished_req`` inserts its prompt and output less the last token): they hold
        the KV of its first ``prompt + output - 1`` tokens, computed while it decoded, so
        caching them takes no block. Block mode: the blocks are its own (anonymous) ones; a
        key already cached stays in an anonymous block, as at :meth:`_register`. Radix mode:
        its tokens past its prompt's whole nodes enter the tree under the next turn's nodes
        (its prompt's last, partly filled node, where only it made and holds it, gives way to
        the next turn's: :meth:`RadixBlockManager.unlink`); else its answer stays its own."""
        keys = r.output_keys
        blocks = self.blocks
        if not self.radix:
            new = blocks.cache_answer(keys)
            if len(new):
                r.kv_keys = np.concatenate((r.kv_keys, new)) if len(r.kv_keys) else new
            return
        unit, covered, held = blocks.unit, r.tree_tokens, r.kv_keys
        whole = covered // unit
        if covered % unit and len(held) == whole + 1 and blocks.is_own_leaf(
                held[-1], covered - whole * unit):  # its prompt's last node, partly filled
            blocks.unlink(held.pop())  # under its own id: the next turn's takes its tokens
            covered = r.tree_tokens = whole * unit
        elif covered % unit or len(held) != whole:
            return
        bs = self.block_size
        upto = min(r.num_prompt_tokens + r.num_output_tokens - 1, len(keys) * unit) // bs * bs
        if upto > covered:
            r.tree_tokens = blocks.insert(keys, r.kv_keys, covered, upto)
