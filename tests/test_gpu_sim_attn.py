"""The attn toy's CUDA kernel equals its CPU kernel bit for bit under numba's CUDA simulator.

Tiny shapes (the simulator runs each thread as a Python thread): 24-word slots (8 K, 8 V, 8
tails), pages of 2, a 4-page table, two sequences packed into one call (one continuing at
position 3, one fresh), with and without a tail word that disagrees with its head. A subprocess,
since the simulator is chosen when numba.cuda is first imported.
"""

import numpy as np

from tests.simulator import simulate


def test_the_attn_kernel_equals_the_cpu_kernel_under_the_simulator():
    simulate("tests.test_gpu_sim_attn")


def _simulate() -> None:
    import runtime.gpu  # noqa: F401  (makes numba.cuda importable on numpy >= 2.5)
    from toy import model
    from toy.attn import cpu
    from toy.attn import cuda as gk

    np.seterr(over="ignore")
    words, page, width = 24, 2, 4
    bpt = words * 8
    salt = np.array([np.int64(s) for s in model.SALT], np.int64)
    tables = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32).reshape(-1)

    def both(grid, block, ids, pos, slots, cu, kv):
        a, b = kv.copy(), kv.copy()
        out_a, out_b = np.zeros(grid, np.int64), np.zeros(grid, np.int64)
        cpu.toy_attn(grid, block, ids, pos, slots, cu, tables, a, salt, out_a, bpt, page, width)
        gk.toy_attn(grid, block, ids, pos, slots, cu, tables, b, salt, out_b, bpt, page, width)
        assert np.array_equal(a, b), f"block {block}: the state differs"
        assert np.array_equal(out_a, out_b), f"block {block}: next tokens {out_a} vs {out_b}"
        return a, out_a

    # sequence 0 holds positions 0..2 already (its first call's token is the model's)
    tok0 = np.array([7, 8, 9], np.int64)
    pos0 = np.arange(3, dtype=np.int64)
    slot0 = np.array([tables[q // page] * page + q % page for q in range(3)], np.int64)
    kv, first = both(1, 32, tok0, pos0, slot0, np.array([0, 3], np.int64), np.zeros(10 * page * words, np.uint64))
    want = model.generate([7, 8, 9], 1, {"states": {model.ATTN_STATE: {}}})
    assert first[0] == (want[0] if want else model.EOS)

    tok = np.array([1, 2, 3, 4, 5], np.int64)
    pos = np.array([3, 4, 5, 0, 1], np.int64)
    slots = np.array([2 * page + 1, 3 * page, 3 * page + 1, 5 * page, 5 * page + 1], np.int64)
    cu = np.array([0, 3, 5], np.int64)
    bad = kv.copy()
    bad[(1 * page + 1) * words + 20] ^= np.uint64(1)  # a tail of sequence 0's position 1
    outs = {}
    for block, name, state in ((16, "clean", kv), (32, "clean", kv), (48, "clean", kv), (32, "bad", bad)):
        outs[block, name] = both(2, block, tok, pos, slots, cu, state)[1].tolist()
    assert outs[32, "clean"] != outs[32, "bad"]  # the poisoned tail is seen
    print("simulated: all equal")
