"""Token identity for prefix caching: which KV blocks of two prompts hold the same tokens.

A workload names its prompts' content by ``hash_ids``: one id per ``attrs["block_size"]`` tokens
(``H``; 512 for the Mooncake traces, the engine's block size for our generators), each standing
for that block's exact tokens *after the same prefix* (two prompts share their first ``k + 1``
ids exactly when they share tokens ``0 .. (k+1)·H``). An engine block ``j`` of ``block_size``
tokens ``bs`` holds tokens ``j·bs .. (j+1)·bs - 1``; its content, prefix included, is named by
the chained ids up to the id covering its last token, so its key is
``(chain of hash_ids[0..k], j)`` with ``k = ((j+1)·bs - 1) // H`` (vLLM v1 chains a block's hash
with its parent's the same way). Only full blocks have keys.

The cache-hit rules of the engine (:mod:`sim.engine.blocks`) and of :func:`ideal_prefix_hit_rate`
are the same, so a simulation with an unbounded pool and no overlapping requests must reach
exactly the ideal rate:

- ``"block"`` (vLLM v1): the hit is the longest run of leading full blocks already cached,
  capped at ``(prompt - 1) // bs`` blocks (a fully cached prompt still computes its last token
  to get logits);
"""

from __future__ import annotations

import itertools


def _chain(c, h):
    return hash((c, h))


def prefix_block_keys(hash_ids, hash_block_size, num_prompt_tokens, block_size) -> list:
    """Keys of the full ``block_size``-token blocks of a prompt (see the module docstring)."""
    if hash_ids is None:
        return []
    n = num_prompt_tokens // block_size
    covered = len(hash_ids) * hash_block_size
    n = min(n, covered // block_size)
    if n <= 0:
        return []
    chains = list(itertools.accumulate(hash_ids, _chain, initial=0))
    return [(chains[((j + 1) * block_size - 1) // hash_block_size + 1], j) for j in range(n)]


def ideal_prefix_hit_rate(df, block_size=16) -> float:
    """Prompt tokens an unbounded block cache (vLLM's rules) serves, over all prompt tokens, in
    arrival order: each request hits its longest run of leading full blocks that an earlier
    request had, capped at ``(prompt - 1) // block_size`` blocks; then all its full blocks are
    cached. Requests without ``hash_ids`` never hit (their tokens still count)."""
    if "hash_ids" not in df.columns:
        raise ValueError("workload has no hash_ids column")
    hash_bs = df.attrs.get("block_size")
    if not hash_bs:
        raise ValueError("workload has hash_ids but no attrs['block_size'] (tokens per id)")
    seen = set()
    hits = total = 0
    for ids, prompt in zip(df["hash_ids"], df["num_prompt_tokens"]):
        prompt = int(prompt)
        total += prompt
        keys = prefix_block_keys(ids if isinstance(ids, (list, tuple)) else None, hash_bs,
                                 prompt, block_size)
        limit = min(len(keys), (prompt - 1) // block_size)
        n = 0
        while n < limit and keys[n] in seen:
            n += 1
        hits += n * block_size
        seen.update(keys)
    return hits / total if total else float("nan")
