"""Planted prefix-cache faults in vLLM itself, behind a switch (negative controls, like KERN_TOY_FAULT):
`KERN_TOY_HASH_FAULT=NAME` replaces vLLM's block hash (`vllm.v1.core.kv_cache_utils.hash_block_tokens`,
looked up at each call by the request block hasher) in every process that loads the plugin.

- `parent`: a block's hash ignores its parent, so equal blocks after different prefixes share an entry
  (the classic chain bug: vllm-project/aibrix#2329, block cache keys without the prefix);
- `last-token`: a block's hash ignores its last token, so blocks differing only there share an entry.

Off (unset or empty) by default; an unknown name stops the server at start, naming the known ones.
"""

from __future__ import annotations

import os

FAULTS = {
    "parent": "a block's hash ignores its parent (equal blocks after different prefixes collide)",
    "last-token": "a block's hash ignores its last token (blocks differing only there collide)",
}


def plant(logger) -> str | None:
    """Patch vLLM's block hash as `KERN_TOY_HASH_FAULT` says; the fault planted, or None."""
    name = os.environ.get("KERN_TOY_HASH_FAULT", "").strip()
    if not name:
        return None
    if name not in FAULTS:
        raise ValueError(f"KERN_TOY_HASH_FAULT={name!r}: unknown fault; known: {', '.join(FAULTS)}")
    from vllm.v1.core import kv_cache_utils as kcu

    real = getattr(kcu, "_kern_real_hash_block_tokens", kcu.hash_block_tokens)
    kcu._kern_real_hash_block_tokens = real

    def faulty(hash_function, parent_block_hash, curr_block_token_ids, extra_keys=None):
        if name == "parent":
            parent_block_hash = None
        else:
            curr_block_token_ids = tuple(curr_block_token_ids)[:-1]
        return real(hash_function, parent_block_hash, curr_block_token_ids, extra_keys)

    kcu.hash_block_tokens = faulty
    logger.warning("kern toy: FAULT INJECTION on: KERN_TOY_HASH_FAULT=%s (%s)", name, FAULTS[name])
    return name
