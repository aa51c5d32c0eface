"""One serving replica's state, and the few verbs a batching policy acts through.

The replica owns the waiting queue, the running set (admission order, oldest first), the KV
pool (:class:`~sim.engine.kv.blocks.BlockManager`) and the decoding requests
(:class:`~sim.engine.core.decoding.Decodes`). A policy (:mod:`sim.engine.core.policies`) sees the queue
and the running set read-only and changes them only through these verbs:

- :meth:`Replica.admit` ``(r, num_tokens)`` - move any waiting request into the running set to
  prefill ``num_tokens`` tokens this iteration after the :meth:`Replica.prefix_hit` tokens the
  prefix cache serves (False, nothing changed, when no slot or not enough free blocks:
  admission never preempts);
- :meth:`Replica.schedule_chunk` ``(r, num_tokens)`` - continue a running prefill, preempting
  victims for its blocks if needed (False when ``r`` itself was the victim);
- :meth:`Replica.preempt` ``(r)`` - recompute preemption: free all of ``r``'s blocks, back to
  the head of the queue;
- the victim rule: ``policy.select_victim(replica)`` if the policy has one, else the most
  recently admitted running request (vLLM).

Each iteration, :meth:`form_batch` (the engine) reserves the blocks every decode crosses into,
preempting victims if the pool is short - every running decode emits a token every iteration
(1..k+1 tokens under speculative decoding, its k lookahead slots' blocks included) -
then calls the policy, which adds prefill work, and snapshots the batch for the cost model
(:meth:`batch` takes the same snapshot at any time); :meth:`postprocess` applies its effects
when the iteration ends. A request that finishes here with ``output_keys`` (a conversation's
turn) leaves its answer cached in the blocks it held before freeing them (:meth:`_cache_answer`:
no block taken; tests/test_answer_cache.py).

Invariants (tests/test_replica.py; the engine's brute-force per-token trace under hypothesis):
- ``blocks.num_free + sum(held_blocks(r) for r running) == blocks.num_blocks``, never below 0
  (with prefix caching, a block shared by several requests counts once: tests/
  test_prefix_caching.py checks ``num_free + distinct blocks held == num_blocks`` every
  iteration; with disaggregation, plus the blocks of the ``num_in_transit`` KV transfers
  leaving or reaching this replica: :meth:`release`, :meth:`reserve`, :meth:`receive`);
- ``len(running) <= max_batch_size``; every running request is PREFILL or DECODE;
- a request is in exactly one of: waiting, running, finished (which includes rejected);
- per-iteration work is O(admitted + finished + preempted), never O(running).
"""

from __future__ import annotations

from collections import deque
from functools import partial

import numpy as np

from .batch import Batch, make_batch
from ..kv.blocks import BlockManager, PrefixCachingBlockManager, blocks_for
from .decoding import ClippedDecodes, Decodes, SpecDecodes, emits_single_token
from ..kv.radix import RadixBlockManager
from .request import DECODE, FINISHED, PREFILL, REJECTED, STATUS_NAMES, WAITING


def _refuse(self, *args, **kwargs):
    raise TypeError("a replica's queue and running set are read-only to policies: act through "
                    "replica.admit / schedule_chunk / preempt")


class WaitingQueue(deque):
    """The waiting queue as policies see it: a deque (reads at C speed), mutations refused.
    The replica mutates it through the base class (``deque.append(q, r)``)."""

    append = appendleft = extend = extendleft = pop = popleft = remove = clear = _refuse
    rotate = insert = __setitem__ = __delitem__ = __iadd__ = _refuse


class RunningSet(dict):
    """The running set as policies see it: ``index -> Request`` in admission order (oldest
    first); mutations refused. The replica mutates it through ``dict``."""

    __setitem__ = __delitem__ = pop = popitem = clear = update = setdefault = _refuse
    __ior__ = _refuse


_enqueue, _enqueue_head, _dequeue_head, _dequeue = (deque.append, deque.appendleft,
                                                    deque.popleft, deque.remove)
_set_running, _del_running = dict.__setitem__, dict.__delitem__
_NO_KEYS = np.zeros(0, dtype=np.int64)  # block mode: the keys of a request without hash ids


def newest_running(replica):
    """The default victim: the most recently admitted running request (vLLM, Sarathi)."""
    running = replica.running
    return running[next(reversed(running))]


class Replica:
    """State of one replica; see the module docstring for the verbs and invariants."""

    def __init__(self, kv_blocks, block_size, max_batch_size, select_victim=None,
                 prefix_caching=False, speculative=None, draw=None, cache_unit=None,
                 clip_left=None):
        # prefix_caching: False, "block" (True) or "radix"; cache_unit: the workload's tokens
        # per hash id (radix mode's node span); clip_left: keep the decodes' tokens left, each
        # clipped to it, summed (decoding.ClippedDecodes; a policy's clip_left, SGLang's)
        self.caching = bool(prefix_caching)
        self.radix = prefix_caching == "radix"
        # waiting request -> its lookup memo (_hit): block mode a blocks.PrefixLookup, radix
        # mode (evictions, additions, target, (hit, nodes))
        self._hits = {}
        self._pins = {}  # radix mode: waiting request -> (state, free pages its hit holds)
        if self.radix:
            self.blocks = RadixBlockManager(kv_blocks, block_size, cache_unit or block_size)
        else:
            self.blocks = (PrefixCachingBlockManager if self.caching else BlockManager)(
                kv_blocks, block_size)
        self.block_size = self.blocks.block_size
        self.max_batch_size = max_batch_size
        # speculative decoding: k draft tokens verified per decode, emissions from draw(r, n)
        self.num_spec_tokens = speculative.num_speculative_tokens if speculative else 0
        if speculative:
            self.decodes = SpecDecodes(self.block_size, self.num_spec_tokens, draw, clip_left)
        elif clip_left:
            self.decodes = ClippedDecodes(self.block_size, clip_left)
        else:
            self.decodes = Decodes(self.block_size)
        self.waiting = WaitingQueue()
        self.running = RunningSet()  # index -> Request, admission order
        self.prefilling = ()  # PREFILL requests in admission order (a tuple: read-only)
        self.select_victim = select_victim or newest_running
        # enqueue(r): an arriving request joins the tail of the queue (the engine's verb; a
        # C-level bound append: no Python frame per arrival)
        self.enqueue = partial(_enqueue, self.waiting)
        self.capacity_tokens = self.blocks.capacity_tokens
        self.iteration = 0
        # the decode clock: decode steps run so far; equal to the iteration index unless the
        # policy pauses decodes (on_demand_decodes: SGLang's prefill-only iterations)
        self.clock = 0
        self.on_demand_decodes = False
        self.decoding = True  # whether this iteration's decodes run
        self.paused = []  # iterations whose decodes were paused (prefill-only)
        self.now = 0.0
        # this iteration's prefill work, in order: the requests, (new, cached) per request,
        # their prefill tokens in all
        self._prefill_reqs = []
        self._prefills = []
        self._prefill_tokens = 0
        self.num_preempted_now = 0  # preemptions while forming the current batch
        self._decodes_reserved = -1  # decode step whose blocks are already taken
        self.finished = []
        self.on_finish = None  # optional callback(request, now), e.g. closed-loop clients
        self.on_prefilled = None  # disaggregation: callback(request, now) at prefill completion
        self.num_in_transit = 0  # disaggregation: KV transfers from or to here holding blocks
        self.num_incoming = 0  # disaggregation: requests routed here to decode, KV not landed

    # -- what a policy reads: waiting, running, prefilling, blocks.num_free, decodes.count,
    # max_batch_size, iteration, and these -------------------------------------------------
    def num_generated(self, r) -> int:
        """Output tokens ``r`` has emitted before the current iteration (exact for DECODE
        requests too, whose ``r.num_generated`` is only updated when they stop decoding)."""
        if r.status == DECODE:
            return self.decodes.generated(r, self.clock - 1)
        return r.num_generated

    def is_scheduled(self, r) -> bool:
        """Whether ``r`` already has prefill work in this iteration."""
        return r.scheduled_iteration == self.iteration

    def held_blocks(self, r) -> int:
        """Blocks ``r`` holds now: a decode, including the block it crosses into this
        iteration once reserved; a prefill, including those taken for its work this iteration."""
        if r.status == DECODE:
            c = self.clock
            return self.decodes.held_blocks(r, c, self._decodes_reserved == c)
        return blocks_for(r.num_computed + self._scheduled_tokens(r), self.block_size)

    def _scheduled_tokens(self, r) -> int:
        if r.scheduled_iteration != self.iteration:
            return 0
        return self._prefills[self._prefill_reqs.index(r)][0]

    def prefix_hit(self, r, remember: bool = True) -> int:
        """Tokens of waiting request ``r`` the prefix cache would serve if admitted now (0
        without caching): its longest cached prefix, capped so that at least its last token is
        computed (block mode: whole blocks; radix mode: whole pages). ``remember=False``: a
        request that may never queue here (a router's look) leaves no memo behind."""
        if not self.caching or r.block_keys is None:
            return 0
        hit = self._hit(r, remember)[0]
        return hit if self.radix else hit * self.block_size

    def prefix_pinned(self, r) -> int:
        """KV blocks counted free now that admitting ``r`` would take by referencing its cached
        prefix (SGLang's ``inc_lock_ref`` delta; 0 without caching)."""
        if not self.caching or r.block_keys is None:
            return 0
        nodes = self._hit(r)[1]
        blocks = self.blocks
        if not self.radix:  # the lookup _hit just refreshed keeps its free keys
            return blocks.refresh_pinned(self._hits[r])
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
            look = self._hits.get(r)
            if look is None:
                look = blocks.lookup(keys)
                if remember:
                    self._hits[r] = look
            hit = blocks.refresh(look, min(len(keys), (r.prefill_target - 1) // bs))
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

    # -- the verbs ----------------------------------------------------------------------------
    def admit(self, r, num_tokens: int) -> bool:
        """Admit waiting request ``r`` (any position in the queue) to prefill ``num_tokens``
        tokens this iteration, after the ``prefix_hit(r)`` tokens the cache serves; False when
        no batch slot or not enough free KV blocks (nothing changes: admission never
        preempts)."""
        if self.caching:
            return self._admit_cached(r, num_tokens)
        if r.status != WAITING or not 0 < num_tokens <= r.prefill_target:
            self._refuse_admit(r, num_tokens)
        if len(self.running) >= self.max_batch_size:
            return False
        blocks = -(-num_tokens // self.block_size)  # blocks_for, inlined (hot)
        if blocks > self.blocks.num_free:
            return False
        self._dequeue(r)
        self.blocks.num_free -= blocks  # BlockManager.allocate, inlined (hot): checked above
        self._start(r, num_tokens, 0)
        return True

    def _dequeue(self, r):
        """Take ``r`` out of the waiting queue (O(1) at the head, O(queue) elsewhere)."""
        waiting = self.waiting
        if waiting and waiting[0] is r:
            _dequeue_head(waiting)
        else:
            try:
                _dequeue(waiting, r)
            except ValueError:
                raise ValueError(f"admit: {r!r} is not in this replica's queue") from None

    def _start(self, r, new, cached):
        """``r`` joins the running set, prefilling ``new`` tokens after ``cached`` ones now."""
        r.status = PREFILL
        if r.first_scheduled_time is None:
            r.first_scheduled_time = self.now
            r.num_cached_tokens = cached
        _set_running(self.running, r.index, r)
        self.prefilling += (r,)
        r.scheduled_iteration = self.iteration
        self._prefill_reqs.append(r)
        self._prefills.append((new, cached))
        self._prefill_tokens += new

    def _admit_cached(self, r, num_tokens):
        keys = r.block_keys
        bs = self.block_size
        cached, nodes = self._hit(r) if keys is not None else (0, 0)
        if not self.radix:
            cached *= bs
        if r.status != WAITING or not 0 < num_tokens <= r.prefill_target - cached:
            if r.status == WAITING:
                raise ValueError(f"admit: num_tokens must be in 1..{r.prefill_target - cached} "
                                 f"for {r!r} ({cached} tokens cached), got {num_tokens}")
            self._refuse_admit(r, num_tokens)
        if len(self.running) >= self.max_batch_size:
            return False
        blocks = self.blocks
        # a partly matched last node pins its whole span (a deviation: SGLang splits it); not
        # referenced (its matched tokens computed again in this chunk) where pinned for the
        # request's whole run it would take more than the pool (it preempted itself at the
        # same chunk forever; with nothing running it was refused forever). Otherwise a request
        # the pool holds fits once nothing else runs: the hit's pages plus the rest of its run
        if self.radix and nodes and cached < nodes * blocks.unit and self._pins_past_pool(
                r, nodes - 1, cached):
            nodes, num_tokens, cached = self._unpin_last(nodes, num_tokens, cached)
        need = -(-(cached + num_tokens) // bs) - cached // bs
        if need > blocks.num_free or (  # the hit's free blocks, counted only when they decide
                nodes and (self.radix or need + nodes > blocks.num_free)  # (block mode: at
                and need + self.prefix_pinned(r) > blocks.num_free):  # most one per key hit)
            return False
        self._dequeue(r)
        self._hits.pop(r, None)
        self._pins.pop(r, None)
        if keys is None:
            held = [] if self.radix else _NO_KEYS
        else:  # (block mode: a view of the id array; radix mode: a list the tree extends)
            held = list(keys[:nodes]) if self.radix else keys[:nodes]
        blocks.acquire(held)
        blocks.allocate(need)
        r.kv_keys = held
        r.num_computed = cached
        self._start(r, num_tokens, cached)
        if self.radix:  # its computed tokens enter the tree after the iteration (_insert)
            r.tree_tokens = cached
        else:  # vLLM caches a block's key when it is scheduled
            self._register(r, cached, cached + num_tokens)
        return True

    def _unpin_last(self, nodes, num_tokens, cached):
        """Radix mode: a hit's partly matched last node left unreferenced; its matched tokens
        join the chunk (``(nodes, num_tokens, cached)`` after that)."""
        nodes -= 1
        kept = nodes * self.blocks.unit
        return nodes, num_tokens + cached - kept, kept

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

    def _free_blocks(self, r, n):
        """``r`` gives back its ``n`` blocks (its cached ones keep their keys, in the LRU)."""
        if self.caching:  # its own blocks: all but the cached ones it references
            shared = r.tree_tokens // self.block_size if self.radix else len(r.kv_keys)
            self.blocks.release(r.kv_keys, n - shared)
            r.kv_keys = ()
            r.tree_tokens = 0
        else:
            self.blocks.free(n)

    def schedule_chunk(self, r, num_tokens: int) -> bool:
        """Continue running prefill ``r`` by ``num_tokens`` tokens this iteration, taking the
        blocks they need and preempting victims when the pool is short; False when ``r``
        itself was preempted (then it is waiting again)."""
        done = r.num_computed
        i = self.iteration
        if (r.status != PREFILL or r.scheduled_iteration == i
                or not 0 < num_tokens <= r.prefill_target - done):
            self._refuse_chunk(r, num_tokens)
        bs = self.block_size
        need = -(-(done + num_tokens) // bs) - (-(-done // bs))  # blocks_for, inlined (hot)
        blocks = self.blocks
        while need > blocks.num_free:
            victim = self.select_victim(self)
            self.preempt(victim)
            if victim is r:
                return False
        if self.caching:
            blocks.allocate(need)
            if not self.radix:  # (radix: the tree takes the tokens after the iteration)
                self._register(r, done, done + num_tokens)
        else:
            blocks.num_free -= need  # BlockManager.allocate, inlined (hot): need <= num_free
        r.scheduled_iteration = i
        self._prefill_reqs.append(r)
        self._prefills.append((num_tokens, done))
        self._prefill_tokens += num_tokens
        return True

    @staticmethod
    def _refuse_admit(r, num_tokens):
        if r.status != WAITING:
            raise ValueError(f"admit: {r!r} is not waiting")
        raise ValueError(f"admit: num_tokens must be in 1..{r.prefill_target} for {r!r}, "
                         f"got {num_tokens}")

    def _refuse_chunk(self, r, num_tokens):
        if r.status != PREFILL:
            raise ValueError(f"schedule_chunk: {r!r} is not prefilling")
        if r.scheduled_iteration == self.iteration:
            raise ValueError(f"schedule_chunk: {r!r} already has work in this iteration")
        raise ValueError(f"schedule_chunk: num_tokens must be in "
                         f"1..{r.prefill_target - r.num_computed} for {r!r}, got {num_tokens}")

    def preempt(self, r) -> None:
        """Recompute preemption: free all of ``r``'s blocks; it goes back to the head of the
        queue and will re-prefill its prompt plus the tokens it had generated."""
        i = self.iteration
        bs = self.block_size
        if r.status == DECODE:
            c = self.clock
            self._free_blocks(r, self.decodes.held_blocks(r, c, self._decodes_reserved == c))
            self.decodes.stop(r, c - 1)
        elif r.status == PREFILL:
            held = r.num_computed
            if r.scheduled_iteration == i:  # a victim loses its work in this batch
                k = self._prefill_reqs.index(r)
                new = self._prefills[k][0]
                held += new
                self._prefill_tokens -= new
                del self._prefill_reqs[k], self._prefills[k]
                r.scheduled_iteration = -1
            self._free_blocks(r, -(-held // bs))
            ps = self.prefilling
            k = ps.index(r)
            self.prefilling = ps[:k] + ps[k + 1:]
        else:
            raise ValueError(f"preempt: {r!r} is not running")
        _del_running(self.running, r.index)
        r.status = WAITING
        r.num_computed = 0
        r.prefill_target = r.num_prompt_tokens + r.num_generated
        r.num_preemptions += 1
        self.num_preempted_now += 1
        _enqueue_head(self.waiting, r)

    # -- the engine's side ------------------------------------------------------------------
    def reject(self, r, reason: str) -> None:
        r.status = REJECTED
        r.reason = reason
        r.finish_time = None
        self.finished.append(r)

    def _reserve_decode_blocks(self, i):
        decodes, blocks = self.decodes, self.blocks
        need = decodes.blocks_needed(i)  # blocks the decodes cross into now
        while need > blocks.num_free:
            self.preempt(self.select_victim(self))  # a decode victim takes its need back
            need = decodes.blocks_needed(i)
        if self.caching:
            blocks.allocate(need)
        else:
            blocks.num_free -= need  # BlockManager.allocate, inlined (hot): need <= num_free

    def batch(self, detail: bool = False) -> Batch:
        """Snapshot of this iteration's work; ``detail``: include which requests prefill and
        each decode's id and context length (O(running)). Decodes count only when they run
        this iteration (not in a policy's prefill-only iteration)."""
        i, c = self.iteration, self.clock
        d = self.decodes
        prefill_ids = ids = lengths = None
        running = self.decoding
        if detail:
            prefill_ids = tuple([r.index for r in self._prefill_reqs])
            decoding = [r for r in self.running.values() if r.status == DECODE] if running \
                else []
            ids = tuple([r.index for r in decoding])
            lengths = np.array([d.context_length(r, c) for r in decoding], dtype=np.int64)
            lengths.flags.writeable = False
        return make_batch(i, tuple(self._prefills), self._prefill_tokens,
                          d.count if running else 0, d.context_tokens(c) if running else 0,
                          prefill_ids, ids, lengths, self.num_spec_tokens)

    def run_decodes(self) -> None:
        """For a policy with ``pauses_decodes``: the running decodes run this iteration (their
        blocks reserved now, preempting - SGLang's retraction - while the pool is short);
        without this call the iteration is prefill-only and the decodes wait."""
        if not self.on_demand_decodes or self.decoding:
            return
        self.decoding = True
        c = self.clock
        if self.decodes.blocks_needed(c):
            self._reserve_decode_blocks(c)
        self._decodes_reserved = c

    def form_batch(self, schedule, now, detail: bool = False) -> Batch:
        """One iteration's batch: give every decode the block it crosses into (preempting
        victims - never a decode that already has its block - while the pool is short), let
        ``schedule(self, now)`` (the policy) add prefill work, then snapshot it as
        :meth:`batch` does (inlined: one Python call per iteration is ~1% of the engine's time,
        measured). A policy with ``pauses_decodes`` decides itself: :meth:`run_decodes`."""
        self.now = now
        self.num_preempted_now = 0
        i, c = self.iteration, self.clock
        d = self.decodes
        if self.on_demand_decodes:
            self.decoding = False
            self._decodes_reserved = -1
            schedule(self, now)
            return self.batch(detail)
        k = self.num_spec_tokens  # the decode tracker's totals read inline (hot)
        if d.need[c & d.mask] if k else d.by_phase[c % self.block_size]:
            self._reserve_decode_blocks(c)
        self._decodes_reserved = c
        schedule(self, now)  # (may preempt decodes: their totals are read after it)
        if detail:
            return self.batch(True)
        return make_batch(i, tuple(self._prefills), self._prefill_tokens, d.count,
                          int(d.ctx[c & d.mask]) if k else d.context_offset + d.count * c,
                          None, None, None, k)

    def skip_decodes(self, n: int, need: int, last_start: float) -> None:
        """Apply ``n`` pure-decode iterations at once (the engine's fast-forward): nothing
        waits, nothing prefills, no decode finishes before the last of them or is preempted
        within them, and their decode blocks (``need`` in all) were free. Decode progress is
        lazy, so all that changes is the clocks and the pool: the state equals that after
        ``n`` rounds of :meth:`form_batch` and :meth:`postprocess`, the last one formed at
        ``last_start`` - except the finishes of the last one, if any: the caller's
        :meth:`finish_decodes` then (``clock - 1``)."""
        if self.caching:
            self.blocks.allocate(need)
        else:
            self.blocks.num_free -= need  # BlockManager.allocate, inlined: the caller checked
        if self.num_spec_tokens:  # SpecDecodes' ring entries of these steps freed
            d = self.decodes
            steps = np.arange(self.clock, self.clock + n) & d.mask
            d.ctx[steps] = 0
            d.need[steps] = 0
            if d.clip:  # (tokens left: read at the clock after their step)
                d.left[(steps - 1) & d.mask] = 0
        self.now = last_start
        self.num_preempted_now = 0
        self.decoding = True  # (a policy that pauses decodes ran them: run_decodes)
        self._decodes_reserved = self.clock + n - 1
        self.clock += n
        self.iteration += n

    def postprocess(self, now) -> None:
        """The iteration ended at ``now``: apply its prefill progress, emit tokens, finish
        requests and free their blocks; the decode clock advances if the decodes ran."""
        i, c = self.iteration, self.clock
        bs = self.block_size
        decodes = self.decodes
        running = self.decoding
        completed = False
        for r, (new, _cached) in zip(self._prefill_reqs, self._prefills):
            r.num_computed += new
            r.num_prefill_computed += new
            if self.radix and r.block_keys:
                self._insert(r)
            if r.num_computed < r.prefill_target:
                continue
            completed = True
            r.num_generated += 1  # the prefill's iteration emits a token
            if r.first_token_time is None:
                r.first_token_time = now
            if r.num_generated >= r.num_output_tokens:
                if running:
                    emits_single_token(r, c)
                else:  # a prefill-only iteration: a token outside the decode clock
                    r.segments.append((-1 - i, -1))
                if r.output_keys is not None and self.caching:
                    self._cache_answer(r)
                self._free_blocks(r, -(-r.num_computed // bs))
                _del_running(self.running, r.index)
                self._finish(r, now)
                continue
            if self.on_prefilled is not None:  # disaggregation: hand its KV off
                self._hand_off(r, now)
                continue
            if running:
                decodes.start(r, c)
            else:  # its first token came in a prefill-only iteration: decodes from step c
                decodes.start(r, c - 1)
                r.paused_first = i
        if completed:
            self.prefilling = tuple([r for r in self.prefilling if r.status == PREFILL])
            if self.num_spec_tokens:  # the decodes started now: their vectors into the rings
                decodes.flush()
        if running:
            if c in decodes.finish_at:
                self.finish_decodes(c, now)
            if self.num_spec_tokens:  # SpecDecodes' ring entries of this step freed (hot)
                j = c & decodes.mask
                decodes.ctx[j] = 0
                decodes.need[j] = 0
                if decodes.clip:  # (tokens left: read at the clock after their step)
                    decodes.left[(c - 1) & decodes.mask] = 0
            self.clock = c + 1
        else:
            self.paused.append(i)
        if self._prefill_reqs:
            self._prefill_reqs = []
            self._prefills = []
            self._prefill_tokens = 0
        self.iteration = i + 1

    def finish_decodes(self, c, now) -> None:
        """The decodes emitting their last token at decode step ``c`` (ended at ``now``)
        finish: their blocks are freed (entries of requests preempted since are skipped)."""
        decodes = self.decodes
        freed = 0
        for r in decodes.finish_at.pop(c):
            if r.status == DECODE and r.finish_iteration == c:  # else preempted since
                if self.caching:
                    if r.output_keys is not None:
                        self._cache_answer(r)
                    self._free_blocks(r, decodes.finish(r, c))
                else:
                    freed += decodes.finish(r, c)
                _del_running(self.running, r.index)
                self._finish(r, now)
        self.blocks.free(freed)

    def _finish(self, r, now):
        r.status = FINISHED
        r.finish_time = now
        self.finished.append(r)
        if self.on_finish is not None:
            self.on_finish(r, now)

    # -- disaggregation (sim.engine.fleet.disaggregation): KV leaves one replica for another -------
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

    def __repr__(self):
        counts = {name: 0 for name in STATUS_NAMES}
        for r in self.running.values():
            counts[STATUS_NAMES[r.status]] += 1
        return (f"Replica(iteration={self.iteration}, waiting={len(self.waiting)}, "
                f"prefill={counts['prefill']}, decode={counts['decode']}, {self.blocks!r})")
