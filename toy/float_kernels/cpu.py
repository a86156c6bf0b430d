"""The float toy's predict on the CPU (numba njit, cached): bf16 logits from the paged state.

`toyf_predict(grid, block, seq_lens, block_table, kv, salt, logits, next_token, bpt, page, width)`:
for each sequence g, over its positions q < n, the exact integer sum S and the tail check (as
`toy_predict`), then for every byte token v the float32 sum of toy/model.py's steps for its
feature (bank * 256 + (v ^ perm), both from S), in this build's order: tiles of ``block // 32`` positions, each from 0.0 in position order, then the
tiles' results in order. Additions only (the products are by powers of two, exact, so a fused
multiply-add would round the same). A bad tail adds a poison term to every logit. Logits are
rounded to bf16 (nearest, ties to even) by adding and taking back 1.5 * 2**(e + 15), exact in
float32; the next token is EOS when `next_of(S)` says so, else the first byte token with the
largest logit.
"""

import math

import numpy as np
from numba import njit, prange

from toy.kernels.cpu import EOS, POISON, U, next_of, read_slot, rotl, splitmix

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


@njit(cache=True, inline="always")
def tile_of(block):
    return max(1, block // 32)


@njit(cache=True, inline="always")
def bias(q):
    mant = np.int64(TWO23) + np.int64(splitmix(U(q) ^ BIAS_SALT) >> U(41))
    return F(mant) * POW2[POW2_ZERO + BIAS_EXP - 23 + (q & 3)]


@njit(cache=True, inline="always")
def contribution(h, q, v):
    z = splitmix(rotl(h, q) ^ U(v))
    return F(np.int64(z >> U(40)) - TWO23) * Y_SCALE


@njit(cache=True, inline="always")
def poison(v):
    z = splitmix(POISON ^ U(v))
    return F(np.int64(z >> U(40)) - TWO23) * POISON_SCALE


@njit(cache=True, inline="always")
def bf16_round(x):
    if x == F(0):
        return F(0)
    _, e = math.frexp(x)
    c = F(1.5) * POW2[min(max(e + 15 + POW2_ZERO, 0), POW2_ZERO + 127)]
    return (x + c) - c


@njit(cache=True, inline="always")
def bf16_bits(r):
    if r == F(0):
        return np.int64(0)
    sign = np.int64(0)
    a = r
    if r < F(0):
        sign = np.int64(1)
        a = -r
    m, e = math.frexp(a)
    return (sign << 15) | (np.int64(e + 126) << 7) | (np.int64(m * 256.0) - 128)


@njit(cache=True, parallel=True, nogil=True)
def toyf_predict(grid, block, seq_lens, block_table, kv, salt, logits, next_token, bpt, page, width):
    words = bpt // 8
    tile = tile_of(block)
    stride = VOCAB + 1
    for g in prange(grid):
        n = min(np.int64(seq_lens[g]), np.int64(width) * page)
        s = U(0)
        bad = 0
        for q in range(n):
            slot = np.int64(block_table[g * width + q // page]) * page + q % page
            part, b = read_slot(kv, slot * words, words, q, block)
            s += part
            bad += b
        if bad:
            s ^= POISON
        bank = np.int64((s >> U(8)) % U(BANKS))
        perm = np.int64((s >> U(16)) & U(255))
        tot = np.zeros(VOCAB, np.float32)
        part = np.zeros(VOCAB, np.float32)
        for t0 in range(0, n, tile):
            part[:] = F(0)
            for q in range(t0, min(n, t0 + tile)):
                base = (np.int64(block_table[g * width + q // page]) * page + q % page) * words
                b = bias(q)
                for v in range(VOCAB):
                    f = bank * VOCAB + (v ^ perm)
                    y = contribution(kv[base + (f & 63)], q, f)
                    part[v] = (part[v] + (y + b)) - b
            for v in range(VOCAB):
                tot[v] = tot[v] + part[v]
        best = np.int64(0)
        top = F(0)
        for v in range(VOCAB):
            x = tot[v]
            if bad:
                x = x + poison(v)
            r = bf16_round(x)
            logits[g * stride + v] = bf16_bits(r)
            if v == 0 or r > top:
                top = r
                best = v
        if next_of(s) == EOS:
            logits[g * stride + VOCAB] = EOS_TOP
            next_token[g] = EOS
        else:
            logits[g * stride + VOCAB] = EOS_LOW
            next_token[g] = best
