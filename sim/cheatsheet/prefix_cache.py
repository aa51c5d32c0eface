"""A token trie for prefix caching (the cheat sheet's ``PrefixCache``).

Each trie node is one token of a cached prefix; ``len(cache)`` counts nodes, so ``max_entries``
is a number of **tokens** (a prefix shared by many sequences counts once), not of sequences.
With the default ``eviction=None`` the cache stops storing once ``max_entries`` tokens are held:
``insert`` returns how many tokens it stored, ``full`` becomes True, ``dropped`` counts the
tokens not stored, and the first time it happens a :class:`PrefixCacheFullWarning` says so.
With ``eviction="lru"`` it makes room by removing the least recently used *leaves* (a prefix is
never cut out of the middle); only a sequence longer than ``max_entries`` is cut (and warned
about). Tokens are any hashable values (token ids); a sequence is any iterable of them.
"""

from __future__ import annotations

import heapq
import itertools
import warnings

from ..checks import positive_int


class _Node:
    __slots__ = ("children", "parent", "token", "last_used", "alive")

    def __init__(self, parent, token, last_used):
        self.children = {}
        self.parent = parent
        self.token = token
        self.last_used = last_used
        self.alive = True


class PrefixCacheFullWarning(UserWarning):
    """A :class:`PrefixCache` had no room for tokens it was asked to store."""


def _tokens(tokens, what) -> tuple:
    if tokens is None or isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__iter__"):
        raise TypeError(f"PrefixCache.{what}: tokens must be a sequence of token ids, got "
                        f"{tokens!r}")
    tokens = tuple(tokens)
    for i, tok in enumerate(tokens):
        try:
            hash(tok)
        except TypeError:
            raise TypeError(f"PrefixCache.{what}: token {i} is {tok!r}, not a hashable token "
                            f"id") from None
    return tokens


class PrefixCache:
    """Longest-prefix lookup over token sequences.

    ``max_entries``: the most tokens (trie nodes) held, >= 1; ``eviction``: ``None`` (stop
    storing when full) or ``"lru"`` (evict least recently used leaves)."""

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
        self.dropped = 0  # tokens asked to be stored that did not fit

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
        tokens = _tokens(tokens, "lookup")
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
        """Store ``tokens`` as a path; return how many tokens were newly stored (fewer than the
        new ones when the cache is full: see the module docstring)."""
        tokens = _tokens(tokens, "insert")
        now = next(self._clock)
        node, stored = self._root, 0
        path = []
        for depth, tok in enumerate(tokens):
            child = node.children.get(tok)
            if child is None:
                if self._size >= self.max_entries and not self._evict_one(protect=path):
                    self._drop(len(tokens) - depth)
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

    def _drop(self, num_tokens):
        if not self.dropped:
            how = ("the sequence is longer than the cache" if self.eviction
                   else "later tokens are not stored; use eviction='lru' or a larger max_entries")
            warnings.warn(f"PrefixCache is full (max_entries={self.max_entries} tokens): {how}",
                          PrefixCacheFullWarning, stacklevel=3)
        self.full = True
        self.dropped += num_tokens

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
