"""Token identity for prefix caching: which KV blocks of two prompts hold the same tokens.

A workload names its prompts' content by ``hash_ids``: one id per ``attrs["block_size"]`` tokens
(``H``; 512 for the Mooncake traces, the engine's block size for our generators), each standing
for that block's exact tokens *after the same prefix* (two prompts share their first ``k + 1``
ids exactly when they share tokens ``0 .. (k+1)·H``). An engine block ``j`` of ``block_size``
tokens ``bs`` holds tokens ``j·bs .. (j+1)·bs - 1``; its content, prefix included, is named by
the chained ids up to the id covering its last token, so its key combines ``j`` and the chain of
``hash_ids[0..k]`` with ``k = ((j+1)·bs - 1) // H`` into one 64-bit int (vLLM v1 chains a block's
hash with its parent's the same way). Only full blocks have keys.

The cache-hit rules of the engine (:mod:`sim.engine.blocks`) and of :func:`ideal_prefix_hit_rate`
are the same, so a simulation with an unbounded pool and no overlapping requests must reach
exactly the ideal rate:

- ``"block"`` (vLLM v1): the hit is the longest run of leading full blocks already cached,
  capped at ``(prompt - 1) // bs`` blocks (a fully cached prompt still computes its last token
  to get logits);
- ``"radix"`` (SGLang): token-granular. Token ``t`` of a prompt is named by the chain of ids up
  to ``t // H`` and its position, so two prompts share tokens ``0 .. n`` exactly when their
  chains agree up to the id covering token ``n``; only tokens some id covers have a name
  (``min(prompt, len(hash_ids)·H)``). The hit is the longest cached token prefix, capped at
  ``prompt - 1`` tokens and rounded down to whole pages of ``block_size`` tokens (SGLang's
  ``page_size``, 1 by default); the radix tree stores one node per hash id (its chain key,
  :func:`unit_keys_all`) holding how many of that id's tokens are cached.

Answers: real engines cache a finished request's output too. vLLM v1 caches every full block
of a request's tokens, prompt and output (``KVCacheManager.allocate_slots`` caches up to
``min(num_computed + num_new, request.num_tokens)`` tokens' full blocks; freed blocks keep
their hashes in the free queue); SGLang's ``RadixCache.cache_finished_req`` inserts
``(req.origin_input_ids + req.output_ids)[:-1]`` (the last sampled token's KV is never
computed). A workload names no output tokens, but in a conversation (``session_id``) the next
turn's prompt holds this turn's prompt and answer, and its ``hash_ids`` name them: a request's
answer keys are the next turn's keys past its own prompt's, up to its ``prompt + output - 1``
tokens (:func:`answer_block_keys`, :func:`answer_unit_keys`), cached when it finishes.
"""

from __future__ import annotations

import gc
import itertools

import numpy as np


def tokens_per_id(df) -> int:
    """The workload's tokens per hash id, ``df.attrs["block_size"]``, checked: a positive
    integer (``16.0`` is 16). A workload with ``hash_ids`` and no such attribute is an error
    (CSV and JSONL files cannot hold it; parquet keeps it)."""
    value = df.attrs.get("block_size")
    if value is None:
        raise ValueError("the workload has hash_ids but no attrs['block_size'] (tokens per "
                         "hash id): load it with hash_block_tokens=N (sim run "
                         "--hash-block-tokens N; Mooncake's ids are 512 tokens), set "
                         "df.attrs['block_size'] or save the workload as parquet, which keeps "
                         "it (CSV and JSONL do not); or turn prefix caching off")
    return _positive_int("attrs['block_size'] (tokens per hash id)", value)


def _positive_int(name, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)) \
            or value != value or int(value) != value or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _chain(c, h):
    return hash((c, h))


_P = np.uint64(0x9E3779B97F4A7C15)  # odd: invertible mod 2**64 (the golden-ratio constant)
_P_INV = np.uint64(pow(int(_P), -1, 1 << 64))


def _powers(n, base):
    """``[1, base, base**2, ...]`` (``n`` of them, mod 2**64), filled in place."""
    out = np.empty(n, dtype=np.uint64)
    out.fill(base)
    out[0] = 1
    with np.errstate(over="ignore"):
        return np.multiply.accumulate(out, out=out)


_SPAN = 1 << 16  # powers are made for this many ids at a time (512 kB: cached, reused)


class _Powers:
    """``base**i`` for any ``i < n`` as ``(base**SPAN)**(i // SPAN) · base**(i % SPAN)``: two
    short tables instead of an array of all ``n`` (measured at 13.8M ids: a fresh array of that
    length cost 0.2 s of page faults on this VM, more than the arithmetic)."""

    def __init__(self, n, base):
        self.low = _powers(min(n, _SPAN), base)
        with np.errstate(over="ignore"):
            self.high = _powers(-(-n // _SPAN), self.low[-1] * base if n >= _SPAN else 0)

    def at(self, i):
        """``base**i`` for the int64 array ``i``."""
        with np.errstate(over="ignore"):
            return self.high[i // _SPAN] * self.low[i % _SPAN]

    def scale(self, a) -> None:
        """``a[i] *= base**i`` in place, a span at a time."""
        low, buf = self.low, np.empty(len(self.low), dtype=np.uint64)
        with np.errstate(over="ignore"):
            for q, top in enumerate(self.high.tolist()):
                part = a[q * _SPAN:(q + 1) * _SPAN]
                np.multiply(low[:len(part)], np.uint64(top), out=buf[:len(part)])
                part *= buf[:len(part)]


def _chains_flat(id_lists):
    """``(chains, starts)``: per list of ids ``h``, ``c[k]`` naming ``h[0..k]`` in order,
    ``c[k] = c[k-1]·P + h[k] + 1 (mod 2**64)`` from ``c[-1] = 1``, all lists concatenated in one
    uint64 array (list ``i`` at ``starts[i]``). One vectorised pass: ``c[i] = P**i · (S[i] -
    S[start - 1] + P**(1 - start))`` with ``S = cumsum((h + 1)·P**-i)`` (exact: a ring mod
    2**64), each list's restart added to its first term before the sum. The leading
    ``P**(k + 1)`` names the chain's length: the id -1 adds 0, so from ``c[-1] = 0`` the chains
    ``[-1, 5]`` and ``[5]`` were equal (and ``[-1]``, ``[-1, -1]``). ``None`` when some id is
    not a 64-bit integer. One array of the whole length, worked in place (at 2.8M ids and
    more, fresh arrays of that length set the time and the peak memory of key building)."""
    lengths = np.array([len(ids) for ids in id_lists], dtype=np.int64)
    total = int(lengths.sum())
    starts = np.cumsum(lengths) - lengths
    if not total:
        return np.zeros(0, dtype=np.uint64), starts
    try:
        h = np.concatenate([np.asarray(ids) for ids in id_lists if len(ids)])
        if h.dtype.kind not in "iu":
            return None
        h = h.astype(np.int64, copy=False).view(np.uint64)
    except (TypeError, ValueError, OverflowError):
        return None
    firsts = starts[lengths > 0]
    with np.errstate(over="ignore"):
        h += np.uint64(1)
        inverse = _Powers(total, _P_INV)
        inverse.scale(h)  # (h + 1)·P**-i
        # list i's restart: + P**(1 - start_i), less what the sum holds before it (the last
        # list's terms and restart)
        restart = inverse.at(firsts) * _P
        sums = np.add.reduceat(h, firsts)
        h[firsts[1:]] += restart[1:] - restart[:-1] - sums[:-1]
        h[firsts[0]] += restart[0]
        s = np.cumsum(h, out=h)
        _Powers(total, _P).scale(s)
        return s, starts


def _block_keys_flat(hash_id_lists, hash_block_size, prompts, block_size):
    """``(keys, counts)``: every prompt's block keys concatenated (a uint64 array, or a list of
    tuples when some id is not an integer) and how many each prompt has."""
    lists = _id_lists(hash_id_lists)
    counts = _block_counts(lists, hash_block_size, prompts, block_size)
    flat = _chains_flat(lists)
    if flat is None:  # ids that are not integers: chained hash() of tuples, one list at a time
        keys = []
        for ids, n in zip(lists, counts.tolist()):
            c = _chains(ids)
            keys += [(c[((j + 1) * block_size - 1) // hash_block_size], j) for j in range(n)]
        return keys, counts
    chains, starts = flat
    j, k = _blocks(counts, hash_block_size, block_size)
    with np.errstate(over="ignore"):
        return chains[np.repeat(starts, counts) + k] * _P + (j + 1).astype(np.uint64), counts


def block_keys_all(hash_id_lists, hash_block_size, prompts, block_size) -> list:
    """:func:`prefix_block_keys` of many prompts at once (entries that are not lists of ids:
    no keys). A key is one int: ``chain · P + j + 1 (mod 2**64)`` for block ``j`` whose last
    token lies in hash block ``k`` (``chain`` names ``hash_ids[0..k]``); 64-bit keys, not tuples,
    since a long trace holds millions (measured: 9M keys for Mooncake's conversation trace)."""
    keys, counts = _block_keys_flat(hash_id_lists, hash_block_size, prompts, block_size)
    if isinstance(keys, np.ndarray):
        keys = keys.tolist()
    return _split(keys, np.cumsum(counts).tolist(), counts.tolist())


def block_key_ids(hash_id_lists, hash_block_size, prompts, block_size) -> list:
    """:func:`block_keys_all`'s keys as ids: per prompt an int64 array, a view of one array
    (empty: no keys); equal keys, equal ids. Block ``j`` whose last token lies in hash block
    ``k`` has the id ``chain_id · M + j - j0(k)``: ``chain_id`` numbers the distinct chains
    ``hash_ids[0..k]`` (``0, 1, ...`` in order of first appearance), ``j0(k)`` is the first
    block ending in hash block ``k`` and ``M = ceil(H / block_size)`` bounds how many do, so ids
    are below ``M ×`` the distinct chains (renumbered densely, sorted, where that leaves most
    unused: the engine's per-key arrays are as long as the largest id). Numbering chains, not
    keys, interns one value per hash id instead of one per block (measured: pandas' factorize
    of Mooncake's 9M block keys took 2.5 s). The engine's prefix cache indexes its per-key
    state by these ids."""
    import pandas as pd
    lists = _id_lists(hash_id_lists)
    counts = _block_counts(lists, hash_block_size, prompts, block_size)
    if not len(counts):
        return []
    flat = _chains_flat(lists)
    if flat is None:  # ids that are not integers: chained hash() of tuples, interned by a dict
        seen = {}
        chain_ids = np.array([seen.setdefault(c, len(seen)) for ids in lists
                              for c in _chains(ids)], dtype=np.int64)
        lengths = np.array([len(ids) for ids in lists], dtype=np.int64)
        starts = np.cumsum(lengths) - lengths
    else:
        chains, starts = flat
        chain_ids = pd.factorize(chains)[0].astype(np.int64, copy=False)
    h, bs = hash_block_size, block_size
    if h == bs and int(chain_ids.max()) < 2 * int(counts.sum()):  # a block per id, no ids to
        # renumber (even the unused chains'): a prompt's ids are its first chains', in place
        return [chain_ids[a:a + n] for a, n in zip(starts.tolist(), counts.tolist())]
    if h % bs:
        j, k = _blocks(counts, h, bs)
        first = -(-(k * h + 1) // bs) - 1
        ids = chain_ids[np.repeat(starts, counts) + k] * -(-h // bs) + (j - first)
    else:
        ids = _whole_id_keys(chain_ids, starts, counts, h // bs)
    if len(ids) and int(ids.max()) >= 2 * len(ids):  # short prompts leave most ids unused:
        ids = np.unique(ids, return_inverse=True)[1].astype(np.int64)  # numbered densely
    ends = np.cumsum(counts)
    return [ids[a:b] for a, b in zip((ends - counts).tolist(), ends.tolist())]


def _whole_id_keys(chain_ids, starts, counts, r):
    """:func:`block_key_ids`' ids where each hash id covers ``r`` whole blocks: block ``j`` ends
    in hash block ``k = j // r``, its id ``chain_id · r + j % r``. The chains each prompt uses
    are picked by a mask, each gives its ``r`` ids, and a prompt's ids past its last full block
    are masked off: arrays of the keys' length, not the index arithmetic per key of the
    general case (measured on 13.7M keys of 16-token ids: 1.0 -> 0.2 s)."""
    lengths = np.diff(starts, append=len(chain_ids))
    used = -(-counts // r)  # chains used (at most the prompt's: counts <= lengths · r)
    ids = chain_ids if (used == lengths).all() else chain_ids[_runs(used, lengths - used)]
    if r == 1:
        return ids
    ids = ((ids * r)[:, None] + np.arange(r, dtype=np.int64)).ravel()
    surplus = used * r - counts
    return ids[_runs(counts, surplus)] if surplus.any() else ids


def _runs(kept, dropped):
    """A mask of ``kept[i]`` True then ``dropped[i]`` False, for each ``i`` in turn."""
    pattern = np.zeros(2 * len(kept), dtype=bool)
    pattern[::2] = True
    return np.repeat(pattern, np.column_stack((kept, dropped)).ravel())


def _id_lists(hash_id_lists) -> list:
    """Each prompt's ids; an entry that is not a sequence of ids (None, NaN): none."""
    return [ids if isinstance(ids, (list, tuple, np.ndarray)) else () for ids in hash_id_lists]


def _chains(ids) -> list:
    """``c[k]`` naming ``ids[0..k]`` by chained ``hash()`` (ids that are not 64-bit integers,
    where :func:`_chains_flat` gives None)."""
    return list(itertools.accumulate(ids, _chain, initial=0))[1:]


def _blocks(counts, hash_block_size, block_size) -> tuple:
    """``(j, k)`` of every key, prompts concatenated (``counts`` keys each): its block's index
    in its prompt and the hash block its last token lies in."""
    j = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts,
                                                                 counts)
    return j, ((j + 1) * block_size - 1) // hash_block_size


def _block_counts(lists, hash_block_size, prompts, block_size):
    """Full blocks per prompt that its ids name: ``min(prompt, ids · H) // block_size``."""
    return np.array([min(int(p) // block_size, len(ids) * hash_block_size // block_size, )
                     for ids, p in zip(lists, prompts)], dtype=np.int64).clip(min=0)


def _split(keys, ends, counts) -> list:
    """``keys`` cut into lists of ``counts`` items ending at ``ends``, with the cyclic collector
    paused: the new lists would trigger full collections that traverse the whole ``keys`` list
    again and again (measured: 2.5 s -> 1.6 s of block_keys_all on 100k prompts, 13.7M keys)."""
    was = gc.isenabled()
    gc.disable()
    try:
        return [keys[e - n:e] for e, n in zip(ends, counts)]
    finally:
        if was:
            gc.enable()


def unit_keys_all(hash_id_lists) -> list:
    """Per prompt, the chain key naming each of its ``hash_ids``' prefix (``c[k]`` names
    ``hash_ids[0..k]``): the radix cache's node keys. Entries that are not lists of ids: no
    keys."""
    lists = _id_lists(hash_id_lists)
    flat = _chains_flat(lists)
    if flat is None:  # ids that are not integers: chained hash() of tuples
        return [_chains(ids) for ids in lists]
    chains, starts = flat
    lengths = [len(ids) for ids in lists]
    return _split(chains.tolist(), (starts + lengths).tolist(), lengths)


def prefix_block_keys(hash_ids, hash_block_size, num_prompt_tokens, block_size) -> list:
    """Keys of the full ``block_size``-token blocks of a prompt (see the module docstring)."""
    if hash_ids is None:
        return []
    return block_keys_all([hash_ids], hash_block_size, [num_prompt_tokens], block_size)[0]


def ideal_prefix_hit_rate(df, block_size=16, mode="block", answers=False) -> float:
    """Prompt tokens an unbounded cache serves, over all prompt tokens, in arrival order.

    ``mode="block"`` (vLLM): each request hits its longest run of leading full blocks that an
    earlier request had, capped at ``(prompt - 1) // block_size`` blocks; then all its full
    blocks are cached. ``mode="radix"`` (SGLang): it hits its longest token prefix an earlier
    request had (see the module docstring), capped at ``prompt - 1`` and rounded down to
    ``block_size`` tokens; then its named tokens are cached (rounded down the same way).
    Requests without ``hash_ids`` never hit (their tokens still count). ``answers=True`` (a
    workload with ``session_id``): each request's answer is cached after it too, as the engine
    caches a finished turn's (:func:`answer_block_keys`, :func:`answer_unit_keys`), each turn
    taken as finished before the next request."""
    if "hash_ids" not in df.columns:
        raise ValueError("workload has no hash_ids column")
    if not isinstance(answers, (bool, np.bool_)):
        raise TypeError(f"answers must be True or False, got {answers!r}")
    if answers and "session_id" not in df.columns:
        raise ValueError("answers=True needs a session_id column (whose next turn names a "
                         "request's answer)")
    hash_bs = tokens_per_id(df)
    block_size = _positive_int("block_size", block_size)
    if mode not in ("block", "radix"):
        raise ValueError(f"mode must be 'block' or 'radix', got {mode!r}")
    prompts = [int(p) for p in df["num_prompt_tokens"]]
    total = sum(prompts)
    ids = list(df["hash_ids"])
    outputs = [int(o) for o in df["num_output_tokens"]] if answers else None
    sessions = df["session_id"].tolist() if answers else None
    if mode == "radix":
        hits = _radix_hits(ids, hash_bs, prompts, block_size, sessions, outputs)
        return hits / total if total else float("nan")
    seen = set()
    hits = 0
    all_keys = block_keys_all(ids, hash_bs, prompts, block_size)
    extra = answer_block_keys(all_keys, sessions, prompts, outputs, block_size, ids) \
        if answers else [None] * len(all_keys)
    for keys, prompt, more in zip(all_keys, prompts, extra):
        limit = min(len(keys), (prompt - 1) // block_size)
        n = 0
        while n < limit and keys[n] in seen:
            n += 1
        hits += n * block_size
        seen.update(keys)
        if more is not None:
            seen.update(more)
    return hits / total if total else float("nan")


def _radix_hits(hash_id_lists, unit, prompts, page, sessions=None, outputs=None) -> int:
    if unit % page:
        raise ValueError(f"radix mode needs the hash block size ({unit} tokens) to be a "
                         f"multiple of block_size, got block_size={page}")
    cached = {}  # unit key -> tokens of it cached
    hits = 0
    all_keys = unit_keys_all(hash_id_lists)
    extra = [None] * len(all_keys) if sessions is None else answer_unit_keys(
        all_keys, sessions, prompts, outputs, unit, hash_id_lists)
    for keys, prompt, more, out in zip(all_keys, prompts, extra, outputs or prompts):
        named = min(prompt, len(keys) * unit)
        limit = min(named, prompt - 1) // page * page
        m = 0
        for c in keys:
            t = min(cached.get(c, 0), unit, limit - m)
            m += t
            if t < unit:
                break
        hits += m
        _cache_units(cached, keys, named // page * page, unit)
        if more is not None:  # its prompt and answer less the last token, under the next's
            _cache_units(cached, more, min(prompt + out - 1, len(more) * unit) // page * page,
                         unit)
    return hits


def _cache_units(cached, keys, upto, unit) -> None:
    """The first ``upto`` tokens the chain ``keys`` names enter ``cached`` (key -> tokens)."""
    for k, c in enumerate(keys):
        n = min(unit, upto - k * unit)
        if n <= 0:
            break
        if n > cached.get(c, 0):
            cached[c] = n


def next_turns(sessions) -> list:
    """Per row, the row of the next turn of its conversation (``sessions``: the rows'
    ``session_id``, in workload order), or -1: the last turn, or a row without an id (None,
    NaN)."""
    nxt = [-1] * len(sessions)
    last = {}
    for i in range(len(sessions) - 1, -1, -1):
        s = sessions[i]
        if s is None or s != s:
            continue
        nxt[i] = last.get(s, -1)
        last[s] = i
    return nxt


def answer_block_keys(keys, sessions, prompts, outputs, block_size, hash_ids) -> list:
    """Per request, the keys (a slice of its next turn's :func:`block_key_ids`) of the full
    blocks its answer completes, or None: blocks ``len(keys[i]) .. (prompt + output - 1) //
    block_size - 1`` (the last output token's KV is never computed), named by its
    conversation's next turn, whose prompt holds this turn's prompt and answer. Only where the
    next turn's prompt is at least this turn's prompt and answer long, its first keys are this
    turn's and this turn's keys cover its whole prompt's full blocks (else its answer is not
    what the next turn's ids name, or the two do not line up); capped at the next turn's keys.
    Both turns must have ``hash_ids`` (a prompt without names is not known to be the next's)."""
    out = [None] * len(keys)
    for i, j, mine, theirs in _turn_pairs(keys, sessions, hash_ids):
        a = len(mine)
        m = min(len(theirs), (prompts[i] + outputs[i] - 1) // block_size)
        if m > a and a == prompts[i] // block_size and prompts[j] >= prompts[i] + outputs[i] \
                and (not a or theirs[a - 1] == mine[a - 1]):  # (a key names its prefix)
            out[i] = theirs[a:m]
    return out


def answer_unit_keys(keys, sessions, prompts, outputs, unit, hash_ids) -> list:
    """Radix mode's :func:`answer_block_keys`: per request, its next turn's chain keys
    (:func:`unit_keys_all`) that cover its prompt and answer (``prompt + output - 1`` tokens,
    capped at the next turn's named tokens), or None; only where the next turn's prompt is at
    least this turn's prompt and answer long, its first keys are this turn's whole-unit ones
    (``prompt // unit``: a last unit this prompt fills in part has another key in the next
    turn) and they name tokens past them; both turns with ``hash_ids``."""
    out = [None] * len(keys)
    for i, j, mine, theirs in _turn_pairs(keys, sessions, hash_ids):
        whole = min(prompts[i], len(mine) * unit) // unit
        upto = min(prompts[i] + outputs[i] - 1, len(theirs) * unit)
        if upto > whole * unit and whole == prompts[i] // unit \
                and prompts[j] >= prompts[i] + outputs[i] \
                and (not whole or theirs[whole - 1] == mine[whole - 1]):  # (a chain key
            # names its whole prefix)
            out[i] = theirs[:-(-upto // unit)]
    return out


def _turn_pairs(keys, sessions, hash_ids):
    """``(i, j, keys[i], keys[j])`` for each request ``i`` whose conversation's next turn is
    ``j``, both with ``hash_ids``."""
    named = [len(ids) > 0 for ids in _id_lists(hash_ids)]
    for i, j in enumerate(next_turns(sessions)):
        if j >= 0 and named[i] and named[j]:
            yield i, j, keys[i], keys[j]
