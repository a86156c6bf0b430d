"""Several decode steps a launch on the GPU (runtime/multistep.py) give the CPU reference's tokens and
page bytes, plainly, captured as a CUDA graph and replayed, for every eligible toy.

Marked `gpu`; the whole module skips cleanly where cupy is missing or sees no CUDA device."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.gpu_required import skip_without_gpu

cp = skip_without_gpu()

from runtime import gpu  # noqa: E402  (before numba.cuda: see its docstring)

from runtime.step import Cell  # noqa: E402
from tests.test_multistep import PAD, _prefilled, _seqs  # noqa: E402
from tests.test_overlap import chained  # noqa: E402

pytestmark = pytest.mark.gpu


def _pages(rt) -> list[np.ndarray]:
    be = rt.backend
    return [be.download(rt.arenas[s.name], PAD * rt.page_bytes[s.name]) for s in rt.paged]


@pytest.mark.parametrize("name", ["toy-paged", "toy-attn", "toy-layers", "toy-big"])
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "plain"])
def test_gpu_launches_equal_the_cpu_reference(name, graphs):
    """Five launches of K=6 over 9 sequences with random limits (the same on both backends): tokens
    equal launch by launch, and every page but the pad's byte for byte at the end (the first two
    launches run plainly and capture, the rest replay, with graphs on)."""
    rng = random.Random(7)
    prompts = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60))) for _ in range(9)]
    seqs = _seqs(prompts)
    cpu = _prefilled(prompts, name)
    dev = _prefilled(prompts, name, backend=gpu.GpuBackend(), graphs=graphs)
    state = [(pages, anchor, pos) for pages, anchor, pos in seqs]
    for _ in range(5):
        limits = [rng.randrange(1, 7) for _ in seqs]
        cells = [Cell(p, None, [a], pos) for p, a, pos in state]
        want = cpu.steps("decode", cells, 6, limits)
        cells = [Cell(p, None, [a], pos) for p, a, pos in state]
        got = dev.steps("decode", cells, 6, limits)
        assert got == want
        # the next launch as the core's: all 6 steps' tokens where the limit let them run, else the same cell
        state = [(p, toks[-1], pos + len(toks)) for (p, _, pos), toks in zip(state, want)]
    assert all(np.array_equal(a, b) for a, b in zip(_pages(dev), _pages(cpu)))
    if graphs:
        assert any(g is not None for g in dev._multistep._graphs.values())


@pytest.mark.parametrize("name", ["toy-paged", "toy-attn"])
def test_gpu_chained_launches_equal_the_cpu_reference(name):
    """Launches each sent before the last is collected, fed on the device (`follow`: the same rows, then
    reversed, then a subset with a sequence rejoining from the host), as `kern serve --overlap` sends
    them: tokens equal the CPU's same calls, and every page but the pad's byte for byte."""
    rng = random.Random(11)
    prompts = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60))) for _ in range(6)]
    seqs = _seqs(prompts)
    orders = [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0], [5, 4, 3, 2, 1, 0], [1, 3], [2, 1, 3]]
    launches = [(order, [6] * len(order)) for order in orders]
    runs = []
    for rt in (_prefilled(prompts, name), _prefilled(prompts, name, backend=gpu.GpuBackend())):
        runs.append((chained(rt, seqs, 6, launches)[0], rt))
    (want, cpu), (have, dev) = runs
    assert have == want
    assert all(np.array_equal(a, b) for a, b in zip(_pages(dev), _pages(cpu)))
