"""A token trie for prefix caching (the cheat sheet's ``PrefixCache``).

Each trie node is one token of a cached prefix; ``len(cache)`` counts nodes. With the default
``eviction=None`` the cache stops storing once ``max_entries`` nodes exist (silently: ``insert``
returns how many tokens it stored and ``full`` becomes True). With ``eviction="lru"`` it makes
room by removing the least recently used *leaves* (a prefix is never cut out of the middle).
"""

from __future__ import annotations

import heapq
import itertools

from ..checks import positive_int


class _Node:
    __slots__ = ("children", "parent", "token", "last_used", "alive")

    def __init__(self, parent, token, last_used):
        self.children = {}
        self.parent = parent
        self.token = token
        self.last_used = last_used
        self.alive = True


class PrefixCache:
    """Longest-prefix lookup over token sequences."""

    def __init__(self, max_entries=1000, eviction=None):
        self.max_entries = positive_int("max_entries", max_entries)
        if eviction not in (None, "lru"):
            raise ValueError(f"eviction must be None or 'lru', got {eviction!r}")
        self.eviction = eviction
        self._root = _Node(None, None, 0)
        self._size = 0
        self._clock = itertools.count(1)
        self._leaves = []  # heap of (last_used, id, node), lazily invalidated
        self.full = False
        self.evictions = 0

    def __len__(self):
        return self._size

    def _touch(self, node, now):
        node.last_used = now
        if not node.children and self.eviction:
            heapq.heappush(self._leaves, (now, id(node), node))
            if len(self._leaves) > 4 * self._size + 64:  # drop stale entries, keep the heap O(size)
                self._leaves = [e for e in self._leaves
                                if e[2].alive and not e[2].children and e[0] == e[2].last_used]
                heapq.heapify(self._leaves)

    def lookup(self, tokens) -> int:
        """Length of the longest cached prefix of ``tokens`` (0 when the first token differs)."""
        now = next(self._clock)
        node, depth = self._root, 0
        for tok in tokens:
            node = node.children.get(tok)
            if node is None:
                break
            depth += 1
            self._touch(node, now)
        return depth

    def insert(self, tokens) -> int:
        """Store ``tokens`` as a path; return how many tokens were newly stored."""
        now = next(self._clock)
        node, stored = self._root, 0
        path = []
        for tok in tokens:
            child = node.children.get(tok)
            if child is None:
                if self._size >= self.max_entries and not self._evict_one(protect=path):
                    self.full = True
                    break
                child = _Node(node, tok, now)
                node.children[tok] = child
                self._size += 1
                stored += 1
            path.append(child)
            node = child
        for n in path:
            self._touch(n, now)
        return stored

    def _evict_one(self, protect) -> bool:
        if self.eviction != "lru":
            return False
        protected = {id(n) for n in protect}
        skipped = []
        found = False
        while self._leaves:
            used, key, node = heapq.heappop(self._leaves)
            if not node.alive or node.children or used != node.last_used:
                continue  # stale entry
            if key in protected:
                skipped.append((used, key, node))
                continue
            parent = node.parent
            del parent.children[node.token]
            node.alive = False
            self._size -= 1
            self.evictions += 1
            if parent is not self._root and not parent.children:
                heapq.heappush(self._leaves, (parent.last_used, id(parent), parent))
            found = True
            break
        for item in skipped:
            heapq.heappush(self._leaves, item)
        return found

    def clear(self):
        self.__init__(self.max_entries, self.eviction)
