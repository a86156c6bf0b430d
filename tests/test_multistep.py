"""Several decode steps a launch (runtime/multistep.py) against one step at a time, on the CPU backend
(the reference every device path is held to).

The property: for any batch of sequences (each prefilled from its own prompt into its own pages),
any K and any per-sequence limit, `Runtime.steps(decode, cells, K, limits)` returns for each sequence
exactly the tokens `limit` single decode steps emit (each step feeding the token the last emitted), and
leaves every page but the pad's byte for byte as those single steps leave it (a sequence's steps past
its limit write only to the pad page)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.backend import CpuBackend
from runtime.runtime import Runtime
from runtime.step import Cell
from tests import test_runtime_graphs as graphs
from tests.toyrun import target

PAGES = 64
PAD = PAGES - 1


def _prefilled(prompts: list[bytes], target_name: str = "toy-paged", backend=None, graphs: bool = True):
    """A runtime with each prompt but its last byte prefilled into the pages `_seqs` gives it (the last
    byte is the first decode step's anchor)."""
    m, w = target(target_name)
    rt = Runtime(m, w, pages=PAGES, backend=backend or CpuBackend(), max_seqs=16, graphs=graphs)
    rt.set_pad(PAD, None)
    for p, (pages, _, pos) in zip(prompts, _seqs(prompts, rt.unit)):
        if pos:
            rt.step("prefill", [Cell(pages, None, list(p[:-1]), 0)])
    return rt


def _single(rt, seqs, limits):
    """The reference: one decode step at a time over the sequences still under their limit."""
    out = [[] for _ in seqs]
    state = [(pages, anchor, pos) for pages, anchor, pos in seqs]
    for j in range(max(limits)):
        live = [g for g in range(len(seqs)) if j < limits[g]]
        cells = [Cell(state[g][0], None, [state[g][1]], state[g][2]) for g in live]
        toks = rt.step("decode", cells)
        for g, t in zip(live, toks):
            out[g].append(t[0])
            state[g] = (state[g][0], t[0], state[g][2] + 1)
    return out


def _seqs(prompts, unit=16):
    """Each prompt's (pages of its own with room for every step a test runs, anchor, pos)."""
    seqs, nxt = [], 0
    for p in prompts:
        need = (len(p) + 40) // unit + 1
        seqs.append((list(range(nxt, nxt + need)), p[-1], len(p) - 1))
        nxt += need
    return seqs


def _pages_but_pad(rt) -> list[np.ndarray]:
    return [np.asarray(rt.arenas[s.name][: PAD * rt.page_bytes[s.name]]) for s in rt.paged]


prompt = st.binary(min_size=1, max_size=40)


@settings(max_examples=40, deadline=None)
@given(prompts=st.lists(prompt, min_size=1, max_size=5), k=st.integers(1, 6), data=st.data(),
       name=st.sampled_from(["toy-paged", "toy-attn", "toy-layers"]))
def test_k_steps_a_launch_equal_k_single_steps(prompts, k, data, name):
    limits = data.draw(st.lists(st.integers(1, k), min_size=len(prompts), max_size=len(prompts)))
    seqs = _seqs(prompts)
    one = _prefilled(prompts, name)
    many = _prefilled(prompts, name)
    want = _single(one, seqs, limits)
    cells = [Cell(pages, None, [anchor], pos) for pages, anchor, pos in seqs]
    got = many.steps("decode", cells, k, limits)
    assert got == want
    assert all(np.array_equal(a, b) for a, b in zip(_pages_but_pad(many), _pages_but_pad(one)))


def test_launches_chain_as_steps_do():
    """Two launches of 3 then 4 steps, each starting where the last left off (the core's next launch
    feeds the last token at the next position), equal 7 single steps."""
    prompts = [b"hello world", b"kern", b"a much longer prompt than the others are"]
    seqs = _seqs(prompts)
    one, many = _prefilled(prompts), _prefilled(prompts)
    want = _single(one, seqs, [7, 7, 7])
    cells = [Cell(pages, None, [anchor], pos) for pages, anchor, pos in seqs]
    first = many.steps("decode", cells, 3, [3, 3, 3])
    cells = [Cell(pages, None, [toks[-1]], pos + 3) for (pages, _, pos), toks in zip(seqs, first)]
    second = many.steps("decode", cells, 4, [4, 4, 4])
    assert [a + b for a, b in zip(first, second)] == want
    assert all(np.array_equal(a, b) for a, b in zip(_pages_but_pad(many), _pages_but_pad(one)))


class Recording(graphs.Recording):
    """The graph test's recording backend, recording device copies made while capturing too."""

    def copy(self, dst, dst_off, src, src_off, nbytes):
        if self._capturing is not None:
            self._capturing.append(("copy", (dst, dst_off, src, src_off, nbytes)))
            return
        super().copy(dst, dst_off, src, src_off, nbytes)

    def replay(self, graph):
        self.events.append("replay")
        for item in graph:
            if item[0] == "copy":
                CpuBackend.copy(self, *item[1])
            else:
                CpuBackend.launch(self, *item)


def test_a_steady_batch_is_one_graph_from_its_second_launch():
    """The first launch of a (program, batch, K) runs plainly, the second is captured and replayed, the
    third replayed; every launch's tokens equal single steps' (a replay reads the fills just uploaded)."""
    prompts = [b"graph me", b"and me too"]
    seqs = _seqs(prompts)
    rec = Recording()
    many, one = _prefilled(prompts, backend=rec), _prefilled(prompts)
    want = _single(one, seqs, [12, 12])
    got = [[], []]
    events = []
    pos = [p for _, _, p in seqs]
    anchors = [a for _, a, _ in seqs]
    for _ in range(3):
        before = len(rec.events)
        cells = [Cell(seqs[g][0], None, [anchors[g]], pos[g]) for g in range(2)]
        toks = many.steps("decode", cells, 4, [4, 4])
        events.append([e for e in rec.events[before:] if e != "launch"] or ["plain"])
        for g in range(2):
            got[g] += toks[g]
            anchors[g], pos[g] = toks[g][-1], pos[g] + 4
    assert events == [["plain"], ["capture", "replay"], ["replay"]]
    assert got == want


@pytest.mark.parametrize("name, why", [("toy-spec", "one-row"), ("toy-stateful", "line table")])
def test_a_program_that_cannot_run_several_steps_is_refused_by_name(name, why):
    m, w = target(name)
    rt = Runtime(m, w, pages=PAGES, slots=4, backend="cpu", max_seqs=4)
    program = max((f for f in rt.protocol.forwards if f.rows is not None), key=lambda f: f.rows).program
    with pytest.raises(ValueError, match=why):
        rt.steps(program, [Cell([0], 0, [1] * (rt._forward(program).rows or 1), 0)], 2, [2])


def test_the_gate_passes_a_server_taking_five_steps_a_launch(tmp_path):
    """End to end on the CPU: every check of toy-attn's gate (answers, hits, the policy oracle, metrics)
    against servers at --decode-steps 5 with --overlap, as a GPU serves by default (the launches cross
    page boundaries unevenly, stops land inside them, each launch goes out before the last one's
    commit), and each server said it ran so."""
    from tests.test_e2e_driver import EXIT_PASS, gate

    code, reports = gate(tmp_path, "--targets", "toy-attn", "--server-flags", "--decode-steps 5 --overlap",
                         max_tokens=24)
    failed = [c["name"] for c in reports["toy-attn"]["checks"] if c["ok"] is False]
    assert code == EXIT_PASS and not failed, failed
    logs = list((tmp_path / "results" / "toy-attn").glob("server-*.log"))
    assert logs and all("decode_steps=5 overlap=true" in p.read_text() for p in logs), [p.name for p in logs]


def test_a_faulty_device_takes_several_steps_one_at_a_time_with_the_same_answers():
    """`FaultyDevice.steps` (a server with a step fault and --decode-steps K) runs the K steps through its
    own `step`, so each step's fault applies: slow-steps' sleep K times, and the tokens those single steps
    give, limits and all, equal the runtime's K steps a launch. (Its step counter was once named `steps`
    too, which hid the method: such a server would have failed its first launch.)"""
    from serve.core.faults import SLOW_STEP_S, FaultyDevice

    prompts = [b"slow and steady", b"x", b"a third sequence, longer than the rest"]
    seqs = _seqs(prompts)
    limits = [4, 1, 3]
    plain, inner = _prefilled(prompts), _prefilled(prompts)
    faulty = FaultyDevice(inner, ["slow-steps"], {"requests": 1}, "prefill", 1)
    cells = lambda: [Cell(pages, None, [anchor], pos) for pages, anchor, pos in seqs]  # noqa: E731
    want = plain.steps("decode", cells(), 4, limits)
    t0 = time.monotonic()
    got = faulty.steps("decode", cells(), 4, limits)
    assert got == want == _single(_prefilled(prompts), seqs, limits)
    assert faulty.stepped == 4 and time.monotonic() - t0 >= 4 * SLOW_STEP_S


def test_without_resident_tables_the_slots_come_from_the_pages_as_a_single_step_builds_them():
    """A runtime that keeps no page-table rows between steps (a manifest whose kernel writes a table)
    stages each step's slot map whole: K steps a launch, with a sequence stopping early, still equal
    single steps, pages and all."""
    prompts = [b"no resident rows", b"yz"]
    seqs = _seqs(prompts)
    one, many = _prefilled(prompts), _prefilled(prompts)
    one.resident = many.resident = None
    want = _single(one, seqs, [5, 2])
    got = many.steps("decode", [Cell(p, None, [a], pos) for p, a, pos in seqs], 5, [5, 2])
    assert got == want
    assert all(np.array_equal(a, b) for a, b in zip(_pages_but_pad(many), _pages_but_pad(one)))


@pytest.mark.parametrize("backend, asked, want", [("cpu", None, 1), ("gpu", None, 8), ("gpu", 3, 3), ("cpu", 4, 4)])
def test_decode_steps_default_eight_on_a_gpu_one_on_the_cpu_and_as_asked_otherwise(backend, asked, want):
    """`--decode-steps`' default follows the backend (serve/core/engine.py `decode_steps`): 8 on a GPU,
    1 on the CPU; a value asked for is taken on either; a program that cannot run several gets 1."""
    from serve.core.engine import decode_steps

    m, w = target("toy-paged")
    rt = Runtime(m, w, pages=PAGES, backend=CpuBackend(), max_seqs=4)
    rt.backend.name = backend  # the default reads the backend's name alone (an instance attribute here)
    assert decode_steps(rt, 1, asked) == want
    m, w = target("toy-stateful")
    lined = Runtime(m, w, pages=PAGES, slots=4, backend=CpuBackend(), max_seqs=4)
    lined.backend.name = backend
    assert decode_steps(lined, 1, asked) == 1
