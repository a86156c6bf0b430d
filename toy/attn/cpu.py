"""The attn toy's kernel on the CPU (numba njit, cached): `toy/model.py`'s attn toy, bit for bit.

    toy_attn   grid seqs:  group g (rows cu[g]..cu[g+1]) reads its positions [0, p0) of the
                           state into five running sums (the key sums, the value sums per bucket;
                           tails checked), then row by row: reads with the row's query, writes the
                           row's K and V from that read, adds them to the sums and reads again;
                           next_token[g] from the last row's read

`tile` is the build's block size, the width of the tiles the tail check is split into (the `-ref`
build tiles differently and must agree). i64 buffers are read as u64; the state is a u64 view of
its arena.
"""

import numpy as np
from numba import njit, prange

U = np.uint64
GOLDEN = U(0x9E3779B97F4A7C15)
MIX1 = U(0xBF58476D1CE4E5B9)
MIX2 = U(0x94D049BB133111EB)
K_T = U(0x100000001B3)
K_P = U(0x9E3779B1)
K_W = U(0xC2B2AE35)
POISON = U(0xBAD0BAD0BAD0BAD0)
HALF = 8
HEAD = 16
BUCKETS = 4
QUERY = 16
EOS = 256


@njit(cache=True, inline="always")
def splitmix(x):
    x = x + GOLDEN
    x = (x ^ (x >> U(30))) * MIX1
    x = (x ^ (x >> U(27))) * MIX2
    return x ^ (x >> U(31))


@njit(cache=True, inline="always")
def rotl(x, k):
    k = U(k) & U(63)
    if k == U(0):
        return x
    return (x << k) | (x >> (U(64) - k))


@njit(cache=True, inline="always")
def mark(t, p, w, salt):
    return splitmix((t * K_T) ^ (p * K_P) ^ (U(w) * K_W) ^ U(salt[w & 63]))


@njit(cache=True, inline="always")
def next_of(s):
    if (s >> U(56)) % U(96) == U(0):
        return EOS
    return np.int64(s % U(256))


@njit(cache=True, inline="always")
def read(sums, query):
    """read(Q, E) from E's sums: sums[0] the key sums, sums[1 + b] bucket b's value sums."""
    total = sums[0]
    for b in range(BUCKETS):
        total += sums[1 + b]
    return total + U(2) * sums[1 + np.int64(query >> U(62))]


@njit(cache=True, inline="always")
def add_slot(sums, kv, base, q):
    """Add the entry at kv[base:base+16] (position q) to the sums."""
    ks = U(0)
    vs = U(0)
    for w in range(HALF):
        ks += rotl(kv[base + w], q)
        vs += rotl(kv[base + HALF + w], q + 32)
    sums[0] += ks
    sums[1 + np.int64(kv[base] >> U(62))] += vs


@njit(cache=True, inline="always")
def bad_tails(kv, base, words, tile):
    bad = 0
    for t0 in range(HEAD, words, tile):
        for w in range(t0, min(t0 + tile, words)):
            bad += kv[base + w] != splitmix(kv[base + (w & (HEAD - 1))] ^ U(w))
    return bad


@njit(cache=True, inline="always")
def write_row(kv, base, words, tile, t, p, r, salt):
    """Write the entry of token t at position p from the read r: heads, then tails."""
    for w in range(HEAD):
        kv[base + w] = splitmix(mark(t, p, w, salt) ^ rotl(r, w))
    for t0 in range(HEAD, words, tile):
        for w in range(t0, min(t0 + tile, words)):
            kv[base + w] = splitmix(kv[base + (w & (HEAD - 1))] ^ U(w))


@njit(cache=True, parallel=True, nogil=True)
def _attn(grid, tile, token_ids, positions, slot_mapping, cu, block_table, kv, salt, next_token, bpt, page, width):
    words = bpt // 8
    for g in prange(grid):
        r0 = np.int64(cu[g])
        r1 = np.int64(cu[g + 1])
        if r1 <= r0:
            continue
        p0 = np.int64(positions[r0])
        sums = np.zeros(1 + BUCKETS, U)
        bad = 0
        for q in range(p0):
            base = (np.int64(block_table[g * width + q // page]) * page + q % page) * words
            add_slot(sums, kv, base, q)
            bad += bad_tails(kv, base, words, tile)
        if bad:
            sums[0] ^= POISON
        o = U(0)
        for r in range(r0, r1):
            t = U(token_ids[r])
            p = np.int64(positions[r])
            query = mark(t, U(p), QUERY, salt)
            base = np.int64(slot_mapping[r]) * words
            write_row(kv, base, words, tile, t, U(p), read(sums, query), salt)
            add_slot(sums, kv, base, p)
            o = read(sums, query)
        next_token[g] = next_of(splitmix(o))


def toy_attn(grid, tile, token_ids, positions, slot_mapping, cu_seqlens, block_table, kv, salt, next_token, bpt, page, width):
    _attn(grid, tile, token_ids, positions, slot_mapping, cu_seqlens, block_table, kv, salt, next_token, bpt, page, width)
