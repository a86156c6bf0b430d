"""The attn toy's CUDA kernel gives the CPU kernel's bits at every block size: a packed call of
three sequences, one continuing at position 40 over a poisoned tail (the whole-manifest CPU=GPU
check of every shape, toy-attn included, is tests/test_gpu.py's). Marked `gpu`; skips where cupy
sees no CUDA device."""

import numpy as np
import pytest

from tests.gpu_required import skip_without_gpu

cp = skip_without_gpu()  # runtime.gpu imported too, before numba.cuda

from toy import model  # noqa: E402
from toy.attn import cpu as cpu_k  # noqa: E402
from toy.attn import cuda as gpu_k  # noqa: E402

pytestmark = pytest.mark.gpu
SALT = np.array(model.SALT, np.uint64).view(np.int64)


@pytest.mark.parametrize("block", [16, 32, 96, 128, 256, 1024])
@pytest.mark.parametrize("poison", [False, True])
def test_the_attn_kernel_is_the_same_for_any_block(block, poison):
    rng = np.random.default_rng(7)
    words, page, width = 128, 16, 8
    tables = np.arange(1, 3 * width + 1, dtype=np.int32)
    kv = np.zeros((3 * width + 1) * page * words, np.uint64)
    # sequence 0's first 40 positions, as an earlier call would have left them
    pre = np.arange(40, dtype=np.int64)
    pre_slots = np.array([tables[q // page] * page + q % page for q in pre], np.int64)
    pre_ids = rng.integers(0, 257, 40, dtype=np.int64)
    out = np.zeros(1, np.int64)
    cpu_k.toy_attn(1, 64, pre_ids, pre, pre_slots, np.array([0, 40], np.int64), tables, kv, SALT, out, words * 8, page, width)
    want = model.generate(pre_ids.tolist(), 1, {"states": {"attn": {}}})
    assert out[0] == (want[0] if want else model.EOS)
    if poison:
        kv[pre_slots[13] * words + 77] ^= np.uint64(1 << 9)
    lens, starts = [20, 7, 1], [40, 0, 0]
    pos = np.concatenate([s + np.arange(n) for s, n in zip(starts, lens)]).astype(np.int64)
    g_of = np.repeat(np.arange(3), lens)
    slots = np.array([tables[g * width + q // page] * page + q % page for g, q in zip(g_of, pos)], np.int64)
    cu = np.array([0, 20, 27, 28], np.int64)
    ids = rng.integers(0, 257, 28, dtype=np.int64)
    want_kv, want_out = kv.copy(), np.zeros(3, np.int64)
    cpu_k.toy_attn(3, 128, ids, pos, slots, cu, tables, want_kv, SALT, want_out, words * 8, page, width)
    d = [cp.asarray(x) for x in (ids, pos, slots, cu, tables, kv, SALT, np.zeros(3, np.int64))]
    gpu_k.toy_attn(3, block, *d, words * 8, page, width)
    assert np.array_equal(d[5].get(), want_kv) and np.array_equal(d[7].get(), want_out)
