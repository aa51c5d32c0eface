"""What one offload tier holds: the block keys it keeps and which it evicts (LRU or ARC).

A store is a tier's contents, nothing else: ``key in store``, :meth:`LRUStore.insert` (keys
enter; returns how many were new and the keys it evicted to make room, oldest first) and
:meth:`LRUStore.touch` (keys were read: a hit). The chain (:mod:`sim.engine.kv.tiers`) moves
the evicted keys down and counts the bytes.

- **LRU**: one ordered dict, least recently used first; an insert of a held key makes it most
  recent (as :class:`~sim.engine.kv.offload.OffloadTier`).
- **ARC** (Megiddo & Modha, "ARC: A Self-Tuning, Low Overhead Replacement Cache", FAST 2003;
  vLLM's ``ARCOffloadingManager``): two resident lists, ``t1`` (seen once) and ``t2`` (seen at
  least twice: a touch moves a key there), two ghost lists ``b1``/``b2`` of keys evicted from
  each (at most ``capacity`` in all), and a target ``p`` for ``t1``'s size that a ghost hit in
  ``b1`` raises and one in ``b2`` lowers. A key inserted again while resident is left where it
  is (a store of a block the tier holds is no reuse).

- **Kept keys** (``store.keep``: a predicate, or None): a key ``keep`` says yes to is never
  evicted - the radix chain keeps the copy of every node the GPU still holds, as SGLang
  HiCache's ``evict_host`` evicts only nodes already evicted from the device
  (:mod:`sim.engine.kv.radix_tiers`). Met at the eviction end, a kept key is moved to the
  most recent end and passed over; when every resident key is kept, the key being inserted
  is refused instead (HiCache's ``write_backup`` finds no host room): it is not held and not
  returned as evicted, so it reaches no lower tier (HiCache writes to storage only what a
  host write backed up: ``writing_check`` -> ``write_backup_storage``); a key it already
  held is never the one refused. :meth:`LRUStore.room` says whether ``n`` keys would enter
  without a refusal (HiCache's host ``alloc`` after ``evict_host``: an L3 prefetch's). With
  ``store.keep_version`` (a count that grows whenever ``keep`` may turn False for a key) a
  store that found every key kept skips the scan until that count moves or a free key
  enters; the lists are ``OrderedDict`` so that their oldest end is found in O(1) however
  many keys left it (a dict scans the holes they leave).

Invariants (tests/test_tiers.py): ``len(store) <= capacity``; ARC: ``len(t1) + len(t2) <=
capacity``, ``len(t1) + len(b1) <= capacity``, all four lists ``<= 2 * capacity``, ``0 <= p
<= capacity``; a capacity of 0 holds nothing (what enters it passes on, as evicted).
"""

from __future__ import annotations

import math
from collections import OrderedDict

_ABSENT = object()


class LRUStore:
    """A tier's keys in least-recently-used order (a dict, oldest first)."""

    __slots__ = ("capacity", "keys", "keep", "keep_version", "all_kept_at")

    def __init__(self, capacity):
        self.capacity = capacity  # blocks (math.inf: unlimited)
        self.keys = OrderedDict()  # (O(1) at its oldest end, however many left it)
        self.keep = None  # key -> whether it must stay (see the module docstring)
        self.keep_version = None  # () -> a count that grows when keep may turn False
        self.all_kept_at = None  # that count when every held key was last found kept

    def __contains__(self, key) -> bool:
        return key in self.keys

    def __len__(self) -> int:
        return len(self.keys)

    def insert(self, keys):
        """``keys`` enter (held ones made most recent): ``(new, evicted keys)``."""
        held, new, added = self.keys, 0, []
        if not self.capacity:  # holds nothing: they pass on
            return 0, list(keys)
        for k in keys:
            if held.pop(k, _ABSENT) is _ABSENT:  # (values are None: a held key's too)
                new += 1
                added.append(k)
            held[k] = None
        extra = len(held) - self.capacity
        if extra <= 0:
            return new, ()
        if self.keep is not None:  # (each victim out before the next is sought: distinct)
            keep, out = self.keep, []
            fresh = set(added)
            if any(not keep(k) for k in added):
                self.all_kept_at = None
            gone = 0  # keys of this insert that left again: nothing written
            for _ in range(int(extra)):
                k = None if _known_all_kept(self) else _first_free(held, keep)
                if k is None:  # all kept: the most recent key just inserted is refused
                    _note_all_kept(self)
                    k = next(x for x in reversed(held) if x in fresh)
                    del held[k]
                    gone += 1
                    continue  # (not held, not passed on)
                del held[k]
                out.append(k)
                gone += k in fresh
            return new - gone, out
        it = iter(held)
        out = [next(it) for _ in range(int(extra))]
        for k in out:
            del held[k]
        return new, out

    def room(self, n: int, protect=()) -> bool:
        """Whether ``n`` new keys would enter without a refusal: free slots, then held keys
        ``keep`` lets go that are not in ``protect``."""
        return _room(self, n, protect, (self.keys,))

    def touch(self, keys) -> None:
        """``keys`` (held) were read: made most recent."""
        held = self.keys
        for k in keys:
            del held[k]
            held[k] = None


def _first_free(held: dict, keep):
    """The least recently used key of ``held`` that ``keep`` lets go (None: all kept); kept
    keys met first are moved to the most recent end."""
    for _ in range(len(held)):
        k = next(iter(held))
        if not keep(k):
            return k
        del held[k]
        held[k] = None
    return None


def _room(store, n: int, protect, lists) -> bool:
    """:meth:`LRUStore.room` over the resident ``lists`` (in order; stops once it knows)."""
    short = n - (store.capacity - len(store))
    if short <= 0 or not store.capacity:  # (a capacity of 0 passes all on: no tier)
        return True
    keep = store.keep
    if keep is not None and _known_all_kept(store):
        return False
    for held in lists:
        for k in held:
            if k not in protect and (keep is None or not keep(k)):
                short -= 1
                if not short:
                    return True
    return False


def _known_all_kept(store) -> bool:
    """Whether every key ``store`` holds is known kept without a scan: it was found so and
    no key has left the GPU since (``keep_version`` unchanged) nor a free key entered. (A
    scan that finds all kept moves each key once round: the order it leaves is the same.)"""
    at = store.all_kept_at
    return at is not None and at == store.keep_version()


def _note_all_kept(store) -> None:
    if store.keep_version is not None:
        store.all_kept_at = store.keep_version()


class ARCStore:
    """A tier's keys under ARC (see the module docstring)."""

    __slots__ = ("capacity", "t1", "t2", "b1", "b2", "p", "keep", "keep_version",
                 "all_kept_at")

    def __init__(self, capacity):
        self.capacity = capacity
        self.t1, self.t2 = OrderedDict(), OrderedDict()  # (as LRUStore.keys)
        self.b1, self.b2 = OrderedDict(), OrderedDict()
        self.p = 0.0
        self.keep = None  # key -> whether it must stay (see the module docstring)
        self.keep_version = None  # as LRUStore's
        self.all_kept_at = None

    def __contains__(self, key) -> bool:
        return key in self.t1 or key in self.t2

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def _replace(self, in_b2: bool, out: list) -> None:
        """Evict one resident key into its ghost list (ARC's REPLACE)."""
        t1, t2, keep = self.t1, self.t2, self.keep
        first = t1 and (len(t1) > self.p or in_b2 and len(t1) == self.p or not t2)
        if keep is not None:  # the preferred list's oldest free key, else the other's (one
            for d in ((t1, t2) if first else (t2, t1)):  # exists: insert checked)
                if _first_free(d, keep) is not None:
                    first = d is t1
                    break
        if first:
            k = next(iter(t1))
            del t1[k]
            self.b1[k] = None
        else:
            k = next(iter(t2))
            del t2[k]
            self.b2[k] = None
        out.append(k)

    def _all_kept(self) -> bool:
        """Whether every resident key is kept (then nothing can be evicted)."""
        if _known_all_kept(self):
            return True
        keep = self.keep
        if _first_free(self.t1, keep) is None and _first_free(self.t2, keep) is None:
            _note_all_kept(self)
            return True
        return False

    def insert(self, keys):
        """``keys`` enter (a miss, or a ghost hit that tunes ``p``): ``(new, evicted keys)``."""
        c = self.capacity
        if not c:
            return 0, list(keys)
        t1, t2, b1, b2 = self.t1, self.t2, self.b1, self.b2
        new, out = 0, []
        for k in keys:
            if k in t1 or k in t2:
                continue
            if self.keep is not None and len(t1) + len(t2) >= c and self._all_kept():
                continue  # no room: refused (not passed on), ARC's state unchanged
            if self.keep is not None and not self.keep(k):
                self.all_kept_at = None  # (a free key enters)
            new += 1
            if math.isinf(c):
                t1[k] = None
                continue
            if k in b1:
                self.p = min(c, self.p + max(len(b2) / len(b1), 1.0))
                del b1[k]
                if len(t1) + len(t2) >= c:
                    self._replace(False, out)
                t2[k] = None
                continue
            if k in b2:
                self.p = max(0.0, self.p - max(len(b1) / len(b2), 1.0))
                del b2[k]
                if len(t1) + len(t2) >= c:
                    self._replace(True, out)
                t2[k] = None
                continue
            if len(t1) + len(b1) >= c:
                if len(t1) < c:
                    del b1[next(iter(b1))]
                    if len(t1) + len(t2) >= c:
                        self._replace(False, out)
                else:  # (t2 is empty: a free key is in t1)
                    out.append(next(iter(t1)) if self.keep is None
                               else _first_free(t1, self.keep))
                    del t1[out[-1]]
            elif len(t1) + len(t2) + len(b1) + len(b2) >= c:
                if len(t1) + len(t2) + len(b1) + len(b2) >= 2 * c:
                    del b2[next(iter(b2))]
                if len(t1) + len(t2) >= c:
                    self._replace(False, out)
            t1[k] = None
        return new, out

    def room(self, n: int, protect=()) -> bool:
        """As :meth:`LRUStore.room` (ARC evicts a free key of ``t1`` or ``t2``)."""
        return _room(self, n, protect, (self.t1, self.t2))

    def touch(self, keys) -> None:
        """``keys`` (held) were read: each moves to the most recent end of ``t2``."""
        t1, t2 = self.t1, self.t2
        for k in keys:
            if t1.pop(k, 0) is None or t2.pop(k, 0) is None:
                t2[k] = None


STORES = {"lru": LRUStore, "arc": ARCStore}
