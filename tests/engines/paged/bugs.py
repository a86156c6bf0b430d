"""The planted bugs: each is off unless named by `--bug NAME` or KERN_ENGINE_BUG=NAME, and each is a
change of at most 10 lines at the place it lives, marked `BUG(<name>)`, modelled on a real report."""

from __future__ import annotations

import os

BUGS = {
    "chain": "a block's key ignores its parent (vllm-project/aibrix#2329: block cache keys without the prefix)",
    "collide": "keys cut to 12 bits, so two blocks collide on one key "
               "(openvinotoolkit/openvino.genai#3722: a hash collision silently reuses the wrong KV block)",
    "free-shared": "a finished request's blocks are freed outright, refcount forced to 0, while another "
                   "request still reads them (Avarok-Cybersecurity/atlas#373: force-zeroed refcount)",
    "same-step": "prompt blocks are registered in the prefix cache when allocated, before their step writes "
                 "them (vllm-project/vllm#37152: same-step block registration)",
    "partial-full": "a block is cached as full once its tokens are known, before its last slot is computed "
                    "(vllm-project/vllm#12333: blocks cached past num_computed_tokens)",
    "last-token": "a hit may cover a prompt's last token when the prompt is a whole number of blocks "
                  "(vllm-project/vllm#11186, #9972: the last token must be recomputed)",
    "evict-stale": "an evicted block keeps its key in the table and is served after reuse "
                   "(ovg-project/kvcached#362: stale block_hash after eviction)",
    "mru": "the free queue evicts the most recently freed block first, not the least recently used "
           "(llm-d/llm-d-inference-sim#704: eviction order other than vLLM's)",
    "eos-after-hit": "a request served from the cache does not stop at EOS "
                     "(intel/ipex-llm#11896: no stop at the EOS token on the lookup path)",
    "line-boundary": "a request-end checkpoint keeps the line as of the last full block, not the end "
                     "(vllm-project/vllm#55601: a hit restores the recurrent state of an earlier block)",
    "k-only": "after a prefix hit, the K half of new entries is written at positions counted from the hit, "
              "V right (tenstorrent/vllm#415: prefill resuming from cached KV corrupts it; attn toy only)",
}

_ACTIVE: str | None = None


def set_bug(name: str | None) -> None:
    global _ACTIVE
    name = name or os.environ.get("KERN_ENGINE_BUG") or None
    if name is not None and name not in BUGS:
        raise SystemExit(f"unknown bug {name!r}; known: {', '.join(BUGS)}")
    _ACTIVE = name


def bug(name: str) -> bool:
    """Whether the planted bug `name` is switched on."""
    assert name in BUGS, name
    return _ACTIVE == name
