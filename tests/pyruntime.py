"""A pure-Python runtime for the serving core: states as plain objects, tokens by `toy/model.py`'s arithmetic.

A page is a list of `unit` token slots, each `(token, position)` or None; a line is `[carry, next
position]`. Every plan the pool hands out is carried out on these objects (device copies, park to
host, wake from host, remaps that make and unmake pages and slots), and every token is computed from
the states the cell names, so a wrong plan (a page not copied, a stale host copy, a wrong page
table) changes an answer instead of passing unseen:

- a slot read at position q must hold position q, else the sum is poisoned (as a tail that
  disagrees with its head is in the real kernels);
- a line continued at p0 must say p0 (else its carry is poisoned); p0 == 0 starts from carry 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from toy import model as tm

POISON = tm.POISON
MASK = tm.MASK


@dataclass
class _Forward:
    program: str
    groups: int


class PyProtocol:
    def __init__(self, emits: bool, rows: int, groups: int = 256, chunk_groups: int = 1) -> None:
        self.prefill_emits = emits
        self.widest = rows
        self._groups = groups
        self._chunk_groups = chunk_groups  # sequences one prefill call may pack

    def chunk(self) -> _Forward:
        return _Forward("prefill", self._chunk_groups)

    def forward(self, b: int, rows: int) -> _Forward:
        return _Forward("decode" if rows == 1 else "round", self._groups)


class PyRuntime:
    """Device pages and lines, host pages and lines, all plain Python objects."""

    def __init__(self, unit: int, lined: bool, rows: int, host_page_bytes: int = 1, chunk_groups: int = 1) -> None:
        self.unit = unit
        self.lined = lined
        self.protocol = PyProtocol(lined, rows, chunk_groups=chunk_groups)
        self.pages: dict[int, list] = {}
        self.lines: dict[int, list[int]] = {}
        self.host_pages: dict[int, list] = {}
        self.host_lines: dict[int, list[int]] = {}
        self.steps = 0
        # the rest of serve.core.device.Device: one process keeps no step timing and loses no stage
        self.timing = None
        self.epoch = 0
        self.broken = None
        self.while_waiting = None
        self._sums: dict[tuple[int, int], int] = {}

    # plans

    def _page(self, i: int) -> list:
        return self.pages.setdefault(i, [None] * self.unit)

    def copy(self, copies) -> None:
        for src, dst in copies.pages:
            self.pages[dst] = list(self._page(src))
        if copies.slot is not None:
            src, dst = copies.slot
            self.lines[dst] = list(self.lines.get(src, [0, 0]))

    def park(self, copies) -> None:
        for dev, off in copies.pages:
            self.host_pages[off] = list(self._page(dev))
        if copies.slot is not None:
            dev, off = copies.slot
            self.host_lines[off] = list(self.lines.get(dev, [0, 0]))

    def wake(self, copies) -> None:
        for off, dev in copies.pages:
            self.pages[dev] = list(self.host_pages[off])
        if copies.slot is not None:
            off, dev = copies.slot
            self.lines[dev] = list(self.host_lines[off])

    def land(self, plan) -> None:
        for kind, i in plan.unmade:
            (self.pages if kind == "page" else self.lines).pop(i, None)
        for kind, i in plan.made:
            if kind == "page":
                self.pages[i] = [None] * self.unit
            else:
                self.lines[i] = [0, 0]

    def zero_slot(self, slot: int) -> None:
        self.lines[slot] = [0, 0]

    def hold_partial(self) -> bool:
        return False

    def trouble(self) -> None:
        return None

    def logits(self, groups: int) -> None:
        return None  # integer tokens: no logits to read

    # steps

    def _slot_sum(self, t: int, p: int) -> int:
        key = (t, p)
        v = self._sums.get(key)
        if v is None:
            v = self._sums[key] = tm.slot_sum(t, p)
        return v

    def _write(self, cell, t: int, p: int) -> None:
        self._page(cell.pages[p // self.unit])[p % self.unit] = (t, p)

    def _sum(self, cell, n: int) -> int:
        s, bad = 0, False
        for q in range(n):
            got = self._page(cell.pages[q // self.unit])[q % self.unit]
            if got is None or got[1] != q:
                bad = True
                continue
            s = (s + self._slot_sum(got[0], q)) & MASK
        return s ^ POISON if bad else s

    def _carry(self, cell, p0: int) -> int:
        line = self.lines.setdefault(cell.slot, [0, 0])
        if p0 == 0:
            return 0
        return line[0] ^ POISON if line[1] != p0 else line[0]

    def _fold(self, cell, c: int, ts: list[int], p0: int) -> int:
        for i, t in enumerate(ts):
            c = tm.fold(c, t, p0 + i)
        self.lines[cell.slot] = [c, p0 + len(ts)]
        return c

    def _next(self, s: int, c: int) -> int:
        return tm.next_of((s + c) & MASK if self.lined else s)

    def step(self, program: str, cells) -> list:
        self.steps += 1
        for cell in cells:
            if program == "prefill":
                for j, t in enumerate(cell.ids):
                    self._write(cell, t, cell.pos + j)
                end = cell.pos + len(cell.ids)
                c = self._fold(cell, self._carry(cell, cell.pos), cell.ids, cell.pos) if self.lined else 0
                cell.tokens = [self._next(self._sum(cell, end), c)] if self.protocol.prefill_emits else []
                continue
            rows, p0, t = len(cell.ids), cell.pos, cell.ids[0]
            c0 = self._carry(cell, p0) if self.lined else 0
            c = c0
            out, fed, count = [], [], rows
            for i in range(rows):
                self._write(cell, t, p0 + i)
                s = self._sum(cell, p0 + i + 1)
                if i == 0 and rows > 1:
                    count = 1 + s % rows
                if self.lined:
                    c = tm.fold(c, t, p0 + i)
                nt = self._next(s, c)
                fed.append(t)
                out.append(nt)
                t = nt
            if self.lined:
                self._fold(cell, c0, fed[:count], p0)
            cell.tokens = out[:count]
        return [c.tokens for c in cells]


def engine(manifest_name: str, capacity: int, host_bytes: int, max_seqs: int, rows: int | None = None,
           chunk: int | None = None, first_slots: int | None = None, pack: int = 0):
    """A serve.core.engine.Engine over the real pool, index and host tier, with a `PyRuntime`; `pack` > 0
    packs up to that many sequences into one prefill call (as a manifest declaring cu_seqlens does)."""
    from manifests import derive, load
    from manifests.config import resolve
    from pool import Geometry, Host, Lease, Pool, Prefix, chunk_size, chunks_for
    from serve.core.engine import Engine
    from serve.core.faults import Faults

    m = load(resolve(manifest_name, None, None).manifest)
    unit, lined = derive.page_unit(m), derive.is_lined(m)
    geometry = Geometry(**derive.geometry(m))
    if rows is None:
        from runtime.protocol import Protocol

        rows = Protocol(m).widest
    if not geometry.has_slots:
        first_slots = 0
    elif first_slots is None:
        first_slots = max_seqs + 2
    cb = chunk_size(geometry)
    pool = Pool(geometry, cb, chunks_for(geometry, capacity, first_slots, cb), first_slots, tokens=capacity)
    host = None
    if host_bytes:
        grain = geometry.page_size or geometry.slot_size
        host_bytes = host_bytes // grain * grain
        host = Host(host_bytes, grain, geometry.page_size, geometry.slot_size)
    rt = PyRuntime(unit, lined, rows, chunk_groups=max(pack, 1))
    pad = pool.lease_pad()
    assert isinstance(pad, Lease), pad
    return Engine(model=m.model, manifest_path=manifest_name, runtime=rt, pool=pool, pad=pad, host=host,
                  prefix=Prefix(unit), rows=rows, chunk=chunk or 2048, max_seqs=max_seqs, lined=lined, unit=unit,
                  reach=derive.reach(m), backend="python", host_bytes=host_bytes, seq_slots=pool.slots,
                  faults=Faults(), pack=pack > 0), SimpleNamespace(page_bytes=geometry.page_size, slot_bytes=geometry.slot_size)
