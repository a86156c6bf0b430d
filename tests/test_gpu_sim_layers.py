"""The layered toy's CUDA kernels equal its CPU kernels bit for bit under numba's CUDA simulator.

Tiny shapes (the simulator runs each thread as a Python thread): 24-word slots (16 heads, 8
tails), pages of 2, a 4-page table, two sequences packed into one layer call (one continuing at
position 3, one fresh), a tail word that disagrees with its head. A subprocess, since the simulator
is chosen when numba.cuda is first imported.
"""

import numpy as np

from tests.simulator import simulate


def test_layer_kernels_equal_the_cpu_kernels_under_the_simulator():
    simulate("tests.test_gpu_sim_layers")


def _simulate() -> None:
    import runtime.gpu  # noqa: F401  (makes numba.cuda importable on numpy >= 2.5)
    from toy import model
    from toy.layers import cpu
    from toy.layers import cuda as gk

    np.seterr(over="ignore")
    words, page, width = 24, 2, 4
    bpt = words * 8
    salt = np.array([np.int64(s) for s in model.SALT], np.int64)
    source = np.array(model.source(2), np.int64)

    def both(name, block, args, mutable):
        a = [x.copy() if isinstance(x, np.ndarray) else x for x in args]
        b = [x.copy() if isinstance(x, np.ndarray) else x for x in args]
        getattr(cpu, name)(args[0], block, *a[1:])
        getattr(gk, name)(args[0], block, *b[1:])
        for i in mutable:
            assert np.array_equal(a[i], b[i]), f"{name} block {block}: argument {i} differs"
        return a

    mix = both("toy_derive", 32, [16, source, np.zeros(16, np.int64)], [2])[2]
    assert mix.view(np.uint64).tolist() == model.derive_mix(model.source(2))
    table = both("toy_table", 32, [32, mix, salt, np.zeros(32, np.int64)], [3])[3]

    tables = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32).reshape(-1)
    # sequence 0 holds positions 0..2 already; both then feed rows: 0 at 3..5, 1 at 0..1
    kv = np.zeros(10 * page * words, np.uint64)
    tok0 = np.array([7, 8, 9], np.int64)
    pos0 = np.arange(3, dtype=np.int64)
    slot0 = np.array([tables[q // page] * page + q % page for q in range(3)], np.int64)
    cu0 = np.array([0, 3], np.int64)
    act0 = np.zeros(3 * 8, np.int64)
    act0 = both("toy_embed", 32, [1, cu0, tok0, pos0, salt, act0], [5])[5]
    kv = both("toy_layer", 32, [1, pos0, slot0, cu0, tables, kv, mix, table, act0, bpt, page, width], [5, 8])[5]

    tok = np.array([1, 2, 3, 4, 5], np.int64)
    pos = np.array([3, 4, 5, 0, 1], np.int64)
    slots = np.array([2 * page + 1, 3 * page, 3 * page + 1, 5 * page, 5 * page + 1], np.int64)
    cu = np.array([0, 3, 5], np.int64)
    bad = kv.copy()
    bad[(1 * page + 1) * words + 20] ^= np.uint64(1)  # a tail of sequence 0's position 1
    for block, state in ((32, kv), (48, kv), (32, bad)):
        act = both("toy_embed", block, [2, cu, tok, pos, salt, np.zeros(5 * 8, np.int64)], [5])[5]
        out = both("toy_layer", block, [2, pos, slots, cu, tables, state, mix[8:], table[16:], act, bpt, page, width], [5, 8])
        both("toy_head", block, [2, cu, out[8], np.zeros(2, np.int64)], [3])
    print("simulated: all equal")
