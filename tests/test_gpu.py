"""The GPU backend gives the CPU backend's answers, bit for bit (ids and state bytes).

Marked `gpu`; the whole module skips cleanly where cupy is missing or sees no CUDA device.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from tests.gpu_required import skip_without_gpu

cp = skip_without_gpu()  # runtime.gpu imported too, before numba.cuda

from click.testing import CliRunner  # noqa: E402

from oracle.abtest import PASS, ab_test  # noqa: E402
from kern.cli import main as kern  # noqa: E402
from runtime.backends import make_backend  # noqa: E402
from runtime.runtime import Runtime  # noqa: E402
from runtime.sequence import generate, single  # noqa: E402
from runtime.step import Cell  # noqa: E402
from tests.toyrun import CONFIG, SHAPES, SPEC_SHAPES, target  # noqa: E402
from toy import model  # noqa: E402
from toy.kernels import cpu as cpu_k  # noqa: E402
from toy.kernels import cuda as gpu_k  # noqa: E402

pytestmark = pytest.mark.gpu

PROMPTS = (b"x", b"The lighthouse keeper had not seen a ship in eleven days", bytes(range(7, 250, 2)))


def _run(m, w, ids, steps, rows, chunk, backend):
    rt, cell = single(m, w, len(ids), steps, rows, backend)
    g = generate(rt, cell, ids, steps, rows, chunk)
    return g, rt.read_state(cell.pages, cell.slot, g.length)


def _manifest(name):
    import manifests

    return manifests.load(name)


@pytest.mark.parametrize("ref", [False, True], ids=["candidate", "ref"])
@pytest.mark.parametrize("shape", SHAPES)
def test_cpu_and_gpu_agree_on_every_shape(shape, ref):
    """Ids and every state byte agree between backends, for each prompt, chunk and row count;
    and the ids are the model's."""
    m, w = target(shape)
    if ref:
        m = _manifest(CONFIG.targets[shape].reference)
    rows_choices = (1, 4) if shape in SPEC_SHAPES else (1,)
    steps = 12 if shape == "toy-big" else 24
    for ids in PROMPTS:
        ids = list(ids)
        want = model.generate(ids, steps, m.raw)
        for rows in rows_choices:
            for chunk in (None, 7):
                gg, sg = _run(m, w, ids, steps, rows, chunk, "gpu")
                gc, sc = _run(m, w, ids, steps, rows, chunk, "cpu")
                label = f"{shape} prompt {len(ids)} rows {rows} chunk {chunk}"
                assert gg.ids == gc.ids == want, label
                assert (gg.rounds, gg.accepted) == (gc.rounds, gc.accepted), label
                assert sg == sc, f"{label}: state bytes differ"


@pytest.mark.parametrize("shape", SHAPES)
def test_kern_test_passes_on_the_gpu(shape):
    r = CliRunner().invoke(kern, ["test", shape, "--backend", "gpu", "--steps", "16"])
    assert r.exit_code == 0, r.output[-3000:]
    assert "PASS" in r.output


def test_auto_picks_the_gpu():
    assert make_backend("auto").name == "gpu"


def test_a_batch_with_padding_agrees_with_the_cpu():
    """Three live sequences padded to a bucket of 4 in one decode step: same tokens and state."""
    m, w = target("toy-stateful")
    out = {}
    for be in ("cpu", "gpu"):
        rt = Runtime(m, w, pages=16, slots=6, backend=be, max_seqs=8)
        rt.set_pad(0, 1)
        cells = [Cell([1 + 3 * i, 2 + 3 * i, 3 + 3 * i], 2 + i, list(b"abcdefghij"[: 5 + i]), 0) for i in range(3)]
        for c in cells:
            rt.zero_slot(c.slot)
            rt.step("prefill", [c])
        dec = [Cell(c.pages, c.slot, [c.tokens[0]], len(c.ids)) for c in cells]
        rt.step("decode", dec)
        out[be] = ([c.tokens for c in dec], [rt.read_state(c.pages, c.slot, c.pos + 1) for c in dec])
    assert out["cpu"] == out["gpu"]


@pytest.mark.parametrize("shape", ["toy-stateful", "toy-stateful-spec"])
def test_captured_graphs_give_the_answers_of_plain_launches(shape):
    """Decode (or round) steps replayed from captured CUDA graphs, over buckets of 1, 2, 4 and 8
    live cells with padding, leave the same tokens and state bytes as launch-by-launch steps; and
    the graphs really were captured and replayed (not silently skipped)."""
    m, w = target(shape)
    rows = max(p.rows for p in m.programs.values() if isinstance(p.rows, int))
    prog = "round" if rows > 1 else "decode"
    out = {}
    for graphs in (False, True):
        rt = Runtime(m, w, pages=64, slots=12, backend="gpu", max_seqs=8, graphs=graphs)
        rt.set_pad(0, 1)
        cells = [Cell([1 + 6 * i + j for j in range(6)], 2 + i, list(b"graph me, please"[: 5 + i]), 0) for i in range(8)]
        for c in cells:
            rt.zero_slot(c.slot)
            rt.step("prefill", [c])
        toks = []
        live = [Cell(c.pages, c.slot, [c.tokens[-1] % 256] * rows, len(c.ids)) for c in cells]
        for n in (1, 2, 3, 4, 8, 8, 1, 4, 8, 2):
            step = live[:n]
            rt.step(prog, step)
            toks.append([c.tokens for c in step])
            for c in step:
                c.ids = [c.tokens[-1] % 256] * rows
                c.pos += len(c.tokens)
        out[graphs] = (toks, [rt.read_state(c.pages, c.slot, c.pos) for c in live])
        if graphs:
            captured = [k for k, g in rt._graphs.items() if g is not None]
            assert {(prog, 1), (prog, 2), (prog, 4), (prog, 8)} <= set(captured)
    assert out[True] == out[False]


@pytest.mark.parametrize("chunk", [None, 1000])
def test_park_wake_and_copies_move_the_same_bytes(chunk, monkeypatch):
    """Device-to-device page copies (an overlapping run too), park to pinned host and wake back; with
    host pieces of 1000 bytes, pages and the slot straddle the pinned arena's pieces."""
    if chunk is not None:
        monkeypatch.setattr("runtime.host_arena.CHUNK", chunk)
    m, w = target("toy-stateful")
    got = {}
    for be in ("cpu", "gpu"):
        rt = Runtime(m, w, pages=8, slots=4, backend=be, host_bytes=0)
        rt.host = rt.backend.host_zeros(4 * rt.host_page_bytes + 2 * rt.host_slot_bytes)
        rng = np.random.default_rng(3)
        for name, arena in rt.arenas.items():
            n = arena.size
            rt.backend.upload(arena, rng.integers(0, 256, n, dtype=np.uint8))
        hp = rt.host_page_bytes
        rt.park(SimpleNamespace(pages=[(1, 0), (2, hp), (5, 3 * hp)], slot=(2, 4 * hp)))
        rt.wake(SimpleNamespace(pages=[(0, 3), (hp, 4), (3 * hp, 6)], slot=(4 * hp, 3)))
        rt.copy(SimpleNamespace(pages=[(0, 1), (1, 2)], slot=(1, 0)))
        rt.backend.synchronize()
        got[be] = {k: rt.backend.download(a, a.size).tobytes() for k, a in rt.arenas.items()}
        got[be]["host"] = bytes(rt.host)
    assert got["cpu"] == got["gpu"]


def _tiny_state(words=520, page=4, width=8, seqs=5, lens=(1, 9, 17, 31, 32)):
    """A hand-made paged state (one tail word poisoned) and the rows that wrote it."""
    salt = np.array([np.int64(s) for s in model.SALT], np.int64)
    rng = np.random.default_rng(11)
    table = rng.permutation(np.arange(1, seqs * width + 1)).astype(np.int32)
    tok, pos, slot = [], [], []
    for g in range(seqs):
        for q in range(lens[g]):
            tok.append(int(rng.integers(0, 257)))
            pos.append(q)
            slot.append(int(table[g * width + q // page]) * page + q % page)
    kv = np.zeros((seqs * width + 1) * page * words, np.uint64)
    args = [np.array(tok, np.int64), np.array(pos, np.int64), np.array(slot, np.int64)]
    cpu_k.toy_write(len(tok), 64, *args, kv, salt, words * 8)
    kv[slot[-40] * words + 300] ^= np.uint64(1 << 40)
    return dict(words=words, page=page, width=width, seqs=seqs, salt=salt, table=table, kv=kv,
                lens=np.array(lens, np.int32), rows=args)


@pytest.mark.parametrize("split", [1, 3, 4096])
@pytest.mark.parametrize("block", [64, 96, 128, 256, 1024])
def test_predict_is_the_same_for_any_block_and_split(block, split, monkeypatch):
    """Every block size and split count (odd blocks take the general path) gives the CPU's bits,
    poisoned sequences included; the write kernel too."""
    monkeypatch.setattr(gpu_k, "SPLIT_BLOCKS", split)
    s = _tiny_state()
    want = np.zeros(s["seqs"], np.int64)
    cpu_k.toy_predict(s["seqs"], 128, s["lens"], s["table"], s["kv"], s["salt"], want, s["words"] * 8, s["page"], s["width"])
    d = {k: cp.asarray(v) for k, v in s.items() if isinstance(v, np.ndarray) and k != "rows"}
    out = cp.zeros(s["seqs"], cp.int64)
    gpu_k.toy_predict(s["seqs"], block, d["lens"], d["table"], d["kv"], d["salt"], out, s["words"] * 8, s["page"], s["width"])
    assert out.get().tolist() == want.tolist()
    kv = cp.zeros_like(d["kv"])
    rows = [cp.asarray(r) for r in s["rows"]]
    gpu_k.toy_write(int(rows[0].size), block, *rows, kv, d["salt"], s["words"] * 8)
    clean = s["kv"].copy()
    cpu_k.toy_write(int(rows[0].size), 64, *s["rows"], clean, s["salt"], s["words"] * 8)
    assert np.array_equal(kv.get(), clean)


@pytest.mark.parametrize("name", ["toy-float", "toy-float-ref"])
def test_the_float_toy_is_the_cpus_bit_for_bit(name):
    """toy-float adds in the same order on both backends, additions only: its logits at every step,
    its ids and its state bytes on the GPU are the CPU's, bit for bit."""
    from pathlib import Path

    m = _manifest(Path(CONFIG.targets["toy-float"].manifest).parent / f"{name}.json")
    w = target("toy-float")[1]
    for ids in PROMPTS:
        ids = list(ids)
        got = {}
        for be in ("cpu", "gpu"):
            rt, cell = single(m, w, len(ids), 24, 1, be)
            rows = []
            g = generate(rt, cell, ids, 24, 1, on_step=lambda tag, toks, rt=rt: rows.append(rt.logits(1)[0].copy()))
            got[be] = (g.ids, rt.read_state(cell.pages, cell.slot, g.length), np.array(rows))
        (ic, sc, lc), (ig, sg, lg) = got["cpu"], got["gpu"]
        assert ic == ig and sc == sg and np.array_equal(lc, lg), f"{name} prompt {len(ids)}"


@pytest.mark.parametrize("mode", ["blocking", "spin"])
def test_set_wait_sets_the_primary_contexts_schedule(mode):
    """`set_wait` before the context is made: the context cupy and numba then share waits as asked
    (its CU_CTX_SCHED_* bits), and kernels still run on it."""
    import subprocess
    import sys
    from pathlib import Path

    code = (f"from runtime.gpu import set_wait, WAITS; set_wait({mode!r}); import ctypes, cupy; "
            "assert int(cupy.arange(4).sum()) == 6; cu = ctypes.CDLL('libcuda.so.1'); f = ctypes.c_uint(); "
            "assert cu.cuCtxGetFlags(ctypes.byref(f)) == 0; print('flags', f.value & 7, WAITS[" + repr(mode) + "])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-2000:]
    _, got, want = r.stdout.split()
    assert got == want, r.stdout
