"""The layered toy's kernels on CUDA (numba.cuda), bit for bit the CPU kernels of `cpu.py`.

Each entry takes `(grid, block, *args)` as its CPU twin does, plus a keyword-only `stream` (a
numba stream; the default stream if left out), and launches `block` threads per block. i64
buffers are read and written as u64 views; states are u64 views of their arenas. The state read
is a wrapping u64 shared-memory tree reduction and the tail check a reduced count, so any block
size gives the same bits.

`layer` runs one block per sequence: the block reads the sequence's positions [0, p0) of the
layer's state (every word, spread over the threads), then takes its rows in order: thread w < 16
writes head word w, every thread writes tails, and thread j < 8 rewrites activation word j.
`embed` and `head` run one block per sequence, `derive` and `table` one block.

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
DERIVE_KEY = U(0xD3715EED00000001)
ZERO = U(0)
ONE = U(1)
ACT = 8
HEAD = 16
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
def next_of(s):
    if (s >> U(56)) % U(96) == ZERO:
        return I(EOS)
    return I(s % U(256))


@cuda.jit(device=True)
def block_sum2(sha, shb, a, b):
    """Wrapping u64 sums of `a` and `b` over the block (a shared-memory tree); every thread gets both."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    sha[tid] = a
    shb[tid] = b
    cuda.syncthreads()
    p = 1
    while p * 2 <= nt:
        p *= 2
    if tid + p < nt:
        sha[tid] += sha[tid + p]
        shb[tid] += shb[tid + p]
    cuda.syncthreads()
    s = p // 2
    while s > 0:
        if tid < s:
            sha[tid] += sha[tid + s]
            shb[tid] += shb[tid + s]
        cuda.syncthreads()
        s //= 2
    ra = sha[0]
    rb = shb[0]
    cuda.syncthreads()
    return ra, rb


@cuda.jit(cache=True)
def _embed(cu, token_ids, positions, salt, act):
    g = cuda.blockIdx.x
    r0 = I(cu[g])
    for i in range(cuda.threadIdx.x, (I(cu[g + 1]) - r0) * ACT, cuda.blockDim.x):
        r = r0 + i // ACT
        j = i % ACT
        t = U(token_ids[r])
        p = U(positions[r])
        act[r * ACT + j] = splitmix((t * K_T) ^ (p * K_P) ^ (U(j) * K_W) ^ U(salt[j]))


@cuda.jit(cache=True)
def _layer(positions, slot_mapping, cu, block_table, kv, mix, table, act, bpt, page, width):
    sha = cuda.shared.array(MAX_BLOCK, np.uint64)
    shb = cuda.shared.array(MAX_BLOCK, np.uint64)
    x = cuda.shared.array(ACT, np.uint64)
    h = cuda.shared.array(HEAD, np.uint64)
    g = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    r0 = I(cu[g])
    r1 = I(cu[g + 1])
    if r1 <= r0:
        return
    words = I(bpt // 8)
    p0 = I(positions[r0])
    s = ZERO
    bad = ZERO
    for i in range(tid, p0 * words, nt):
        q = i // words
        w = i - q * words
        base = (I(block_table[g * width + q // page]) * page + q % page) * words
        v = kv[base + w]
        if w < HEAD:
            s += rotl(v, q)
        elif v != splitmix(kv[base + (w & (HEAD - 1))] ^ U(w)):
            bad += ONE
    s, bad = block_sum2(sha, shb, s, bad)
    if bad != ZERO:
        s ^= POISON
    for r in range(r0, r1):
        p = I(positions[r])
        base = I(slot_mapping[r]) * words
        if tid < ACT:
            x[tid] = U(act[r * ACT + tid])
        cuda.syncthreads()
        if tid < HEAD:
            v = splitmix(x[tid & 7] ^ rotl(x[(tid + 3) & 7], tid + 1) ^ U(table[tid]) ^ (U(p) * K_P))
            h[tid] = v
            kv[base + tid] = v
        cuda.syncthreads()
        for w in range(HEAD + tid, words, nt):
            kv[base + w] = splitmix(h[w & (HEAD - 1)] ^ U(w))
        part = ZERO
        for w in range(HEAD):
            part += rotl(h[w], p)
        s += part
        if tid < ACT:
            act[r * ACT + tid] = splitmix(x[tid] ^ rotl(s, 8 * tid + 1) ^ U(mix[tid]) ^ x[(tid + 1) & 7])
        cuda.syncthreads()  # x and h are rewritten by the next row


@cuda.jit(cache=True)
def _head(cu, act, next_token):
    g = cuda.blockIdx.x
    if cuda.threadIdx.x == 0:
        r = I(cu[g + 1]) - 1
        s = ZERO
        for j in range(ACT):
            s += rotl(act[r * ACT + j], 8 * j)
        next_token[g] = next_of(s)


@cuda.jit(cache=True)
def _derive(n, source, mix):
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        mix[i] = splitmix(U(source[i]) ^ DERIVE_KEY)


@cuda.jit(cache=True)
def _table(n, mix, salt, table):
    for i in range(cuda.threadIdx.x, n, cuda.blockDim.x):
        w = i % HEAD
        table[i] = splitmix(U(mix[(i // HEAD) * ACT + (w & 7)]) ^ U(salt[i & 63]) ^ U(w))


def _u(a):
    return a.view(np.uint64)


def toy_embed(grid, block, cu_seqlens, token_ids, positions, salt, act, *, stream=0):
    if grid > 0:
        _embed[grid, block, stream](cu_seqlens, token_ids, positions, salt, _u(act))


def toy_layer(grid, block, positions, slot_mapping, cu_seqlens, block_table, kv, mix, table, act, bpt, page, width, *, stream=0):
    if not HEAD <= block <= MAX_BLOCK:
        raise ValueError(f"toy_layer needs a block of {HEAD}..{MAX_BLOCK} threads (one per head word at least), got {block}")
    if grid > 0:
        _layer[grid, block, stream](positions, slot_mapping, cu_seqlens, block_table, kv, mix, table, _u(act), bpt, page, width)


def toy_head(grid, block, cu_seqlens, act, next_token, *, stream=0):
    if grid > 0:
        _head[grid, block, stream](cu_seqlens, _u(act), next_token)


def toy_derive(grid, block, source, mix, *, stream=0):
    if grid > 0:
        _derive[1, block, stream](grid, source, _u(mix))


def toy_table(grid, block, mix, salt, table, *, stream=0):
    if grid > 0:
        _table[1, block, stream](grid, mix, salt, _u(table))
