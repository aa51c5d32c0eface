"""Constants of the inference-optimization cheat sheet, defined once.

Every scheduler, block pool and CLI default refers to these names; nothing re-types the numbers.
"""

CHUNK_SIZE = 512
"""Per-iteration token budget of the chunked-prefill (Sarathi-style) scheduler."""

KV_BLOCK_SIZE = 16
"""Tokens per paged KV-cache block (vLLM's default page)."""

KV_BLOCKS_AVAILABLE = 1800
"""Default number of KV-cache blocks in the pool when no model/GPU budget is given."""
