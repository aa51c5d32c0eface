"""One serving replica's state, and the few verbs a batching policy acts through.

The replica owns the waiting queue, the running set (admission order, oldest first), the KV
pool (:class:`~sim.engine.kv.blocks.BlockManager`) and the decoding requests
(:class:`~sim.engine.core.decoding.Decodes`). A policy (:mod:`sim.engine.core.policies`) sees
the queue and the running set read-only and changes them only through these verbs:

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

:class:`Replica` is this module's state, reads and policy verbs plus three base classes, one
per concern: :class:`~sim.engine.core.iteration.Iteration` (the engine's side: ``form_batch``,
``postprocess``, ``skip_decodes``), :class:`~sim.engine.core.handoff.KVHandoff` (disaggregation's
verbs) and :class:`~sim.engine.kv.prefix_hits.PrefixHits` (the prefix-cache lookups); the
queue and running set views are :mod:`sim.engine.core.queues`.

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

try:
    import cython
except ImportError:  # interpreted without Cython: its no-op names (sim/cython_shim.py)
    from sim import cython_shim as cython

from functools import partial

import numpy as np

from ..kv.blocks import BlockManager, blocks_for
from ..kv.offload import OffloadingBlockManager
from ..kv.prefix_cache import PrefixCachingBlockManager
from ..kv.prefix_hits import PrefixHits
from ..kv.radix import RadixBlockManager
from .decoding import ClippedDecodes, Decodes
from .handoff import KVHandoff
from .iteration import Iteration
from .queues import RunningSet, WaitingQueue, _dequeue, _dequeue_head, _enqueue, _enqueue_head
from .request import DECODE, PREFILL, STATUS_NAMES, WAITING, Request
from .spec_decoding import SpecDecodes
from .windowed_decodes import WindowedClippedDecodes, WindowedDecodes

_NO_KEYS = np.zeros(0, dtype=np.int64)  # block mode: the keys of a request without hash ids


def newest_running(replica):
    """The default victim: the most recently admitted running request (vLLM, Sarathi)."""
    running = replica.running
    return running[next(reversed(running))]


class Replica(Iteration, KVHandoff, PrefixHits):
    """State of one replica; see the module docstring for the verbs and invariants."""

    def __init__(self, kv_blocks, block_size, max_batch_size, select_victim=None,
                 prefix_caching=False, speculative=None, draw=None, cache_unit=None,
                 clip_left=None, offload=None, layers=None):
        # prefix_caching: False, "block" (True) or "radix"; cache_unit: the workload's tokens
        # per hash id (radix mode's node span); clip_left: keep the decodes' tokens left, each
        # clipped to it, summed (decoding.ClippedDecodes; a policy's clip_left, SGLang's)
        self.caching = bool(prefix_caching)
        self.radix = prefix_caching == "radix"
        # waiting request -> its lookup memo (_hit): block mode a blocks.PrefixLookup, radix
        # mode (evictions, additions, target, (hit, nodes))
        self._hits = {}
        self._pins = {}  # radix mode: waiting request -> (state, free pages its hit holds)
        # offload: a kv.offload.OffloadTier / kv.tiers.TierChain under the prefix cache (radix:
        # kv.radix_tiers; hits loaded: handoff.KVHandoff._admit_loading), None without
        self.tier = offload if self.caching else None
        self.lora = None  # kv.lora.AdapterSlots: LoRA adapters' admission gate (use_lora)
        self.num_loading = 0  # requests waiting for their blocks to load from the tier
        self.on_load = None  # callback(request, seconds, start): the process lands it then
        if self.tier is not None:
            self.blocks = getattr(self.tier, "manager", OffloadingBlockManager)(
                kv_blocks, block_size, self.tier)  # (kv.tiers: a chain's own)
        elif self.radix:
            self.blocks = RadixBlockManager(kv_blocks, block_size, cache_unit or block_size)
        else:
            self.blocks = (PrefixCachingBlockManager if self.caching else BlockManager)(
                kv_blocks, block_size)
        self.block_size = self.blocks.block_size
        self.max_batch_size = max_batch_size
        # layers: a kv.layer_groups.LayerPool (windowed or linear layers: each request's
        # blocks per layer kind, core.windowed_decodes), None: one block per block_size tokens
        self.layers = layers
        # speculative decoding: k draft tokens verified per decode, emissions from draw(r, n)
        self.num_spec_tokens = speculative.num_speculative_tokens if speculative else 0
        if layers is not None:
            self.decodes = (WindowedClippedDecodes(self.block_size, clip_left, layers)
                            if clip_left else WindowedDecodes(self.block_size, layers))
        elif speculative:
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
        self.capacity_tokens = (self.blocks.capacity_tokens if layers is None
                                else layers.capacity_tokens(self.blocks.num_blocks))
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
        """Output tokens ``r`` emitted before this iteration (a decode's too, tracked lazily)."""
        if r.status == DECODE:
            return self.decodes.generated(r, self.clock - 1)
        return r.num_generated

    def is_scheduled(self, r) -> bool:
        """Whether ``r`` already has prefill work in this iteration."""
        return r.scheduled_iteration == self.iteration

    @cython.locals(r=Request, c=cython.longlong)
    def held_blocks(self, r) -> int:
        """Blocks ``r`` holds now: a decode, including the block it crosses into this
        iteration once reserved; a prefill, including those taken for its work this iteration."""
        if r.status == DECODE:
            c = self.clock
            return self.decodes.held_blocks(r, c, self._decodes_reserved == c)
        return self.blocks_of(r.num_computed + self._scheduled_tokens(r))

    def blocks_of(self, tokens: int) -> int:
        """Blocks a request with ``tokens`` tokens in its cache holds (its layer pool's, else
        ``ceil(tokens / block_size)``)."""
        if self.layers is not None:
            return self.layers.held(tokens)
        return blocks_for(tokens, self.block_size)

    def _scheduled_tokens(self, r) -> int:
        if r.scheduled_iteration != self.iteration:
            return 0
        return self._prefills[self._prefill_reqs.index(r)][0]

    # -- the verbs ----------------------------------------------------------------------------
    @cython.locals(r=Request, num_tokens=cython.longlong, blocks=cython.longlong)
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
        blocks = (-(-num_tokens // self.block_size) if self.layers is None  # blocks_for,
                  else self.layers.held(num_tokens))  # inlined (hot)
        if blocks > self.blocks.num_free:
            return False
        self._dequeue(r)
        self.blocks.num_free -= blocks  # BlockManager.allocate, inlined (hot): checked above
        self._start(r, num_tokens, 0)
        return True

    def use_lora(self, slots) -> None:
        """Serve LoRA adapters with ``slots`` (a :class:`~sim.engine.kv.lora.AdapterSlots`):
        from now on :meth:`admit` also refuses a request whose adapter can get no GPU slot."""
        self.lora = slots
        setattr(self, "admit", self._admit_lora)  # (over the class's: no check when off)

    def _admit_lora(self, r, num_tokens):
        slots = self.lora
        if r.status == WAITING and not slots.ready(r):
            return False
        if not Replica.admit(self, r, num_tokens):
            return False
        slots.take(r)
        return True

    @cython.locals(r=Request)
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

    @cython.locals(r=Request, new=cython.longlong, cached=cython.longlong)
    def _start(self, r, new, cached):
        """``r`` joins the running set, prefilling ``new`` tokens after ``cached`` ones now."""
        r.status = PREFILL
        if r.first_scheduled_time is None:
            r.first_scheduled_time = self.now
            r.num_cached_tokens = cached
        self._run(r)
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
        if len(self.running) + self.num_loading >= self.max_batch_size:
            return False
        blocks = self.blocks
        if self.tier is not None and keys is not None:  # the blocks after the hit, offloaded
            loaded = self._tier_hit(r, cached, nodes)
            if loaded:
                return self._admit_loading(r, nodes, loaded)
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

    @cython.locals(r=Request)
    def _free_blocks(self, r, n):
        """``r`` gives back its ``n`` blocks (its cached ones keep their keys, in the LRU)."""
        if self.caching:  # its own blocks: all but the cached ones it references
            shared = r.tree_tokens // self.block_size if self.radix else len(r.kv_keys)
            self.blocks.release(r.kv_keys, n - shared)
            r.kv_keys = ()
            r.tree_tokens = 0
        else:
            self.blocks.free(n)

    @cython.locals(r=Request, num_tokens=cython.longlong, need=cython.longlong,
                   done=cython.longlong, i=cython.longlong, bs=cython.longlong)
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
        if self.layers is None:
            need = -(-(done + num_tokens) // bs) - (-(-done // bs))  # blocks_for, inlined (hot)
        else:  # (< 0 where the chunk's window leaves more blocks behind than it takes)
            need = self.layers.held(done + num_tokens) - self.layers.held(done)
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

    @cython.locals(r=Request, held=cython.longlong, new=cython.longlong)
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
            self._free_blocks(r, -(-held // bs) if self.layers is None
                              else self.layers.held(held))
            ps = self.prefilling
            k = ps.index(r)
            self.prefilling = ps[:k] + ps[k + 1:]
        else:
            raise ValueError(f"preempt: {r!r} is not running")
        self._unrun(r.index)
        r.status = WAITING
        r.num_computed = 0
        r.prefill_target = r.num_prompt_tokens + r.num_generated
        r.num_preemptions += 1
        self.num_preempted_now += 1
        if self.lora is not None:
            self.lora.release(r)
        _enqueue_head(self.waiting, r)

    def __repr__(self):
        counts = {name: 0 for name in STATUS_NAMES}
        for r in self.running.values():
            counts[STATUS_NAMES[r.status]] += 1
        return (f"Replica(iteration={self.iteration}, waiting={len(self.waiting)}, "
                f"prefill={counts['prefill']}, decode={counts['decode']}, {self.blocks!r})")
