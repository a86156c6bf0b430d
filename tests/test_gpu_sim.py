"""The CUDA kernels under numba's CUDA simulator equal the CPU kernels bit for bit (no GPU needed).

The simulator runs each block's threads as Python threads, so the shapes are tiny: 72-word token
slots (64 heads, 8 tails), pages of 2, a 3-page table, two sequences, 12-word lines. It runs in a
subprocess, since the simulator is chosen when numba.cuda is first imported.
"""

import numpy as np

from tests.simulator import simulate


def test_cuda_kernels_equal_the_cpu_kernels_under_the_simulator():
    """A quick subset (about 40 simulated blocks); `_simulate(full=True)` runs every block size on
    every input (about 160 blocks)."""
    simulate("tests.test_gpu_sim")


def _simulate(full: bool = False) -> None:
    """Run every entry on the CPU and on the simulated GPU over the same inputs; assert equal.

    Blocks of 64 take the fast path (a thread's head word is fixed); 96 and 32 the general one,
    and 96 folds a block that is not a power of two into the tree."""
    import runtime.gpu  # noqa: F401  (makes numba.cuda importable on numpy >= 2.5)
    from toy.kernels import cpu
    from toy.kernels import cuda as gk
    from toy.model import SALT

    np.seterr(over="ignore")
    gk.SPLIT_BLOCKS = 4  # two splits per sequence, uneven, keeps the simulator quick
    U = np.uint64
    words, page, width, lwords = 72, 2, 3, 12
    bpt, line_bytes = words * 8, lwords * 8
    salt = np.array([np.int64(s) for s in SALT], np.int64)
    rng = np.random.default_rng(7)
    tables = np.array([[1, 2, 3], [4, 5, 6]], np.int32).reshape(-1)
    lens = np.array([5, 4], np.int32)

    def rows_of(seqs):  # (token, position, slot) of every position of each sequence
        t, p, s = [], [], []
        for g, n in enumerate(seqs):
            for q in range(n):
                t.append(int(rng.integers(0, 257)))
                p.append(q)
                s.append(int(tables[g * width + q // page]) * page + q % page)
        return np.array(t, np.int64), np.array(p, np.int64), np.array(s, np.int64)

    def both(name, block, args, mutable):
        """Run entry `name` on copies of args on each side; return the mutable args of each."""
        a = [x.copy() if isinstance(x, np.ndarray) else x for x in args]
        b = [x.copy() if isinstance(x, np.ndarray) else x for x in args]
        grid = args[0]
        getattr(cpu, name)(grid, block, *a[1:])
        getattr(gk, name)(grid, block, *b[1:])
        for i in mutable:
            assert np.array_equal(a[i], b[i]), f"{name} block {block}: argument {i} differs"
        return a

    tok, pos, slots = rows_of([5, 4])
    kv0 = np.zeros(8 * page * words, U)
    for block in (64, 96) if full else (96,):
        kv = both("toy_write", block, [len(tok), tok, pos, slots, kv0, salt, bpt], [4])[4]
    bad = kv.copy()
    bad[(4 * page + 1) * words + 70] ^= U(1)  # one tail word of sequence 1 disagrees with its head
    nt = np.zeros(2, np.int64)
    for block, state in [(b, s) for b in (64, 96, 128) for s in (kv, bad)] if full else [(64, kv), (64, bad), (32, bad)]:
        both("toy_predict", block, [2, lens, tables, state, salt, nt, bpt, page, width], [5])

    # lines: slot 0 unused, sequence g owns line g + 1
    mem0 = np.zeros(3 * lwords, U)
    li = np.array([1, 2], np.int32)
    ft = np.array([3, 9, 250, 256], np.int64)
    fp = np.array([0, 1, 0, 1], np.int64)
    for block in (64, 96) if full else (64,):
        mem = both("toy_fold", block, [2, ft, fp, li, mem0, salt, 2, line_bytes], [4])[4]
    fp2 = np.array([2, 3, 5, 6], np.int64)  # sequence 1's line says 2, not 5: a stale copy
    memb = mem.copy()
    memb[2 * lwords + 7] ^= U(1)
    for block in (64, 96) if full else (96,):
        both("toy_fold", block, [2, ft, fp2, li, mem, salt, 2, line_bytes], [4])
        for m in (mem, memb) if full else (memb,):
            both("toy_predict_mem", block, [2, lens, tables, kv, li, m, salt, nt, bpt, page, width, line_bytes], [7])

    # rounds of 2 rows: sequence 0 at p0 = 5 (its line says 2: stale) ends its page 3 and spills to
    # page 7; sequence 1 at p0 = 2 (its line continues there) rewrites its page 5
    rt = np.array([17, 0, 200, 0], np.int64)
    rp = np.array([5, 6, 2, 3], np.int64)
    rs = np.array([7, 14, 10, 11], np.int64)
    out = np.zeros(4, np.int64)
    cnt = np.zeros(2, np.int32)
    for block, state in [(b, s) for b in (64, 96) for s in (kv, bad)] if full else [(64, bad)]:
        both("toy_round", block, [2, rt, rp, rs, tables, state, salt, out, cnt, bpt, page, width, 2], [5, 7, 8])
        for m in (mem, memb) if full else (mem,):
            both("toy_round_mem", block, [2, rt, rp, rs, tables, state, li, m, salt, out, cnt, bpt, page, width, 2, line_bytes], [5, 7, 9, 10])
    print("simulated: all equal")
