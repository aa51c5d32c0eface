"""SGLang's radix prefix cache as a KV pool (``prefix_caching="radix"``).

The tree is token-granular: a prompt's tokens are named by its ``hash_ids`` (one id per ``unit``
tokens, the workload's ``attrs["block_size"]``; see :mod:`workloads.prefix`), and the tree keeps
one node per id's chain key - the whole prefix up to and including that id - holding how many of
the id's ``unit`` tokens are cached (a multiple of the page size ``block_size``; SGLang's
``page_size``, 1 by default). A node's parent is the chain key before it; a node has children
only once all its ``unit`` tokens are cached.

Rules (SGLang v0.4 ``mem_cache/radix_cache.py``; the engine in :mod:`sim.engine.core.replica`):
- a match walks the request's chain keys from the root and takes every cached token, capped at
  ``prompt - 1`` tokens rounded down to a page (the last token is computed for its logits);
- a running request references (``lock_ref``) every node of its cached path, from the root;
  referenced nodes are never evicted;
- a request's computed prompt tokens enter the tree after each prefill chunk (SGLang's
  ``cache_unfinished_req``) - not when scheduled, so requests in the same batch do not share;
  where the tree already holds tokens the request also computed, its own copy is freed at once;
- unreferenced cached tokens count as free (SGLang's ``available + evictable``); a new
  allocation takes truly free pages first, then evicts whole unreferenced leaves, least
  recently used first (``evict``); a parent whose last child goes becomes a leaf.

Deviations: SGLang splits nodes where two prompts diverge and evicts whole nodes; here the
nodes are the hash ids' spans (``unit`` tokens), so eviction frees at most ``unit`` tokens at a
time and a partial match references the whole node it ends in (where that would keep a
request out for good - pinned over its run it would take more than the pool - the replica
leaves the node unreferenced: matched tokens are computed again, and a prompt ending inside
the node keeps its own tokens there; ``Replica._admit_cached``, ``Replica._insert``).

A finished turn of a conversation caches its answer too (SGLang's ``cache_finished_req``
inserts ``(req.origin_input_ids + req.output_ids)[:-1]``): its prompt and output less the last
token enter the tree under the names its conversation's next turn gives them
(``Request.output_keys``, :func:`workloads.prefix.answer_unit_keys`). A prompt ending inside a
node names that node by its own partial id, which the next turn's full id does not match: the
node, when only that request made and holds it, gives way (:meth:`unlink`) to the next turn's,
whose tokens are the same and continue into the answer; otherwise the answer stays uncached.

Invariants (tests/test_radix.py checks them every iteration of random runs):
``num_free == truly free pages + evictable``, ``evictable`` = pages of unreferenced nodes;
``num_free + pages of referenced nodes + requests' own pages == num_blocks``; a node's
``cached`` tokens are a multiple of ``block_size`` and at most ``unit``.
"""

from __future__ import annotations

import heapq
from itertools import compress, islice, repeat, takewhile
from functools import partial
from operator import eq, not_

from .blocks import BlockManager


class RadixBlockManager(BlockManager):
    """The pool with SGLang's radix cache (see the module docstring)."""

    __slots__ = ("unit", "_len", "_parent", "_kids", "_ref", "_stamp", "_heap", "_tick",
                 "evictable", "num_evictions", "ref_changes",
                 "additions")

    def __init__(self, num_blocks: int, block_size: int, unit: int):
        super().__init__(num_blocks, block_size)
        if unit % self.block_size:
            raise ValueError(f"prefix_caching='radix' needs the workload's tokens per hash id "
                             f"(attrs['block_size']={unit}) to be a multiple of "
                             f"block_size={self.block_size}")
        self.unit = unit
        self._len = {}  # node (chain key) -> cached tokens of its span
        self._parent = {}  # node -> parent node (None: a child of the root)
        self._kids = {}  # node -> cached children
        self._ref = {}  # node -> running requests referencing it
        self._stamp = {}  # node -> last access tick
        self._heap = []  # (stamp, node) of unreferenced leaves; stale entries skipped
        self._tick = 0
        self.evictable = 0  # pages of unreferenced nodes (counted in num_free)
        self.num_evictions = 0  # pages evicted (a cached prefix only shrinks by evictions)
        self.ref_changes = 0  # acquires and releases: which cached pages are free changes
        self.additions = 0  # insertions: a cached prefix only grows by them

    def match(self, keys, limit: int, m: int = 0, n: int = 0) -> tuple:
        """``(tokens, nodes)``: the cached prefix of the chain ``keys``, at most ``limit`` tokens
        (a multiple of ``block_size``), and how many nodes it touches (the last may be used in
        part); resumed from a previous answer ``(m, n)`` still cached (nodes only grow)."""
        lens, unit = self._len, self.unit
        if n and m < n * unit:  # the last node was used in part: it may have grown
            n -= 1
            m = n * unit
        # whole nodes while they fit under the limit (a C-level walk), then at most one in part
        room = max(0, (limit - m) // unit)
        full = len(list(takewhile(partial(eq, unit), map(lens.get, islice(keys, n, n + room)))))
        m += full * unit
        n += full
        if m < limit and n < len(keys):
            cached = lens.get(keys[n])
            if cached:
                m += min(cached, limit - m)
                n += 1
        return m, n

    def pinned(self, keys, n: int) -> int:
        """Pages of the first ``n`` nodes of ``keys`` nobody references (referencing them takes
        them out of the free count)."""
        nodes = keys[:n]
        free = compress(nodes, map(not_, map(self._ref.__getitem__, nodes)))
        return sum(map(self._len.__getitem__, free)) // self.block_size

    def acquire(self, nodes) -> None:
        """A request references ``nodes`` (its matched path, root first)."""
        self.ref_changes += 1
        if not nodes:  # (a request without hash ids: nothing to reference)
            return
        ref = self._ref
        counts = list(map(ref.__getitem__, nodes))
        free = [c for c, k in zip(nodes, counts) if not k]
        if free:  # unreferenced until now: no longer free
            pages = sum(map(self._len.__getitem__, free)) // self.block_size
            self.num_free -= pages
            self.evictable -= pages
        ref.update(zip(nodes, [k + 1 for k in counts]))
        self._stamp.update(zip(nodes, self._ticks(len(nodes))))

    def _ticks(self, n: int) -> range:
        """The next ``n`` access ticks, in order."""
        start = self._tick + 1
        self._tick += n
        return range(start, start + n)

    def insert(self, keys, held: list, covered: int, upto: int) -> int:
        """A request holding the nodes ``held`` (its path, covering its first ``covered``
        tokens) has computed its named tokens up to ``upto`` (a multiple of the page): they
        enter the tree, its new nodes referenced and appended to ``held``. Pages it computed
        that the tree already holds are freed (its own copy). Returns the tokens now covered."""
        self.additions += 1
        unit, bs = self.unit, self.block_size
        lens, ref = self._len, self._ref
        k = covered // unit
        while covered < upto:
            c = keys[k]
            start = k * unit
            end = min(upto, start + unit)
            cached = lens.get(c)
            if cached is None:  # a new node under the last one held
                parent = keys[k - 1] if k else None
                lens[c] = end - start
                self._parent[c] = parent
                self._kids[c] = 0
                if parent is not None:
                    self._kids[parent] += 1
                ref[c] = 1
                self._tick += 1
                self._stamp[c] = self._tick
                held.append(c)
            else:
                if covered == start:  # first touch of this node: reference it
                    self.acquire((c,))
                    held.append(c)
                have = start + cached
                duplicate = max(0, min(have, end) - covered)
                self.num_free += duplicate // bs
                if have < end:
                    lens[c] = end - start
            covered = end
            k += 1
        return covered

    def is_own_leaf(self, c, tokens: int) -> bool:
        """Whether node ``c`` holds exactly ``tokens`` tokens, all of one request's making:
        one reference (the asker's), no children."""
        return self._ref.get(c) == 1 and not self._kids[c] and self._len[c] == tokens

    def unlink(self, c) -> None:
        """Take the node ``c`` (an own leaf: :meth:`is_own_leaf`) out of the tree: its pages
        go back to the request that referenced it, as its own. A cached prefix shrinks, so it
        counts as an eviction for the lookups' memos."""
        pages = self._len.pop(c) // self.block_size
        del self._ref[c], self._kids[c], self._stamp[c]
        parent = self._parent.pop(c)
        if parent is not None:
            self._kids[parent] -= 1
        self.num_evictions += pages

    def release(self, held, num_own: int) -> None:
        """A request frees its ``num_own`` own pages and its references on ``held`` (root
        first; each node's access time is refreshed in that order, as SGLang's final insert
        does); a node nobody references any more counts as free, and as a leaf joins the
        eviction queue."""
        self.ref_changes += 1
        self.free(num_own)
        if not held:
            return
        ref = self._ref
        counts = [ref[c] - 1 for c in held]
        ref.update(zip(held, counts))
        ticks = self._ticks(len(held))
        self._stamp.update(zip(held, ticks))
        unused = [(t, c) for c, k, t in zip(held, counts, ticks) if not k]
        if unused:
            pages = sum(self._len[c] for _, c in unused) // self.block_size
            self.num_free += pages
            self.evictable += pages
            kids = self._kids
            for entry in unused:
                if not kids[entry[1]]:  # a leaf: evictable
                    heapq.heappush(self._heap, entry)
            if len(self._heap) > 4 * len(self._len) + 64:
                self._compact()

    def allocate(self, n: int) -> None:
        """Take ``n`` free pages: truly free ones first, then evict unreferenced leaves, least
        recently used first."""
        if n > self.num_free or n < 0:
            raise RuntimeError(f"allocating {n} KV blocks with {self.num_free} free")
        short = n - (self.num_free - self.evictable)
        while short > 0:
            short -= self._evict_one()
        self.num_free -= n

    def _evict_one(self) -> int:
        heap, lens, ref, kids, stamp = self._heap, self._len, self._ref, self._kids, self._stamp
        while True:
            s, c = heapq.heappop(heap)  # IndexError only on a broken count: a bug
            if c in lens and not ref[c] and not kids[c] and stamp[c] == s:
                break
        pages = lens.pop(c) // self.block_size
        del ref[c], kids[c], stamp[c]
        parent = self._parent.pop(c)
        if parent is not None:
            kids[parent] -= 1
            if not kids[parent] and not ref[parent]:
                heapq.heappush(heap, (stamp[parent], parent))
        self.evictable -= pages
        self.num_evictions += pages
        return pages

    def _compact(self):
        lens, ref, kids, stamp = self._len, self._ref, self._kids, self._stamp
        self._heap = [(s, c) for s, c in self._heap
                      if c in lens and not ref[c] and not kids[c] and stamp[c] == s]
        heapq.heapify(self._heap)

    def pages_of(self, nodes) -> int:
        """Pages the tree holds for ``nodes`` (a node not in the tree holds none)."""
        return sum(map(self._len.get, nodes, repeat(0))) // self.block_size

    def referenced_pages(self) -> int:
        """Pages of nodes some running request references (O(tree): for checks)."""
        return sum(v for c, v in self._len.items() if self._ref[c]) // self.block_size

    def __repr__(self):
        return (f"RadixBlockManager({self.num_free} of {self.num_blocks} pages free, "
                f"{len(self._len)} nodes, block_size={self.block_size}, unit={self.unit})")
