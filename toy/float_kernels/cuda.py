"""The float toy's predict on CUDA (numba.cuda), bit for bit the CPU's `toyf_predict`.

One block per sequence. The threads split the slots' words for the exact integer sum and the tail
check (reduced as u64 sums, any block size the same bits), then each thread takes byte tokens
v = tid, tid + block, ... and adds the positions for its token's feature in the CPU's order: tiles of
``block // 32`` positions, each from 0.0, then the tiles in order. Additions only, in float32;
the only products are by powers of two, exact, so numba.cuda's fused multiply-add rounds as the
CPU's separate multiply and add do. Thread 0 takes the first largest logit.

This module imports `numba.cuda`: on numpy >= 2.5 import `runtime.gpu` first.
"""

import math

import numpy as np
from numba import cuda

from toy.kernels.cuda import EOS, HEAD, MAX_BLOCK, POISON, ZERO, ONE, I, U, block_sum2, next_of, rotl, splitmix

F = np.float32
VOCAB = 256
BANKS = 16
BIAS_EXP = 12
BIAS_SALT = U(0xF10A7F10A7F10A7)
EOS_TOP = 0x7F7F
EOS_LOW = 0xFF7F
TWO23 = 1 << 23
Y_SCALE = F(2.0**-23)
POISON_SCALE = F(2.0**-17)
POW2_ZERO = 149  # POW2[POW2_ZERO + k] == 2**k, exact in float32 for k in -149..127
POW2 = np.array([2.0 ** (i - POW2_ZERO) for i in range(POW2_ZERO + 128)], np.float32)


@cuda.jit(device=True)
def bias(q):
    mant = I(TWO23) + I(splitmix(U(q) ^ BIAS_SALT) >> U(41))
    return F(mant) * POW2[POW2_ZERO + BIAS_EXP - 23 + (q & 3)]


@cuda.jit(device=True)
def contribution(h, q, v):
    z = splitmix(rotl(h, q) ^ U(v))
    return F(I(z >> U(40)) - TWO23) * Y_SCALE


@cuda.jit(device=True)
def poison(v):
    z = splitmix(POISON ^ U(v))
    return F(I(z >> U(40)) - TWO23) * POISON_SCALE


@cuda.jit(device=True)
def bf16_round(x):
    if x == F(0):
        return F(0)
    _, e = math.frexp(x)
    c = F(1.5) * POW2[min(max(e + 15 + POW2_ZERO, 0), POW2_ZERO + 127)]
    return (x + c) - c


@cuda.jit(device=True)
def bf16_bits(r):
    if r == F(0):
        return I(0)
    sign = I(0)
    a = r
    if r < F(0):
        sign = I(1)
        a = -r
    m, e = math.frexp(a)
    return (sign << 15) | (I(e + 126) << 7) | (I(m * 256.0) - 128)


@cuda.jit(cache=True)
def _predict(seq_lens, block_table, kv, logits, next_token, bpt, page, width):
    sha = cuda.shared.array(MAX_BLOCK, np.uint64)
    shb = cuda.shared.array(MAX_BLOCK, np.uint64)
    top = cuda.shared.array(VOCAB, np.float32)
    g = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    words = bpt // 8
    n = min(I(seq_lens[g]), I(width) * page)
    s = ZERO
    bad = ZERO
    for q in range(n):
        base = (I(block_table[g * width + q // page]) * page + q % page) * words
        for w in range(tid, words, nt):
            v = kv[base + w]
            if w < HEAD:
                s += rotl(v, q)
            elif v != splitmix(kv[base + (w & 63)] ^ U(w)):
                bad += ONE
    s, bad = block_sum2(sha, shb, s, bad)
    if bad != ZERO:
        s ^= POISON
    bank = I((s >> U(8)) % U(BANKS))
    perm = I((s >> U(16)) & U(255))
    tile = max(1, nt // 32)
    stride = VOCAB + 1
    for v in range(tid, VOCAB, nt):
        f = bank * VOCAB + (v ^ perm)
        tot = F(0)
        for t0 in range(0, n, tile):
            part = F(0)
            for q in range(t0, min(n, t0 + tile)):
                base = (I(block_table[g * width + q // page]) * page + q % page) * words
                b = bias(q)
                y = contribution(kv[base + (f & 63)], q, f)
                part = (part + (y + b)) - b
            tot = tot + part
        if bad != ZERO:
            tot = tot + poison(v)
        r = bf16_round(tot)
        top[v] = r
        logits[g * stride + v] = bf16_bits(r)
    cuda.syncthreads()
    if tid == 0:
        best = 0
        hi = top[0]
        for v in range(1, VOCAB):
            if top[v] > hi:
                hi = top[v]
                best = v
        if next_of(s) == I(EOS):
            logits[g * stride + VOCAB] = EOS_TOP
            next_token[g] = I(EOS)
        else:
            logits[g * stride + VOCAB] = EOS_LOW
            next_token[g] = I(best)


def toyf_predict(grid, block, seq_lens, block_table, kv, salt, logits, next_token, bpt, page, width, *, stream=0):
    if grid > 0:
        _predict[grid, block, stream](seq_lens, block_table, kv, logits, next_token, bpt, page, width)
