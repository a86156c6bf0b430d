"""The toy kernels on CUDA (numba.cuda), bit for bit the CPU kernels of `cpu.py`.

Each entry takes `(grid, block, *args)` exactly as its CPU twin does (plus a keyword-only
`stream`, a numba stream; the default stream if left out), and launches with `block` threads
per block. Arrays are flat device arrays (cupy or numba); states are u64 views of their
arenas. All arithmetic is u64 and wraps; every sum is a wrapping u64 shared-memory tree
reduction and every tail check counts mismatches (a reduced count, not a per-thread flag), so
any block size gives the same bits.

`write` runs one block per row. `predict`, `round` split each sequence's read over several
blocks for bandwidth (SPEC §11): a first kernel (`_part`) writes one partial (sum, bad count)
per block, and a second, one block per sequence, combines them exactly (u64 sums and integer
counts commute), reads the line when there is one, and emits. `fold` is one block per sequence.

This module imports `numba.cuda`: on numpy >= 2.5 import `runtime.gpu` first (it makes numba
importable there).
"""

import math
import weakref

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
HEAD = 64
EOS = 256
MAX_BLOCK = 1024  # the reduction tiles' size: any launch block up to this
SPLIT_BLOCKS = 4096  # a split read aims at about this many blocks in all


# -- the arithmetic (SPEC §2) ---------------------------------------------------------------------


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
    return splitmix((U(t) * K_T) ^ (U(p) * K_P) ^ (U(w) * K_W) ^ U(salt[w & 63]))


@cuda.jit(device=True)
def fold(c, t, p, salt):
    return rotl(c, 7) ^ mark(t, p, 0, salt)


@cuda.jit(device=True)
def next_of(s):
    if (s >> U(56)) % U(96) == ZERO:
        return I(EOS)
    return I(s % U(256))


# -- block reductions -----------------------------------------------------------------------------


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
    if tid + p < nt:  # fold a block that is not a power of two onto its first p threads
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
    cuda.syncthreads()  # the tiles may be reused at once
    return ra, rb


@cuda.jit(device=True)
def line_bad(mem, base, lwords, c):
    """This thread's share of a line check: tail words (w >= 2) that disagree with carry `c`."""
    bad = ZERO
    for w in range(2 + cuda.threadIdx.x, lwords, cuda.blockDim.x):
        if mem[base + w] != splitmix(c ^ U(w)):
            bad += ONE
    return bad


@cuda.jit(device=True)
def line_write(mem, base, lwords, c, pos):
    tid = cuda.threadIdx.x
    if tid == 0:
        mem[base] = c
        mem[base + 1] = U(pos)
    for w in range(2 + tid, lwords, cuda.blockDim.x):
        mem[base + w] = splitmix(c ^ U(w))


# -- the split sequence read ----------------------------------------------------------------------


@cuda.jit(cache=True)
def _part(splits, lens, lstride, cap, block_table, kv, bpt, page, width, psum, pbad):
    """Block (g, k) reads the k-th of `splits` runs of positions of sequence g's [0, n):
    n = min(lens[g * lstride], cap). It sums heads rotated by their position and counts tails that
    disagree with their head; thread 0 stores the block's partials at g * splits + k."""
    sha = cuda.shared.array(MAX_BLOCK, np.uint64)
    shb = cuda.shared.array(MAX_BLOCK, np.uint64)
    bid = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    g = bid // splits
    k = bid - g * splits
    n = min(I(lens[g * lstride]), I(cap))
    chunk = (n + splits - 1) // splits
    q0 = k * chunk
    q1 = min(n, q0 + chunk)
    words = bpt // 8
    s = ZERO
    bad = ZERO
    fast = nt % 64 == 0 and words >= HEAD
    hw = tid & 63
    unt = U(nt)
    for q in range(q0, q1):
        base = (I(block_table[g * width + q // page]) * page + q % page) * words
        if fast:
            # every word this thread reads in the slot has the same head word, w & 63 == tid & 63;
            # unsigned indices spare the negative-index wraparound on every load
            ub = U(base)
            h = kv[ub + U(hw)]
            w = tid
            if w < HEAD:
                s += rotl(h, q)
                w += nt
            step = 4 * nt
            while w + 3 * nt < words:
                uw = U(w)
                v0 = kv[ub + uw]
                v1 = kv[ub + uw + unt]
                v2 = kv[ub + uw + U(2) * unt]
                v3 = kv[ub + uw + U(3) * unt]
                if v0 != splitmix(h ^ uw):
                    bad += ONE
                if v1 != splitmix(h ^ (uw + unt)):
                    bad += ONE
                if v2 != splitmix(h ^ (uw + U(2) * unt)):
                    bad += ONE
                if v3 != splitmix(h ^ (uw + U(3) * unt)):
                    bad += ONE
                w += step
            while w < words:
                uw = U(w)
                if kv[ub + uw] != splitmix(h ^ uw):
                    bad += ONE
                w += nt
        else:
            for w in range(tid, words, nt):
                v = kv[base + w]
                if w < HEAD:
                    s += rotl(v, q)
                elif v != splitmix(kv[base + (w & 63)] ^ U(w)):
                    bad += ONE
    s, bad = block_sum2(sha, shb, s, bad)
    if tid == 0:
        psum[bid] = s
        pbad[bid] = bad


@cuda.jit(device=True)
def _gather(sha, shb, splits, psum, pbad, g):
    """The sequence sum of g from its partials, POISON folded in if any tail was bad."""
    s = ZERO
    bad = ZERO
    for k in range(cuda.threadIdx.x, splits, cuda.blockDim.x):
        s += psum[g * splits + k]
        bad += pbad[g * splits + k]
    s, bad = block_sum2(sha, shb, s, bad)
    if bad != ZERO:
        s ^= POISON
    return s


@cuda.jit(cache=True)
def _predict_fin(splits, psum, pbad, lined, line_index, mem, lwords, next_token):
    sha = cuda.shared.array(MAX_BLOCK, np.uint64)
    shb = cuda.shared.array(MAX_BLOCK, np.uint64)
    g = cuda.blockIdx.x
    s = _gather(sha, shb, splits, psum, pbad, g)
    line = I(line_index[g]) if lined else I(0)
    c = ZERO
    if line > 0:
        base = line * lwords
        c = mem[base]
        lbad, _ = block_sum2(sha, shb, line_bad(mem, base, lwords, c), ZERO)
        if lbad != ZERO:
            c ^= POISON
    if cuda.threadIdx.x == 0:
        next_token[g] = next_of(s + c)


@cuda.jit(cache=True)
def _round_fin(splits, psum, pbad, token_ids, positions, slot_mapping, kv, lined, line_index, mem, salt, out, count, bpt, rows, lwords):
    sha = cuda.shared.array(MAX_BLOCK, np.uint64)
    shb = cuda.shared.array(MAX_BLOCK, np.uint64)
    heads = cuda.shared.array(HEAD, np.uint64)
    g = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    words = bpt // 8
    r0 = g * rows
    p0 = I(positions[r0])
    s = _gather(sha, shb, splits, psum, pbad, g)
    line = I(line_index[g]) if lined else I(0)
    c = ZERO
    if line > 0:
        base = line * lwords
        c = mem[base]
        at = mem[base + 1]
        lbad, _ = block_sum2(sha, shb, line_bad(mem, base, lwords, c), ZERO)
        if lbad != ZERO:
            c ^= POISON
        if p0 == 0:
            c = ZERO
        elif at != U(p0):
            c ^= POISON
    t = I(token_ids[r0])
    taken = I(1)
    keep = c
    for i in range(rows):
        p = p0 + i
        sbase = I(slot_mapping[r0 + i]) * words
        part = ZERO
        for w in range(tid, min(HEAD, words), nt):
            v = mark(t, p, w, salt)
            kv[sbase + w] = v
            heads[w] = v
            part += rotl(v, p)
        part, _ = block_sum2(sha, shb, part, ZERO)  # its barriers publish `heads` too
        for w in range(HEAD + tid, words, nt):
            kv[sbase + w] = splitmix(heads[w & 63] ^ U(w))
        s += part
        if line > 0:
            c = fold(c, t, p, salt)
        n = next_of(s + c)
        if tid == 0:
            out[r0 + i] = n
        if i == 0:
            taken = 1 + I(s % U(rows))
        if i == taken - 1:
            keep = c
        t = n
        cuda.syncthreads()  # `heads` is rewritten by the next row
    if tid == 0:
        count[g] = taken
    if line > 0:
        line_write(mem, line * lwords, lwords, keep, p0 + taken)


# -- one block per row / sequence -----------------------------------------------------------------


@cuda.jit(cache=True)
def _write(token_ids, positions, slot_mapping, kv, salt, bpt):
    heads = cuda.shared.array(HEAD, np.uint64)
    r = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    words = bpt // 8
    base = I(slot_mapping[r]) * words
    t = token_ids[r]
    p = positions[r]
    for w in range(tid, min(HEAD, words), nt):
        v = mark(t, p, w, salt)
        kv[base + w] = v
        heads[w] = v
    cuda.syncthreads()
    for w in range(HEAD + tid, words, nt):
        kv[base + w] = splitmix(heads[w & 63] ^ U(w))


@cuda.jit(cache=True)
def _fold(token_ids, positions, line_index, mem, salt, rows, lwords):
    sha = cuda.shared.array(MAX_BLOCK, np.uint64)
    shb = cuda.shared.array(MAX_BLOCK, np.uint64)
    g = cuda.blockIdx.x
    line = I(line_index[g])
    if line <= 0:
        return
    base = line * lwords
    r0 = g * rows
    p0 = I(positions[r0])
    c = mem[base]
    at = mem[base + 1]
    lbad, _ = block_sum2(sha, shb, line_bad(mem, base, lwords, c), ZERO)
    if lbad != ZERO:
        c ^= POISON
    if p0 == 0:
        c = ZERO
    elif at != U(p0):
        c ^= POISON
    if cuda.threadIdx.x == 0:  # thread 0 folds the rows in order
        for i in range(rows):
            c = fold(c, token_ids[r0 + i], positions[r0 + i], salt)
        sha[0] = c
    cuda.syncthreads()
    c = sha[0]
    line_write(mem, base, lwords, c, p0 + rows)


# -- the entries: fn(grid, block, *args) like the CPU's ---------------------------------------------

# Scratch per stream: launches on one stream are ordered, so they may share it. Held as long as the
# stream object is (the runtime's backend holds it, and its captured graphs hold the scratch's
# addresses): several runtimes in one process (a host's servers) each keep their own, and a runtime
# that is gone takes its scratch with it. Stream 0 (the legacy default) has one table for good.
_SCRATCH: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # stream -> {what: device array}
_SCRATCH0: dict = {}


def _table(stream) -> dict:
    if not stream:
        return _SCRATCH0
    got = _SCRATCH.get(stream)
    if got is None:
        got = _SCRATCH[stream] = {}
    return got


def _cached(table: dict, key, make):
    got = table.get(key)
    if got is None:
        got = table[key] = make()
    return got


def _scratch(name, stream, n, dtype):
    """A device array of at least n elements for launches on `stream`. It starts large enough for
    any split read of up to 4096 sequences (grid * splits < SPLIT_BLOCKS + grid), so it never moves
    once made: a captured CUDA graph holds its address."""
    table = _table(stream)
    got = _cached(table, name, lambda: cuda.device_array(max(n, 2 * SPLIT_BLOCKS), dtype))
    if got.size < n:
        got = table[name] = cuda.device_array(n, dtype)
    return got


def _none(stream):
    """Stand-ins for the line index and arena of a target without a line (never read)."""
    return _cached(_table(stream), "none", lambda: (cuda.to_device(np.zeros(1, np.int32)), cuda.to_device(np.zeros(1, np.uint64))))


def _splits(grid, cap):
    return max(1, min(math.ceil(SPLIT_BLOCKS / max(grid, 1)), int(cap)))


def _read(grid, block, lens, lstride, cap, block_table, kv, bpt, page, width, stream):
    """Launch the split read; return (splits, psum, pbad) for the combining kernel."""
    splits = _splits(grid, width * page)
    psum = _scratch("psum", stream, grid * splits, np.uint64)
    pbad = _scratch("pbad", stream, grid * splits, np.uint64)
    _part[grid * splits, block, stream](splits, lens, lstride, cap, block_table, kv, bpt, page, width, psum, pbad)
    return splits, psum, pbad


def toy_write(grid, block, token_ids, positions, slot_mapping, kv, salt, bpt, *, stream=0):
    if grid > 0:
        _write[grid, block, stream](token_ids, positions, slot_mapping, kv, salt, bpt)


def toy_predict(grid, block, seq_lens, block_table, kv, salt, next_token, bpt, page, width, *, stream=0):
    if grid <= 0:
        return
    splits, psum, pbad = _read(grid, block, seq_lens, 1, width * page, block_table, kv, bpt, page, width, stream)
    li, mem = _none(stream)
    _predict_fin[grid, block, stream](splits, psum, pbad, False, li, mem, 0, next_token)


def toy_predict_mem(grid, block, seq_lens, block_table, kv, line_index, mem, salt, next_token, bpt, page, width, line_bytes, *, stream=0):
    if grid <= 0:
        return
    splits, psum, pbad = _read(grid, block, seq_lens, 1, width * page, block_table, kv, bpt, page, width, stream)
    _predict_fin[grid, block, stream](splits, psum, pbad, True, line_index, mem, line_bytes // 8, next_token)


def toy_fold(grid, block, token_ids, positions, line_index, mem, salt, rows, line_bytes, *, stream=0):
    if grid > 0:
        _fold[grid, block, stream](token_ids, positions, line_index, mem, salt, rows, line_bytes // 8)


_UNCAPPED = 1 << 62  # the round reads [0, p0) of its page table, as the CPU does, uncapped


def toy_round(grid, block, token_ids, positions, slot_mapping, block_table, kv, salt, out, count, bpt, page, width, rows, *, stream=0):
    if grid <= 0:
        return
    splits, psum, pbad = _read(grid, block, positions, rows, _UNCAPPED, block_table, kv, bpt, page, width, stream)
    li, mem = _none(stream)
    _round_fin[grid, block, stream](splits, psum, pbad, token_ids, positions, slot_mapping, kv, False, li, mem, salt, out, count, bpt, rows, 0)


def toy_round_mem(grid, block, token_ids, positions, slot_mapping, block_table, kv, line_index, mem, salt, out, count, bpt, page, width, rows, line_bytes, *, stream=0):
    if grid <= 0:
        return
    splits, psum, pbad = _read(grid, block, positions, rows, _UNCAPPED, block_table, kv, bpt, page, width, stream)
    _round_fin[grid, block, stream](splits, psum, pbad, token_ids, positions, slot_mapping, kv, True, line_index, mem, salt, out, count, bpt, rows, line_bytes // 8)
