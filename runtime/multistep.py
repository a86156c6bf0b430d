"""Several decode steps a launch (`kern serve --decode-steps K`): the step on the device (issue 43).

A host-driven decode step costs the host a fixed 0.3 ms or so (schedule, stage, upload, launch,
readback, commit) beside 0.08 ms of kernels at 64 sequences on an H100. Here one launch runs K steps
of a batch: the host stages every step's positions, lengths and slots at once (they are known ahead:
a sequence's positions are pos, pos+1, ...; its slots come from the pages its lease already holds,
sized for its whole answer at admission), and between two steps the device itself feeds each
sequence the token it just emitted and moves its fills to the next step's, with device-to-device
copies. On a GPU the K steps (copies and kernels) are one CUDA graph, captured per (program, batch
size, K) on the second use, so a steady batch costs one graph launch and one readback of K x b tokens
per K steps. The CPU backend runs the same copies and calls in order: it is the reference every
device path is held to (tests/test_multistep.py: K steps equal K single steps, token for token and
byte for byte of the state).

A sequence may stop before K (its `limits`: the tokens it may still emit): from its limit on its
steps write to the pad slot and read only its own real positions, so nothing of its state past
what it really fed is written; what they emit is not returned. A stop inside the K steps (EOS, a stop
string) is the core's to see: it keeps the tokens up to the stop and drops the rest, whose state
writes lie past everything the sequence's answer fed (never read: a hit covers only matched tokens).

`launch` issues the steps and returns; `collect` waits for their tokens (copied, on the same stream,
into one of two pinned landings), so a caller may send the next launch first (`kern serve --overlap`,
serve/core/overlap.py). Such a launch names, for each cell, the row of the previous launch whose last
emitted token it is fed (`follow`), copied on the device from that launch's tokens before its steps.

Eligible programs (`eligible`): batched, one row a sequence, one emitted token a sequence and no
count (not a speculative round), no line tables (a lined state folds every token in place: a step
past a stop would spoil it), and fills only of the kinds token, position, seq_len, slot and cu_seqlens
(one row a sequence: the same at every step), the token fill of the emitted buffer's dtype.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.backend import graphed
from runtime.step import _paged

__all__ = ["Launched", "Multistep", "eligible"]


_MOVING = ("position", "seq_len", "slot")  # the fills a later step takes from the staged rows


@dataclass(eq=False, slots=True)
class Launched:
    """Steps issued and not yet collected: what `Multistep.collect` needs to read their tokens."""

    program: str
    n: int  # cells
    k: int
    b: int  # the padded batch
    limits: list[int]  # each cell's tokens, at most k
    landing: Any  # the pinned memory the tokens land in
    done: Any  # what the backend waits on before reading it
    m0: Any  # the device marks around the kernels
    m1: Any


def eligible(rt, program: str) -> str | None:
    """None when `program` can run several steps a launch on `rt`, else why not."""
    fwd = next((f for f in rt.protocol.forwards if f.program == program), None)
    if fwd is None or fwd.rows != 1:
        return f"program {program} is not a one-row batched program"
    if not fwd.emits or fwd.count or fwd.width != 1:
        return f"program {program} does not emit exactly one token a sequence"
    fills, _, lines = rt._staging(program)
    if lines:
        return f"program {program} reads a line table (a lined state folds every step in place)"
    extra = set(fills) - {"token", "cu_seqlens", *_MOVING}  # cu_seqlens: 0, 1, .., b at every step
    if extra:
        return f"program {program} reads fills of kind {', '.join(sorted(extra))}"
    if len(fills.get("token", [])) != 1:
        return f"program {program} reads no single token fill"
    if rt.buffers[fills["token"][0]].dtype != rt.buffers[fwd.emits].dtype:
        return f"program {program}'s token fill and its emitted tokens differ in dtype"
    return None


class Multistep:
    """K decode steps a launch over one runtime: staged rows on the device (at their largest, so a
    captured graph's addresses never move), and the graphs per (program, batch size, K)."""

    def __init__(self, rt, kmax: int) -> None:
        self.rt = rt
        self.kmax = kmax
        be = rt.backend
        n = kmax * rt.groups_max
        m = rt.manifest
        self.rows: dict[str, Any] = {}  # fill name -> the values of steps 1..K-1, (K-1) x b, in the buffer's dtype
        for kind in _MOVING:
            for name in rt.fills.get(kind, []):
                self.rows[name] = be.view(be.zeros(n * rt.buffers[name].itemsize), m.buffers[name].dtype)
        self._out = be.zeros(n * 8)  # every step's emitted tokens, K x b (viewed in the emitted dtype)
        # pinned memory the emitted tokens land in: two, so a launch may go out before the last is collected
        self._landing = [be.pinned(n * 8), be.pinned(n * 8)]
        self._open: list[Launched] = []  # launches not collected yet, oldest first
        self._last: tuple[int, int, int] | None = None  # the last launch's (k, b, token width): `follow` reads its tokens
        self._graphs: dict[tuple[str, int, int], Any] = {}
        self._warm: set[tuple[str, int, int]] = set()
        self._why: dict[str, str | None] = {}

    def why_not(self, program: str) -> str | None:
        if program not in self._why:
            self._why[program] = eligible(self.rt, program)
        return self._why[program]

    def steps(self, program: str, cells: list, k: int, limits: list[int]) -> list[list[int]]:
        """Run `k` steps of `program` over `cells` (one row each: its anchor at its pos); cell g
        emits at most `limits[g]` (>= 1) tokens. Each cell's emitted tokens, in order."""
        return self.collect(self.launch(program, cells, k, limits))

    def launch(self, program: str, cells: list, k: int, limits: list[int], follow: list[int] | None = None) -> Launched:
        """Issue `k` steps of `program` over `cells` and return at once: the device runs them while the
        caller goes on (`collect` waits and gives the tokens). With `follow`, cell g's first token is
        not its anchor but the last token the previous launch emitted in row `follow[g]` (a row that
        ran all its k steps; -1: its anchor), read on the device: the caller may launch the next steps before it has collected
        the previous ones (steps of other programs may run between: they leave those tokens alone)."""
        rt = self.rt
        why = self.why_not(program)
        if why is not None:
            raise ValueError(why)
        if not 1 <= k <= self.kmax:
            raise ValueError(f"{k} steps a launch: this runtime takes 1 to {self.kmax}")
        if len(limits) != len(cells) or min(limits, default=1) < 1:
            raise ValueError("one limit of at least 1 a cell")
        if len(self._open) >= len(self._landing):
            raise ValueError(f"{len(self._open)} launches not collected: collect one before the next")
        fwd = rt._forward(program)
        padded, b, env = rt._padded(program, fwd, cells, 1)
        line_pad = rt.pad.slot if rt.pad is not None and rt.pad.slot is not None else 0
        t0 = time.perf_counter()
        host, res, tables = rt._stage(program, padded, 1, line_pad, True)
        lim = np.ones(b, np.int64)
        lim[: len(cells)] = np.minimum(np.asarray(limits, np.int64), k)
        rows = self._rows(program, padded, res, lim, k, b)
        t1 = time.perf_counter()
        be = rt.backend
        rt._upload(host, res, tables, None)
        for name, arr in rows.items():
            be.upload(self.rows[name], arr)
        if follow is not None:
            self._follow(program, follow, len(cells))
        t2 = time.perf_counter()
        m0 = be.mark()
        self._run(program, b, k, env)
        m1 = be.mark()
        landing = next(x for x in self._landing if not any(x is o.landing for o in self._open))
        width = rt.buffers[fwd.emits].itemsize
        done = be.download_start(self._out, k * b * width, landing)
        t3 = time.perf_counter()
        self._last = (k, b, width)
        rt.timing.add(True, t1 - t0, t2 - t1, t3 - t2, 0.0, 0.0, k)
        got = Launched(program, len(cells), k, b, lim[: len(cells)].tolist(), landing, done, m0, m1)
        self._open.append(got)
        return got

    def collect(self, got: Launched) -> list[list[int]]:
        """Wait for a launch's steps; each cell's emitted tokens (at most its limit), in order."""
        rt = self.rt
        be = rt.backend
        t0 = time.perf_counter()
        be.download_wait(got.done)
        dtype = rt.manifest.buffers[rt._forward(got.program).emits].dtype
        toks = be.view(got.landing, dtype)[: got.k * got.b].reshape(got.k, got.b)
        cols = toks[:, : got.n].T.tolist()
        self._open.remove(got)
        t1 = time.perf_counter()
        rt.timing.settle(be)
        rt.timing.add(True, 0.0, 0.0, 0.0, t1 - t0, be.elapsed_ms(got.m0, got.m1) / 1000.0, 0)
        return [col[:m] for col, m in zip(cols, got.limits)]

    def _follow(self, program: str, follow: list[int], n: int) -> None:
        """Cell g's token fill from the previous launch's last emitted token of row `follow[g]`
        (a device copy per run of consecutive rows; -1 keeps the anchor just uploaded)."""
        rt = self.rt
        if len(follow) != n:
            raise ValueError(f"{len(follow)} follow rows for {n} cells")
        if self._last is None:
            raise ValueError("follow: no launch before this one to follow")
        k, b, width = self._last
        if max(follow, default=-1) >= b:
            raise ValueError(f"follow: row {max(follow)} is past the previous launch's {b} rows")
        be = rt.backend
        token = _u8(be, rt.buffers[rt._staging(program)[0]["token"][0]])
        out = _u8(be, self._out)
        base = (k - 1) * b * width
        g = 0
        while g < n:
            src = follow[g]
            if src < 0:
                g += 1
                continue
            end = g + 1
            while end < n and follow[end] == src + (end - g):
                end += 1
            be.copy(token, g * width, out, base + src * width, (end - g) * width)
            g = end

    def _rows(self, program: str, padded: list, res, lim: np.ndarray, k: int, b: int) -> dict[str, np.ndarray]:
        """The moving fills of steps 1..K-1 ((K-1) x b; step 0's are the single step's staging): a
        cell's positions pos+1..pos+limit-1 and then its last real one held (its steps past the limit
        write to the pad page's first slot, as a padding cell's step does, and read only real rows)."""
        rt = self.rt
        if rt.pad is None and not lim.all():
            raise ValueError("a limit under K needs a pad page (set_pad)")
        pad_slot = rt.pad.pages[0] * rt.unit if rt.pad is not None else 0
        fills = rt._staging(program)[0]
        pos = np.fromiter((c.pos for c in padded), np.int64, b)
        j = np.arange(1, k, dtype=np.int64)[:, None]
        live = j < lim[None, :]
        at = pos[None, :] + np.minimum(j, (lim - 1)[None, :])  # (K-1) x b positions
        out: dict[str, np.ndarray] = {}
        for name in fills.get("position", []):
            out[name] = at.reshape(-1)
        for name in fills.get("seq_len", []):
            out[name] = (at + 1).reshape(-1)
        if fills.get("slot"):
            cell = np.broadcast_to(np.arange(b, dtype=np.int64)[None, :], (k - 1, b)).reshape(-1)
            if res is not None:
                slots = res.slots(cell, at.reshape(-1))
            else:  # no resident tables: the slot map as a single step builds it whole
                built: dict[str, np.ndarray] = {}
                _paged(padded, rt.unit, {"slot": ["slots"]}, [], cell, at.reshape(-1), built)
                slots = built["slots"]
            slots = np.where(live.reshape(-1), slots, pad_slot)
            for name in fills["slot"]:
                out[name] = slots
        return out

    def _run(self, program: str, b: int, k: int, env: dict) -> None:
        """The k steps: step 0's fills are uploaded; each later step's token fill is the emitted
        buffer and its moving fills its staged rows, copied on the device; every step's emitted
        tokens copied out. A graph per (program, b, k) from its second use where the backend has them."""
        rt = self.rt
        enabled = rt.graphs and rt.manifest.programs[program].graph
        graphed(rt.backend, self._graphs, self._warm, (program, b, k), lambda: self._body(program, b, k, env), enabled)

    def _body(self, program: str, b: int, k: int, env: dict) -> None:
        rt = self.rt
        be = rt.backend
        fwd = rt._forward(program)
        fills = rt._staging(program)[0]
        calls = rt.manifest.programs[program].calls
        emits = _u8(be, rt.buffers[fwd.emits])
        token = _u8(be, rt.buffers[fills["token"][0]])
        out = _u8(be, self._out)
        width = rt.buffers[fwd.emits].itemsize
        moving = [(_u8(be, rt.buffers[n]), _u8(be, self.rows[n]), self.rows[n].itemsize)
                  for kind in _MOVING for n in fills.get(kind, [])]
        for j in range(k):
            if j:
                be.copy(token, 0, emits, 0, b * width)
                for buf, staged, n in moving:
                    be.copy(buf, 0, staged, (j - 1) * b * n, b * n)
            for call in calls:
                rt.run_call(call, env)
            be.copy(out, j * b * width, emits, 0, b * width)


def _u8(be, arr):
    return be.view(arr, "u8")
