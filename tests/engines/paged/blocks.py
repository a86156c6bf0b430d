"""The block pool: fixed-size blocks of cached entries, refcounts, a prefix cache keyed by a block-hash
chain, and one LRU free queue that holds every unreferenced block (cached or not).

A full block's key is hash(parent key, its tokens), so it pins the whole prefix up to its end.
A block enters the table only once every slot of it is written. Freed blocks go to the tail of
the queue (a request's last block first, so a chain is evicted from its end); allocation takes
the head and evicts the key it held.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from .bugs import bug

ROOT = b"root"


def chain_key(parent: bytes | None, tokens) -> bytes:
    """The key of a full block: it pins the parent's key and the block's own tokens."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent or ROOT)
    if bug("chain"):  # BUG(chain): the parent is left out, so equal blocks anywhere share a key
        h = hashlib.blake2b(ROOT, digest_size=16)
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    key = h.digest()
    if bug("collide"):  # BUG(collide): a short key; distinct blocks collide on it
        key = bytes([key[0] & 0x0F, key[1]])
    return key


class Pool:
    def __init__(self, blocks: int, size: int, width: int):
        self.size = size
        self.kv = np.zeros((blocks, size, width), dtype=np.uint64)
        self.ref = [0] * blocks
        self.key: list[bytes | None] = [None] * blocks
        self.table: dict[bytes, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(blocks))
        self.evictions = 0

    @property
    def blocks(self) -> int:
        return len(self.ref)

    def cached(self, keys: list[bytes]) -> list[int]:
        """The blocks holding the longest run of `keys` from the start (nothing is taken)."""
        out = []
        for k in keys:
            b = self.table.get(k)
            if b is None:
                break
            out.append(b)
        return out

    def take(self, blocks: list[int]) -> None:
        """Reference cached blocks (a hit): a free one leaves the queue, so nothing evicts it."""
        for b in blocks:
            if self.ref[b] == 0:
                self.free.pop(b, None)
            self.ref[b] += 1

    def free_after(self, hits: list[int]) -> int:
        """How many blocks could be allocated once `hits` are taken."""
        return len(self.free) - sum(1 for b in set(hits) if self.ref[b] == 0)

    def allocate(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=bug("mru"))  # BUG(mru): popitem(last=True) takes the newest
            if self.key[b] is not None:
                self.evict(b)
            self.ref[b] = 1
            out.append(b)
        return out

    def evict(self, b: int) -> None:
        self.evictions += 1
        if bug("evict-stale"):  # BUG(evict-stale): the table keeps pointing at the reused block
            return
        if self.table.get(self.key[b]) == b:
            del self.table[self.key[b]]
        self.key[b] = None

    def register(self, b: int, key: bytes) -> None:
        """Cache a block whose every slot is written; a key already held by another block stays there."""
        if self.key[b] is None and key not in self.table:
            self.table[key] = b
            self.key[b] = key

    def release(self, blocks: list[int]) -> None:
        """Drop one reference from each (last block first); an unreferenced block joins the queue's tail."""
        for b in reversed(blocks):
            self.ref[b] -= 1
            if bug("free-shared"):  # BUG(free-shared): the refcount is forced to 0, other readers or not
                self.ref[b] = 0
            if self.ref[b] == 0:
                self.free[b] = None
                self.free.move_to_end(b)

    def rows(self, blocks: list[int], n: int) -> np.ndarray:
        """The first n entries of a sequence whose block table is `blocks`."""
        return self.kv[blocks].reshape(-1, self.kv.shape[2])[:n]

    def write(self, blocks: list[int], start: int, rows: np.ndarray) -> None:
        """Write rows for positions start.. of a sequence with block table `blocks`."""
        pos = np.arange(start, start + len(rows))
        table = np.asarray(blocks)
        self.kv[table[pos // self.size], pos % self.size] = rows
