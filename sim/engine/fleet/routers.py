"""Routers: which replica of a cluster serves an arriving request.

A router is any callable ``route(request, replicas, now) -> index``: ``request`` is the
arriving :class:`~sim.engine.core.request.Request` (read it, never change it), ``replicas`` a tuple
of :class:`ReplicaView` (read-only: counts and the prefix-cache lookup of one live replica,
computed when read), ``now`` the arrival time. The engine calls it once per request, at the
request's arrival, and queues the request at ``replicas[index]``. The named routers
(:data:`ROUTERS`, the names ``SimConfig.router`` and ``--router`` accept):

- ``round_robin``: replicas in turn (``i mod N``), blind to load;
- ``random``: uniform, from a ``numpy`` generator seeded by ``SimConfig.seed`` (a run is still
  deterministic);
- ``least_outstanding``: fewest queued + running requests (vLLM production stack's and llm-d's
  queue-length scorers);
- ``least_kv``: most free KV blocks;
- ``prefix_affinity``: the replica whose prefix cache holds the longest leading run of the
  request's prompt blocks, read from the replicas' caches as they are (llm-d's precise prefix
  scorer, fed by the engines' KV events), falling back to ``least_outstanding`` when no replica
  holds any or when the best one has more than ``max_imbalance`` outstanding requests beyond
  the least loaded;
- ``cache_aware``: SGLang's router (:class:`CacheAware`): what it has routed where, recorded
  at routing time in an approximate tree per replica, not what the replicas computed - so a
  burst of one prompt stays on one replica before any of it is cached.

Ties go to the lowest index. Each run builds its named router anew (:func:`make_router`), so
stateful routers (round robin's counter, random's generator) never carry state between runs;
a :class:`RoundRobin` or :class:`Random` instance passed in (or one of a subclass) is copied
fresh the same way, its counter at 0, its generator from its seed (an int or a sequence of
ints: ``Random(seed=...)``, the seed in its repr, as a sweep's grid needs). Any
other callable passed in is used as is; so is the ``route`` method of an object that has one
(``SimConfig(router=MyRouter())``, ``class MyRouter: def route(self, request, replicas, now)``).
A :class:`CacheAware` instance (how its thresholds are set) keeps its trees per pool of
replicas, so it too starts each run empty.
"""

from __future__ import annotations

import copy
import weakref
from collections import OrderedDict

import numpy as np

from ...checks import did_you_mean


class ReplicaView:
    """What a router may read of one replica (attributes computed from the live replica when
    read; nothing can be written through it)."""

    __slots__ = ("_replica", "index")

    def __init__(self, replica, index: int):
        self._replica = replica
        self.index = index

    @property
    def num_waiting(self) -> int:
        return len(self._replica.waiting)

    @property
    def num_running(self) -> int:
        return len(self._replica.running)

    @property
    def num_outstanding(self) -> int:
        """Requests routed here and not finished: queued, running and, on a disaggregated
        run's decode replica, routed here whose KV has not landed yet (waiting for room or on
        the link: ``num_incoming``)."""
        rep = self._replica
        return len(rep.waiting) + len(rep.running) + rep.num_incoming

    @property
    def num_free_blocks(self) -> int:
        return self._replica.blocks.num_free

    @property
    def num_blocks(self) -> int:
        return self._replica.blocks.num_blocks

    @property
    def max_batch_size(self) -> int:
        return self._replica.max_batch_size

    @property
    def tokens_per_key(self) -> int:
        """Prompt tokens each of a request's ``block_keys`` stands for here: a KV block
        (block-hash caching), a hash id's span (radix caching)."""
        rep = self._replica
        return rep.blocks.unit if rep.radix else rep.block_size

    def prefix_hit(self, request) -> int:
        """Prompt tokens of ``request`` this replica's prefix cache would serve now (0 without
        prefix caching or without ``hash_ids``)."""
        return self._replica.prefix_hit(request, remember=False)

    def __repr__(self):
        return (f"ReplicaView({self.index}, outstanding={self.num_outstanding}, "
                f"free_blocks={self.num_free_blocks})")


class RoundRobin:
    """Replicas in turn: the k-th request goes to replica ``k mod N``."""

    name = "round_robin"

    def __init__(self):
        self.next = 0

    def __repr__(self):  # (a sweep keys grid values by repr)
        return f"{type(self).__name__}()"

    def __call__(self, request, replicas, now) -> int:
        i = self.next % len(replicas)
        self.next = i + 1
        return i


class Random:
    """A uniformly random replica, from ``numpy.random.default_rng(seed)``."""

    name = "random"

    def __init__(self, seed=0):
        self.seed = _seed(seed)
        self.rng = np.random.default_rng(self.seed)

    def __repr__(self):  # its seed: how a sweep tells two grid values apart
        return f"{type(self).__name__}(seed={self.seed!r})"

    def __call__(self, request, replicas, now) -> int:
        return int(self.rng.integers(len(replicas)))


def _seed(seed):
    """``seed`` as an int >= 0 or a list of them (what a fresh copy and the decode pool's
    stream re-seed from); else a ``TypeError``: not None (fresh entropy: a run would not
    repeat), nor a ``Generator`` or ``SeedSequence`` (state every copy would share)."""
    items = list(seed) if isinstance(seed, (list, tuple)) else [seed]
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0
               for v in items) or not items:
        raise TypeError(f"Random seed must be an int >= 0 or a sequence of them (a run "
                        f"repeats from its seed), got {seed!r}")
    items = [int(v) for v in items]
    return items if isinstance(seed, (list, tuple)) else items[0]


def least_outstanding(request, replicas, now) -> int:
    """The replica with the fewest outstanding requests, ``ReplicaView.num_outstanding``:
    queued + running (+ on a decode replica those whose KV has not landed); lowest index on
    ties."""
    best, best_load = 0, None
    for v in replicas:
        load = v.num_outstanding
        if best_load is None or load < best_load:
            best, best_load = v.index, load
    return best


def least_kv(request, replicas, now) -> int:
    """The replica with the most free KV blocks (lowest index on ties)."""
    best, best_free = 0, None
    for v in replicas:
        free = v.num_free_blocks
        if best_free is None or free > best_free:
            best, best_free = v.index, free
    return best


class PrefixAffinity:
    """The replica caching the longest prefix of the request, unless it is overloaded.

    ``max_imbalance``: the best-hit replica is skipped (``least_outstanding`` decides) when it
    has more than this many outstanding requests beyond the least loaded replica (SGLang's
    cache-aware router balances the same way, on an absolute queue-length threshold).
    """

    name = "prefix_affinity"

    def __init__(self, max_imbalance: int = 32):
        if isinstance(max_imbalance, bool) or not isinstance(max_imbalance, int) \
                or max_imbalance < 0:
            raise ValueError(f"max_imbalance must be an int >= 0, got {max_imbalance!r}")
        self.max_imbalance = max_imbalance

    def __repr__(self):  # its settings: how a sweep tells two grid values apart
        return f"PrefixAffinity(max_imbalance={self.max_imbalance})"

    def __call__(self, request, replicas, now) -> int:
        loads = [v.num_outstanding for v in replicas]
        least = min(loads)
        best, best_hit = -1, 0
        for v in replicas:
            hit = v.prefix_hit(request)
            if hit > best_hit and loads[v.index] <= least + self.max_imbalance:
                best, best_hit = v.index, hit
        return best if best >= 0 else loads.index(least)


class CacheAware:
    """SGLang's cache-aware router (``--policy cache_aware``, its default), rule by rule from
    sgl-project/sglang@026f853b ``sgl-router/src/policies/cache_aware.rs``
    (``select_worker``), defaults from @b1018cbe
    ``sgl-router/py_src/sglang_router/launch_router.py`` (``RouterArgs``):

    1. loads are the requests routed to each replica and not finished; the fleet is
       imbalanced when ``max - min > balance_abs_threshold`` (32) and ``max > min *
       balance_rel_threshold`` (1.0001): then the least loaded replica serves the request;
    2. else the replica whose approximate tree matches the longest prefix of the request
       serves it if the matched fraction exceeds ``cache_threshold`` (0.5), else the replica
       with the smallest tree (the most cache room, as the router sees it);
    3. either way the request's prefix is recorded in the chosen replica's tree, at routing
       time: the router never reads the replicas' caches (a match at or below the threshold
       still marks the matched path as used in its tree, as SGLang's ``prefix_match`` does);
    4. every ``eviction_interval`` seconds (60) each tree drops its least recently used leaves
       until it holds at most ``max_tree_tokens``.

    Modelled on the simulator's block keys (the request's full prompt blocks, ids that name
    their whole prefix; none when prefix caching is off or the workload has no ``hash_ids``):
    the matched fraction is the matched keys' tokens (``tokens_per_key`` each: a KV block, or
    in radix mode a hash id's span, capped at the prompt) over the whole prompt's tokens, where
    SGLang's is of the prompt's characters (it keeps raw text, not tokens) - so a prompt's
    unkeyed tail or unnamed tokens count as unmatched, as SGLang's unmatched text does; tree
    sizes count keys. Eviction runs at the ticks ``k * eviction_interval`` (applied at the
    first request after a tick: between requests the trees do not change).
    ``max_tree_tokens`` defaults to SGLang's ``max_tree_size`` of 2**24 characters at 4
    characters a token (an assumption: 2**22 tokens). Ties go to the less loaded replica, then the lower index
    (SGLang's tree picks any tenant of the deepest match).

    One instance (``SimConfig(router=CacheAware(cache_threshold=0.3))``) keeps one set of
    trees per pool of replicas it routes for: each run starts empty (nothing carried from an
    earlier run with the same instance), and a disaggregated run's prefill and decode pools,
    which call the same instance, each have their own (``trees``: the last pool routed for).
    """

    name = "cache_aware"

    def __init__(self, cache_threshold: float = 0.5, balance_abs_threshold: int = 32,
                 balance_rel_threshold: float = 1.0001, eviction_interval: float = 60.0,
                 max_tree_tokens: int = 2 ** 22):
        for field, value, low in (("cache_threshold", cache_threshold, 0.0),
                                  ("balance_rel_threshold", balance_rel_threshold, 1.0),
                                  ("eviction_interval", eviction_interval, 0.0)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not low <= value < float("inf") \
                    or (field == "cache_threshold" and value > 1):
                bound = "in [0, 1]" if field == "cache_threshold" else f">= {low:g}, finite"
                raise ValueError(f"{field} must be a number {bound}, got {value!r}")
        for field, value in (("balance_abs_threshold", balance_abs_threshold),
                             ("max_tree_tokens", max_tree_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{field} must be an int >= 0, got {value!r}")
        self.cache_threshold = float(cache_threshold)
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = float(balance_rel_threshold)
        self.eviction_interval = float(eviction_interval)
        self.max_tree_tokens = max_tree_tokens
        self.trees = None  # per replica: block key -> None, least recently used first
        # per pool of replicas (keyed by its first replica, weakly): [trees, next eviction]
        self._pools = weakref.WeakKeyDictionary()

    def __repr__(self):  # its settings: how a sweep tells two grid values apart
        return (f"CacheAware(cache_threshold={self.cache_threshold!r}, "
                f"balance_abs_threshold={self.balance_abs_threshold}, "
                f"balance_rel_threshold={self.balance_rel_threshold!r}, "
                f"eviction_interval={self.eviction_interval!r}, "
                f"max_tree_tokens={self.max_tree_tokens})")

    def __getstate__(self):  # pickled (a sweep's worker process): the settings, no trees
        state = dict(self.__dict__, trees=None)
        del state["_pools"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state, _pools=weakref.WeakKeyDictionary())

    def __call__(self, request, replicas, now) -> int:
        pool = self._pools.get(replicas[0]._replica)
        if pool is None:  # a new run, or a disaggregated run's other pool: trees of its own
            pool = self._pools[replicas[0]._replica] = [[OrderedDict() for _ in replicas],
                                                        self.eviction_interval]
        self.trees = pool[0]
        if self.eviction_interval and now >= pool[1]:
            self._evict(replicas)  # at the last tick due: SGLang's thread ticks every interval
            pool[1] = (now // self.eviction_interval + 1) * self.eviction_interval
        loads = [v.num_outstanding for v in replicas]
        high, low = max(loads), min(loads)
        keys = request.block_keys
        keys = () if keys is None else keys.tolist() if hasattr(keys, "tolist") else keys
        if high - low > self.balance_abs_threshold and high > low * self.balance_rel_threshold:
            best = loads.index(low)  # rule 1
        else:
            matched = [_matched(tree, keys) for tree in self.trees]
            top = max(matched)
            prompt = request.num_prompt_tokens  # the rate is of the whole prompt, as SGLang's
            hit = min(top * replicas[0].tokens_per_key, prompt)  # (a pool shares one unit)
            held = min((loads[i], i) for i, m in enumerate(matched) if m == top)[1]
            if keys and hit / prompt > self.cache_threshold:  # rule 2
                best = held
            else:
                best = min((len(t), loads[i], i) for i, t in enumerate(self.trees))[2]
                # SGLang's match refreshes the matched path, though it routes elsewhere
                _touch(self.trees[held], keys[:top])
        _touch(self.trees[best], keys)  # rule 3
        return best

    def _evict(self, replicas):
        """Rule 4: least recently used blocks out until each tree is within its size."""
        for tree, v in zip(self.trees, replicas):
            limit = self.max_tree_tokens // v.tokens_per_key
            while len(tree) > limit:
                tree.popitem(last=False)


def _touch(tree, keys):
    """Record ``keys`` in ``tree`` as just used, leaves first: a prefix is never older than
    what extends it, so the least recently used key is a leaf."""
    for key in reversed(keys):
        tree[key] = None
        tree.move_to_end(key)


def _matched(tree, keys) -> int:
    """How many of ``keys`` lead the prefix ``tree`` holds (prefix-closed: a block is used
    no earlier than its prefix, so the held ones come first: binary search)."""
    lo, hi = 0, len(keys)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if keys[mid - 1] in tree:
            lo = mid
        else:
            hi = mid - 1
    return lo


ROUTERS = {
    "round_robin": RoundRobin,
    "random": Random,
    "least_outstanding": lambda: least_outstanding,
    "least_kv": lambda: least_kv,
    "prefix_affinity": PrefixAffinity,
    "cache_aware": CacheAware,
}


def check_router(router) -> None:
    """Raise unless ``router`` is a name in :data:`ROUTERS`, a callable, or an object with a
    ``route(request, replicas, now)`` method."""
    if isinstance(router, str):
        if router.strip().lower() not in ROUTERS:
            raise ValueError(f"router must be one of {sorted(ROUTERS)} or a callable "
                             f"route(request, replicas, now) -> index, got {router!r}"
                             f"{did_you_mean(router, list(ROUTERS))}")
    elif not callable(router) and not callable(getattr(router, "route", None)):
        raise TypeError(f"router must be a name in {sorted(ROUTERS)}, a callable "
                        f"route(request, replicas, now) -> index or an object with that "
                        f"route method, got {router!r}")


def make_router(router, seed: int = 0, stream: int = 0):
    """A fresh router for one pool of one run (``stream`` 1: a disaggregated run's decode
    pool): a name from :data:`ROUTERS` (``random`` seeded by ``seed``, ``[seed, stream]`` for
    a pool other than the first), a fresh copy of a :class:`RoundRobin` or :class:`Random`
    instance given, or of one of a subclass (its counter at 0, its generator from its own
    seed, so a run never goes on from where an earlier run with the instance stopped), else
    the callable given or the ``route`` method of the object given."""
    check_router(router)
    if isinstance(router, (RoundRobin, Random)):  # (a subclass too: a copy, its state reset)
        fresh = copy.copy(router)
        if isinstance(router, RoundRobin):
            fresh.next = 0
        else:
            fresh.rng = np.random.default_rng(_stream(router.seed, stream))
        return fresh
    if not isinstance(router, str):
        return router if callable(router) else router.route
    name = router.strip().lower()
    return Random(_stream(seed, stream)) if name == "random" else ROUTERS[name]()


def _stream(seed, stream: int):
    """``seed`` for the first pool, else a seed sequence of its own per ``stream``."""
    if not stream:
        return seed
    return [*seed, stream] if isinstance(seed, (list, tuple)) else [seed, stream]


def router_name(router) -> str:
    if isinstance(router, str):
        return router.strip().lower()
    return getattr(router, "name", None) or getattr(router, "__name__", type(router).__name__)
