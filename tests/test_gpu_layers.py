"""The layered toy on the GPU gives the CPU's answers bit for bit: a packed prefill at every block
size, and a cut's stage chain (the whole-manifest CPU=GPU check of every shape, toy-layers
included, is tests/test_gpu.py's). Marked `gpu`; skips where cupy sees no CUDA device."""

import numpy as np
import pytest

from tests.gpu_required import skip_without_gpu

cp = skip_without_gpu()  # runtime.gpu imported too, before numba.cuda

from manifests.cut import cut  # noqa: E402
from runtime.runtime import Runtime  # noqa: E402
from runtime.sequence import generate, single  # noqa: E402
from runtime.step import Cell  # noqa: E402
from tests.toyrun import target  # noqa: E402
from toy import model  # noqa: E402
from toy.layers import cpu as cpu_k  # noqa: E402
from toy.layers import cuda as gpu_k  # noqa: E402

pytestmark = pytest.mark.gpu
NAME = "toy-layers"
PROMPTS = [list(b"The lighthouse keeper had not seen a ship in eleven days"), list(b"x"), list(range(3, 250, 2)) * 3]


def test_a_packed_prefill_and_a_decode_batch_agree_with_the_cpu():
    m, w = target(NAME)
    out = {}
    for be in ("cpu", "gpu"):
        rt = Runtime(m, w, pages=1 + 3 * 30, backend=be, max_seqs=4)
        rt.set_pad(0, None)
        cells = [Cell(list(range(1 + 30 * i, 31 + 30 * i)), None, p, 0) for i, p in enumerate(PROMPTS)]
        rt.step("prefill", cells)
        dec = [Cell(c.pages, None, [c.tokens[0]], len(c.ids)) for c in cells]
        rt.step("decode", dec)
        out[be] = ([c.tokens for c in cells + dec], [rt.read_state(c.pages, None, c.pos + 1) for c in dec])
    assert out["cpu"] == out["gpu"]
    assert [t for t in out["cpu"][0][:3]] == [model.generate(p, 1, m.raw) for p in PROMPTS]


@pytest.mark.parametrize("block", [32, 96, 128, 256, 1024])
def test_the_layer_kernel_is_the_same_for_any_block(block):
    """A packed call of three sequences (one continuing at position 40, a tail poisoned)."""
    m, w = target(NAME)
    rng = np.random.default_rng(5)
    words, page, width = 128, 16, 8
    tables = np.arange(1, 3 * width + 1, dtype=np.int32)
    mix = np.array(model.derive_mix(model.source(4)), np.uint64).view(np.int64)
    table = np.array(model.table(model.derive_mix(model.source(4)), 4), np.uint64).view(np.int64)
    kv = np.zeros((3 * width + 1) * page * words, np.uint64)
    lens, starts = [20, 7, 1], [40, 0, 0]
    pos = np.concatenate([s + np.arange(n) for s, n in zip(starts, lens)]).astype(np.int64)
    g_of = np.repeat(np.arange(3), lens)
    slots = np.array([tables[g * width + q // page] * page + q % page for g, q in zip(g_of, pos)], np.int64)
    cu = np.array([0, 20, 27, 28], np.int64)
    # sequence 0's first 40 positions, as an earlier call would have left them, one tail poisoned
    pre = np.arange(40, dtype=np.int64)
    pre_slots = np.array([tables[q // page] * page + q % page for q in pre], np.int64)
    pre_act = rng.integers(0, 1 << 62, 40 * 8, dtype=np.int64)
    cpu_k.toy_layer(1, 64, pre, pre_slots, np.array([0, 40], np.int64), tables, kv, mix, table, pre_act, words * 8, page, width)
    kv[pre_slots[13] * words + 77] ^= np.uint64(1 << 9)
    act = rng.integers(0, 1 << 62, 28 * 8, dtype=np.int64)
    want_kv, want_act = kv.copy(), act.copy()
    cpu_k.toy_layer(3, 128, pos, slots, cu, tables, want_kv, mix, table, want_act, words * 8, page, width)
    d = [cp.asarray(x) for x in (pos, slots, cu, tables, kv, mix, table, act)]
    gpu_k.toy_layer(3, block, *d, words * 8, page, width)
    assert np.array_equal(d[4].get(), want_kv) and np.array_equal(d[7].get(), want_act)


def test_a_cut_chain_on_the_gpu_equals_the_whole_on_the_cpu():
    m, w = target(NAME)
    stages = [s.manifest for s in cut(m, [2, 4])]
    for ids in PROMPTS:
        rc, cc = single(m, w, len(ids), 16, 1, "cpu")
        gc = generate(rc, cc, ids, 16, 1, 7)
        rg, cg = single(None, w, len(ids), 16, 1, "gpu", stages=stages)
        gg = generate(rg, cg, ids, 16, 1, 7)
        assert gg.ids == gc.ids
        assert rg.read_state(cg.pages, None, gg.length) == rc.read_state(cc.pages, None, gc.length)
