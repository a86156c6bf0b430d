"""The toy kernels on the CPU (numba njit, cached).

Each entry takes `(grid, tile, *args)`: `grid` is the launch's grid, `tile` the build's block
size, used as the width of the reduction tiles a sum is split into (the `-ref` build tiles
differently and must agree bit for bit). Arrays are flat; states are u64 views of their arenas.
All arithmetic is u64 and wraps.
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
HEAD = 64
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
    return splitmix((U(t) * K_T) ^ (U(p) * K_P) ^ (U(w) * K_W) ^ U(salt[w & 63]))


@njit(cache=True, inline="always")
def fold(c, t, p, salt):
    return rotl(c, 7) ^ mark(t, p, 0, salt)


@njit(cache=True, inline="always")
def next_of(s):
    if (s >> U(56)) % U(96) == U(0):
        return EOS
    return np.int64(s % U(256))


# The tails: word w of a slot (HEAD <= w) is splitmix(head[w & 63] ^ w), word w of a line (2 <= w)
# splitmix(carry ^ w). Written and checked in whole rows of 64 words over a view of the slot or
# line (`a`), with a fixed inner trip count and no wrap-around indexing, so LLVM vectorises them:
# about ten times the word-at-a-time loop on an AVX-512 core. A check is the OR of every word's
# difference from what it should be: nonzero iff some tail word disagrees (the tiles of the
# build's `block` shape the sums only, never this).

@njit(cache=True, inline="always")
def slot_tails(a, words):
    head = a[:HEAD]
    end = words - (words - HEAD) % HEAD
    for r0 in range(HEAD, end, HEAD):
        row = a[r0:r0 + HEAD]
        for j in range(HEAD):
            row[j] = splitmix(head[j] ^ U(r0 + j))
    for w in range(end, words):
        a[w] = splitmix(head[w & 63] ^ U(w))


@njit(cache=True, inline="always")
def slot_tails_differ(a, words):
    head = a[:HEAD]
    bad = U(0)
    end = words - (words - HEAD) % HEAD
    for r0 in range(HEAD, end, HEAD):
        row = a[r0:r0 + HEAD]
        for j in range(HEAD):
            bad |= row[j] ^ splitmix(head[j] ^ U(r0 + j))
    for w in range(end, words):
        bad |= a[w] ^ splitmix(head[w & 63] ^ U(w))
    return bad


@njit(cache=True, inline="always")
def line_tails(a, words, c):
    first = min(words, HEAD)
    for w in range(2, first):
        a[w] = splitmix(c ^ U(w))
    end = words - (words - first) % HEAD
    for r0 in range(first, end, HEAD):
        row = a[r0:r0 + HEAD]
        for j in range(HEAD):
            row[j] = splitmix(c ^ U(r0 + j))
    for w in range(end, words):
        a[w] = splitmix(c ^ U(w))


@njit(cache=True, inline="always")
def line_tails_differ(a, words, c):
    bad = U(0)
    first = min(words, HEAD)
    for w in range(2, first):
        bad |= a[w] ^ splitmix(c ^ U(w))
    end = words - (words - first) % HEAD
    for r0 in range(first, end, HEAD):
        row = a[r0:r0 + HEAD]
        for j in range(HEAD):
            bad |= row[j] ^ splitmix(c ^ U(r0 + j))
    for w in range(end, words):
        bad |= a[w] ^ splitmix(c ^ U(w))
    return bad


@njit(cache=True, inline="always")
def fill_slot(kv, base, words, t, p, salt):
    """Write slot (t, p) at `base`; return the sum of its heads rotated by p."""
    s = U(0)
    for w in range(HEAD):
        v = mark(t, p, w, salt)
        kv[base + w] = v
        s += rotl(v, p)
    slot_tails(kv[base:base + words], words)
    return s


@njit(cache=True, inline="always")
def read_slot(kv, base, words, q, tile):
    """Sum the slot's heads rotated by q, tile by tile; and 1 if a tail disagrees with its head, else 0."""
    s = U(0)
    for t0 in range(0, HEAD, tile):
        part = U(0)
        for w in range(t0, min(t0 + tile, HEAD)):
            part += rotl(kv[base + w], q)
        s += part
    return s, np.int64(slot_tails_differ(kv[base:base + words], words) != U(0))


@njit(cache=True, inline="always")
def seq_sum(kv, block_table, g, n, words, page, width, tile):
    """The sequence sum over positions [0, n) of page-table row g, POISON folded in if any tail is bad."""
    s = U(0)
    bad = 0
    for q in range(n):
        slot = np.int64(block_table[g * width + q // page]) * page + q % page
        part, b = read_slot(kv, slot * words, words, q, tile)
        s += part
        bad += b
    if bad:
        s ^= POISON
    return s


@njit(cache=True, inline="always")
def line_read(mem, base, words):
    """A line's carry, or carry ^ POISON if a tail word disagrees."""
    c = mem[base]
    if line_tails_differ(mem[base:base + words], words, c) != U(0):
        return c ^ POISON
    return c


@njit(cache=True, inline="always")
def carry_at(mem, base, c, p0):
    """The position check: a line continues only at the position it says."""
    if p0 == 0:
        return U(0)
    if mem[base + 1] != U(p0):
        return c ^ POISON
    return c


@njit(cache=True, inline="always")
def line_write(mem, base, words, c, pos):
    mem[base] = c
    mem[base + 1] = U(pos)
    line_tails(mem[base:base + words], words, c)


@njit(cache=True, parallel=True, nogil=True)
def toy_write(grid, tile, token_ids, positions, slot_mapping, kv, salt, bpt):
    words = bpt // 8
    for r in prange(grid):
        fill_slot(kv, slot_mapping[r] * words, words, token_ids[r], positions[r], salt)


@njit(cache=True, parallel=True, nogil=True)
def toy_predict(grid, tile, seq_lens, block_table, kv, salt, next_token, bpt, page, width):
    words = bpt // 8
    for g in prange(grid):
        n = min(np.int64(seq_lens[g]), np.int64(width) * page)
        next_token[g] = next_of(seq_sum(kv, block_table, g, n, words, page, width, tile))


@njit(cache=True, parallel=True, nogil=True)
def toy_predict_mem(grid, tile, seq_lens, block_table, kv, line_index, mem, salt, next_token, bpt, page, width, line_bytes):
    words = bpt // 8
    lwords = line_bytes // 8
    for g in prange(grid):
        n = min(np.int64(seq_lens[g]), np.int64(width) * page)
        s = seq_sum(kv, block_table, g, n, words, page, width, tile)
        line = np.int64(line_index[g])
        c = U(0)
        if line > 0:
            c = line_read(mem, line * lwords, lwords)
        next_token[g] = next_of(s + c)


@njit(cache=True, parallel=True, nogil=True)
def toy_fold(grid, tile, token_ids, positions, line_index, mem, salt, rows, line_bytes):
    lwords = line_bytes // 8
    for g in prange(grid):
        line = np.int64(line_index[g])
        if line <= 0:
            continue
        base = line * lwords
        r0 = g * rows
        p0 = positions[r0]
        c = carry_at(mem, base, line_read(mem, base, lwords), p0)
        for i in range(rows):
            c = fold(c, token_ids[r0 + i], positions[r0 + i], salt)
        line_write(mem, base, lwords, c, p0 + rows)


@njit(cache=True, inline="always")
def _round(g, tile, token_ids, positions, slot_mapping, block_table, kv, line_index, mem, salt, out, count, bpt, page, width, rows, line_bytes):
    words = bpt // 8
    r0 = g * rows
    p0 = positions[r0]
    s = seq_sum(kv, block_table, g, p0, words, page, width, tile)
    lwords = line_bytes // 8
    line = np.int64(line_index[g]) if line_bytes > 0 else np.int64(0)
    c = U(0)
    if line > 0:
        base = line * lwords
        c = carry_at(mem, base, line_read(mem, base, lwords), p0)
    t = token_ids[r0]
    taken = 1
    keep = c
    for i in range(rows):
        p = p0 + i
        s += fill_slot(kv, slot_mapping[r0 + i] * words, words, t, p, salt)
        if line > 0:
            c = fold(c, t, p, salt)
        n = next_of(s + c)
        out[r0 + i] = n
        if i == 0:
            taken = 1 + np.int64(s % U(rows))
        if i == taken - 1:
            keep = c
        t = n
    count[g] = taken
    if line > 0:
        line_write(mem, line * lwords, lwords, keep, p0 + taken)


@njit(cache=True, parallel=True, nogil=True)
def toy_round(grid, tile, token_ids, positions, slot_mapping, block_table, kv, salt, out, count, bpt, page, width, rows):
    none = np.zeros(1, np.int32)
    nomem = np.zeros(1, np.uint64)
    for g in prange(grid):
        _round(g, tile, token_ids, positions, slot_mapping, block_table, kv, none, nomem, salt, out, count, bpt, page, width, rows, 0)


@njit(cache=True, parallel=True, nogil=True)
def toy_round_mem(grid, tile, token_ids, positions, slot_mapping, block_table, kv, line_index, mem, salt, out, count, bpt, page, width, rows, line_bytes):
    for g in prange(grid):
        _round(g, tile, token_ids, positions, slot_mapping, block_table, kv, line_index, mem, salt, out, count, bpt, page, width, rows, line_bytes)
