"""The runtime's graph policy for `graph: true` programs, on a recording backend (no GPU needed):
a bucket's first step runs plainly, its second is captured and replayed, every later one replays;
a capture that fails leaves that bucket plain for good; programs without `graph` never capture."""

from __future__ import annotations

from runtime.backend import CpuBackend
from runtime.runtime import Runtime
from runtime.step import Cell
from tests.toyrun import target


class Recording(CpuBackend):
    """The CPU backend, with graphs that record the launches made while capturing and replay them."""

    def __init__(self, fail: bool = False):
        self.events: list[str] = []
        self.fail = fail
        self._capturing: list | None = None

    def launch(self, fn, grid, block, args):
        if self._capturing is not None:
            self._capturing.append((fn, grid, block, args))
            return
        self.events.append("launch")
        super().launch(fn, grid, block, args)

    def capture(self, fn):
        self.events.append("capture")
        if self.fail:
            raise RuntimeError("this launch cannot be captured")
        self._capturing = []
        try:
            fn()
            return list(self._capturing)
        finally:
            self._capturing = None

    def replay(self, graph):
        self.events.append("replay")
        for fn, grid, block, args in graph:
            super().launch(fn, grid, block, args)


def _decode_steps(backend, n_steps: int, graphs: bool = True):
    m, w = target("toy-paged")
    rt = Runtime(m, w, pages=16, backend=backend, max_seqs=2, graphs=graphs)
    rt.set_pad(0, None)
    cell = Cell([1, 2, 3], None, list(b"hello"), 0)
    rt.step("prefill", [cell])
    toks = []
    pos = 5
    tok = 104
    per_step = []
    events = getattr(backend, "events", [])
    for _ in range(n_steps):
        before = len(events)
        c = Cell(cell.pages, None, [tok], pos)
        rt.step("decode", [c])
        tok, pos = c.tokens[0] % 256, pos + 1
        toks.append(c.tokens[0])
        per_step.append([e for e in events[before:] if e != "launch"] or ["plain"])
    return toks, per_step, rt


def test_first_step_plain_second_captured_then_replayed():
    toks, per_step, _ = _decode_steps(Recording(), 4)
    assert per_step == [["plain"], ["capture", "replay"], ["replay"], ["replay"]]
    plain, _, _ = _decode_steps(CpuBackend(), 4)
    assert toks == plain  # a replayed step computes what a plain one does


def test_a_failed_capture_leaves_the_bucket_plain():
    rec = Recording(fail=True)
    toks, per_step, rt = _decode_steps(rec, 4)
    assert per_step == [["plain"], ["capture"], ["plain"], ["plain"]]
    assert rt._graphs == {("decode", 1): None}
    plain, _, _ = _decode_steps(CpuBackend(), 4)
    assert toks == plain


def test_graphs_off_never_capture():
    rec = Recording()
    _, per_step, _ = _decode_steps(rec, 3, graphs=False)
    assert per_step == [["plain"]] * 3


def test_step_timing_is_summed():
    _, _, rt = _decode_steps(CpuBackend(), 3)
    t = rt.timing
    assert t.steps == 4 and t.decode_steps == 3  # one prefill chunk, three decode steps
    assert t.kernel > 0 and t.decode_kernel <= t.kernel
    assert set(t.as_dict()) >= {"rt_stage", "rt_upload", "rt_launch", "rt_kernel", "rt_readback"}
