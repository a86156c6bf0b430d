"""The attn toy's kernel on CUDA (numba.cuda), bit for bit the CPU kernel of `cpu.py`.

`toy_attn(grid, block, *args, stream=0)` runs one block per sequence and `block` threads a block.
The block reads the sequence's positions [0, p0) of the state (every word, spread over the
threads) into the five running sums and a count of tails that disagree, each a wrapping u64
shared-memory tree reduction, so any block size gives the same bits. Then it takes its rows in
order: thread w < 16 writes head word w (K for w < 8, V for w >= 8) from the row's read, every
thread writes tails, and every thread adds the row's entry to its copy of the sums (all threads
hold the same sums). Thread 0 writes the token after the last row.

This module imports `numba.cuda`: on numpy >= 2.5 import `runtime.gpu` first.
"""

import numpy as np
from numba import cuda

U = np.uint64
I = np.int64
GOLDEN = U(0x9E3779B97F4A7C15)
MIX1 = U(0xBF58476D1CE4E5B9)
MIX2 = U(0x94D049BB133111EB)
K_T = U(0x100000001B3)
K_P = U(0x9E3779B1)
K_W = U(0xC2B2AE35)
POISON = U(0xBAD0BAD0BAD0BAD0)
ZERO = U(0)
ONE = U(1)
HALF = 8
HEAD = 16
BUCKETS = 4
SUMS = 1 + BUCKETS
QUERY = 16
EOS = 256
MAX_BLOCK = 1024


@cuda.jit(device=True)
def splitmix(x):
    x = x + GOLDEN
    x = (x ^ (x >> U(30))) * MIX1
    x = (x ^ (x >> U(27))) * MIX2
    return x ^ (x >> U(31))


@cuda.jit(device=True)
def rotl(x, k):
    k = U(k) & U(63)
    if k == ZERO:
        return x
    return (x << k) | (x >> (U(64) - k))


@cuda.jit(device=True)
def mark(t, p, w, salt):
    return splitmix((t * K_T) ^ (p * K_P) ^ (U(w) * K_W) ^ U(salt[w & 63]))


@cuda.jit(device=True)
def next_of(s):
    if (s >> U(56)) % U(96) == ZERO:
        return I(EOS)
    return I(s % U(256))


@cuda.jit(device=True)
def block_sum(sh, a):
    """The wrapping u64 sum of `a` over the block (a shared-memory tree); every thread gets it."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    sh[tid] = a
    cuda.syncthreads()
    p = 1
    while p * 2 <= nt:
        p *= 2
    if tid + p < nt:
        sh[tid] += sh[tid + p]
    cuda.syncthreads()
    s = p // 2
    while s > 0:
        if tid < s:
            sh[tid] += sh[tid + s]
        cuda.syncthreads()
        s //= 2
    r = sh[0]
    cuda.syncthreads()
    return r


@cuda.jit(device=True)
def read(sums, query):
    total = sums[0]
    for b in range(BUCKETS):
        total += sums[1 + b]
    return total + U(2) * sums[1 + I(query >> U(62))]


@cuda.jit(cache=True)
def _attn(token_ids, positions, slot_mapping, cu, block_table, kv, salt, next_token, bpt, page, width):
    sh = cuda.shared.array(MAX_BLOCK, np.uint64)
    h = cuda.shared.array(HEAD, np.uint64)
    sums = cuda.local.array(SUMS, np.uint64)
    g = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    r0 = I(cu[g])
    r1 = I(cu[g + 1])
    if r1 <= r0:
        return
    words = I(bpt // 8)
    p0 = I(positions[r0])
    for b in range(SUMS):
        sums[b] = ZERO
    bad = ZERO
    for i in range(tid, p0 * words, nt):
        q = i // words
        w = i - q * words
        base = (I(block_table[g * width + q // page]) * page + q % page) * words
        v = kv[base + w]
        if w < HALF:
            sums[0] += rotl(v, q)
        elif w < HEAD:
            sums[1 + I(kv[base] >> U(62))] += rotl(v, q + 32)
        elif v != splitmix(kv[base + (w & (HEAD - 1))] ^ U(w)):
            bad += ONE
    for b in range(SUMS):
        sums[b] = block_sum(sh, sums[b])
    bad = block_sum(sh, bad)
    if bad != ZERO:
        sums[0] ^= POISON
    o = ZERO
    for r in range(r0, r1):
        t = U(token_ids[r])
        p = I(positions[r])
        query = mark(t, U(p), QUERY, salt)
        base = I(slot_mapping[r]) * words
        if tid < HEAD:
            v = splitmix(mark(t, U(p), tid, salt) ^ rotl(read(sums, query), tid))
            h[tid] = v
            kv[base + tid] = v
        cuda.syncthreads()
        for w in range(HEAD + tid, words, nt):
            kv[base + w] = splitmix(h[w & (HEAD - 1)] ^ U(w))
        ks = ZERO
        vs = ZERO
        for w in range(HALF):
            ks += rotl(h[w], p)
            vs += rotl(h[HALF + w], p + 32)
        sums[0] += ks
        sums[1 + I(h[0] >> U(62))] += vs
        o = read(sums, query)
        cuda.syncthreads()  # h is rewritten by the next row
    if tid == 0:
        next_token[g] = next_of(splitmix(o))


def toy_attn(grid, block, token_ids, positions, slot_mapping, cu_seqlens, block_table, kv, salt, next_token, bpt, page, width, *, stream=0):
    if not HEAD <= block <= MAX_BLOCK:
        raise ValueError(f"toy_attn needs a block of {HEAD}..{MAX_BLOCK} threads (one per head word at least), got {block}")
    if grid > 0:
        _attn[grid, block, stream](token_ids, positions, slot_mapping, cu_seqlens, block_table, kv, salt, next_token, bpt, page, width)
