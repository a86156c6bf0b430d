"""The layered toy's kernels on the CPU (numba njit, cached): `toy/model.py`'s layered toy, bit for bit.

Only `layer` (a state read per sequence) runs its grid in parallel; the others are a few words a
row. Each entry takes `(grid, tile, *args)`; `tile` is the build's block size, the width of the
reduction tiles a state read is split into (the `-ref` build tiles differently and must agree).
i64 buffers are read and written as u64 views; states are u64 views of their arenas.

    toy_embed   grid seqs:  act[r] = mark(token, position, j) for j < ACT, for group g's rows
    toy_layer   grid seqs:  group g (rows cu[g]..cu[g+1]) reads its positions [0, p0) of this
                            layer's state (heads summed, tails checked), then row by row writes
                            the row's slot from its activation, adds it to the sum, and rewrites
                            the activation from the sum
    toy_head    grid seqs:  next_token[g] from the activation of group g's last row
    toy_derive  grid n:     mix[i] = splitmix(source[i] ^ DERIVE_KEY)   (at load)
    toy_table   grid n:     table[i] from mix and the salt              (once, after load)
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
DERIVE_KEY = U(0xD3715EED00000001)
ACT = 8
HEAD = 16
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
def next_of(s):
    if (s >> U(56)) % U(96) == U(0):
        return EOS
    return np.int64(s % U(256))


@njit(cache=True, inline="always")
def read_slot(kv, base, words, q, tile):
    """Sum the slot's heads rotated by q, tile by tile; count tails that disagree with their head."""
    s = U(0)
    for t0 in range(0, HEAD, tile):
        part = U(0)
        for w in range(t0, min(t0 + tile, HEAD)):
            part += rotl(kv[base + w], q)
        s += part
    bad = 0
    for t0 in range(HEAD, words, tile):
        for w in range(t0, min(t0 + tile, words)):
            bad += kv[base + w] != splitmix(kv[base + (w & (HEAD - 1))] ^ U(w))
    return s, bad


@njit(cache=True)
def _embed(grid, cu, token_ids, positions, salt, act):
    for g in range(grid):
        for r in range(cu[g], cu[g + 1]):
            t = U(token_ids[r])
            p = U(positions[r])
            for j in range(ACT):
                act[r * ACT + j] = splitmix((t * K_T) ^ (p * K_P) ^ (U(j) * K_W) ^ U(salt[j]))


@njit(cache=True, parallel=True, nogil=True)
def _layer(grid, tile, positions, slot_mapping, cu, block_table, kv, mix, table, act, bpt, page, width):
    words = bpt // 8
    for g in prange(grid):
        r0 = np.int64(cu[g])
        r1 = np.int64(cu[g + 1])
        if r1 <= r0:
            continue
        p0 = np.int64(positions[r0])
        s = U(0)
        bad = 0
        for q in range(p0):
            slot = np.int64(block_table[g * width + q // page]) * page + q % page
            part, b = read_slot(kv, slot * words, words, q, tile)
            s += part
            bad += b
        if bad:
            s ^= POISON
        x = np.empty(ACT, U)
        h = np.empty(HEAD, U)
        for r in range(r0, r1):
            p = np.int64(positions[r])
            pk = U(p) * K_P
            for j in range(ACT):
                x[j] = act[r * ACT + j]
            base = np.int64(slot_mapping[r]) * words
            part = U(0)
            for w in range(HEAD):
                v = splitmix(x[w & 7] ^ rotl(x[(w + 3) & 7], w + 1) ^ U(table[w]) ^ pk)
                h[w] = v
                kv[base + w] = v
                part += rotl(v, p)
            for t0 in range(HEAD, words, tile):
                for w in range(t0, min(t0 + tile, words)):
                    kv[base + w] = splitmix(h[w & (HEAD - 1)] ^ U(w))
            s += part
            for j in range(ACT):
                act[r * ACT + j] = splitmix(x[j] ^ rotl(s, 8 * j + 1) ^ U(mix[j]) ^ x[(j + 1) & 7])


@njit(cache=True)
def _head(grid, cu, act, next_token):
    for g in range(grid):
        r = np.int64(cu[g + 1]) - 1
        s = U(0)
        for j in range(ACT):
            s += rotl(act[r * ACT + j], 8 * j)
        next_token[g] = next_of(s)


@njit(cache=True)
def _derive(grid, source, mix):
    for i in range(grid):
        mix[i] = splitmix(U(source[i]) ^ DERIVE_KEY)


@njit(cache=True)
def _table(grid, mix, salt, table):
    for i in range(grid):
        w = i % HEAD
        table[i] = splitmix(U(mix[(i // HEAD) * ACT + (w & 7)]) ^ U(salt[i & 63]) ^ U(w))


def _u(a):
    return a.view(np.uint64)


def toy_embed(grid, tile, cu_seqlens, token_ids, positions, salt, act):
    _embed(grid, cu_seqlens, token_ids, positions, salt, _u(act))


def toy_layer(grid, tile, positions, slot_mapping, cu_seqlens, block_table, kv, mix, table, act, bpt, page, width):
    _layer(grid, tile, positions, slot_mapping, cu_seqlens, block_table, kv, mix, table, _u(act), bpt, page, width)


def toy_head(grid, tile, cu_seqlens, act, next_token):
    _head(grid, cu_seqlens, _u(act), next_token)


def toy_derive(grid, tile, source, mix):
    _derive(grid, source, _u(mix))


def toy_table(grid, tile, mix, salt, table):
    _table(grid, mix, salt, _u(table))
