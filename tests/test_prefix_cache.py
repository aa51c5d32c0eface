import warnings

import pytest
from hypothesis import given, strategies as st

import sim.cheatsheet.prefix_cache
from sim import PrefixCache
from sim.cheatsheet.prefix_cache import PrefixCacheFullWarning

seqs = st.lists(st.lists(st.integers(0, 3), max_size=8), max_size=25)


def _brute_lookup(stored, tokens):
    best = 0
    for s in stored:
        n = 0
        while n < min(len(s), len(tokens)) and s[n] == tokens[n]:
            n += 1
        best = max(best, n)
    return best


@given(seqs, st.lists(st.integers(0, 3), max_size=8))
def test_lookup_and_size_match_brute_force(inserted, probe):
    c = PrefixCache(max_entries=10**6)
    for s in inserted:
        before = len(c)
        assert c.insert(s) == len(c) - before
    assert c.lookup(probe) == _brute_lookup(inserted, probe)
    prefixes = {tuple(s[:i]) for s in inserted for i in range(1, len(s) + 1)}
    assert len(c) == len(prefixes)
    assert not c.full


def test_cheat_sheet_behaviour():
    c = PrefixCache()
    assert c.insert([1, 2, 3, 4]) == 4
    assert c.insert([1, 2, 5]) == 1
    assert c.lookup([1, 2, 3, 9]) == 3
    assert c.lookup([7, 1, 2]) == 0
    assert len(c) == 5


def test_stops_when_full_and_says_so_once():
    c = PrefixCache(max_entries=5)
    assert c.insert([1, 2, 3]) == 3
    with pytest.warns(PrefixCacheFullWarning, match=r"max_entries=5 tokens\): later tokens are "
                                                    r"not stored; use eviction='lru'"):
        assert c.insert([4, 5, 6, 7]) == 2
    assert c.full and len(c) == 5 and c.dropped == 2
    assert c.lookup([4, 5, 6]) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per cache, not per insert
        assert c.insert([9]) == 0
    assert c.dropped == 3


def test_max_entries_counts_tokens_not_sequences():
    assert "number of **tokens**" in sim.cheatsheet.prefix_cache.__doc__
    assert "the most tokens" in PrefixCache.__doc__
    c = PrefixCache(max_entries=2)
    with pytest.warns(PrefixCacheFullWarning):
        assert c.insert([1, 2, 3]) == 2  # one sequence of 3 tokens does not fit in 2
    assert len(c) == 2 and c.lookup([1, 2, 3]) == 2
    lru = PrefixCache(max_entries=2, eviction="lru")
    with pytest.warns(PrefixCacheFullWarning, match="longer than the cache"):
        assert lru.insert([1, 2, 3]) == 2


@pytest.mark.parametrize("method", ["insert", "lookup"])
@pytest.mark.parametrize("tokens, message", [
    (None, "tokens must be a sequence of token ids, got None"),
    (5, "tokens must be a sequence of token ids, got 5"),
    ("abc", "tokens must be a sequence of token ids, got 'abc'"),
    ([1, [2], 3], r"token 1 is \[2\], not a hashable token id"),
])
def test_bad_tokens_are_clear_type_errors(method, tokens, message):
    c = PrefixCache()
    with pytest.raises(TypeError, match=rf"PrefixCache\.{method}: {message}"):
        getattr(c, method)(tokens)
    assert len(c) == 0  # nothing half-inserted
    assert c.insert(iter([1, 2])) == 2 and c.lookup((t for t in [1, 2])) == 2


def test_lru_eviction_removes_least_recently_used_leaves():
    c = PrefixCache(max_entries=6, eviction="lru")
    c.insert([1, 2, 3])
    c.insert([4, 5, 6])
    c.lookup([1, 2, 3])  # [4,5,6] is now least recently used
    assert c.insert([7, 8]) == 2
    assert len(c) == 6 and not c.full
    assert c.lookup([1, 2, 3]) == 3
    assert c.lookup([4, 5, 6]) == 1  # two leaves of the old branch went, leaf by leaf
    assert c.evictions == 2


@pytest.mark.filterwarnings("ignore::sim.cheatsheet.prefix_cache.PrefixCacheFullWarning")
@given(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=6), max_size=40),
       st.integers(1, 12))
def test_lru_never_exceeds_capacity_and_keeps_latest(inserted, cap):
    c = PrefixCache(max_entries=cap, eviction="lru")
    for s in inserted:
        c.insert(s)
        assert len(c) <= cap
        # the sequence just inserted is cached as far as capacity allows
        assert c.lookup(s) == min(len(s), cap)


def test_bad_args():
    with pytest.raises(ValueError, match="max_entries"):
        PrefixCache(0)
    with pytest.raises(ValueError, match="eviction"):
        PrefixCache(eviction="fifo")
