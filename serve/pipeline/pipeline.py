"""`Pipeline`: what the scheduler calls instead of a runtime when it serves a cut manifest.

It runs stage 0 here (the head) and sends every step to the next stage as an item: {item number,
program, cells (ids, positions, pages, slots), the pool's plans since the last item} plus the buffers
crossing the cut. Plans (copies, remaps, park and wake, slots to zero) run at once on stage 0's
states and travel with the next item to the others, which carry them out before its calls, so every
stage sees them in item order. A step returns once stage 0 has run it and the item is sent; each
cell's `tokens` is a `Pending` list that waits for the last stage's answer only when it is read.
The scheduler reads a prefill chunk's tokens only when the chunk ends the prompt, so a long prompt's
chunks overlap across the stages (up to `stages` items in flight), while a decode step waits for
its tokens as it must. Nothing waits past `--pp-timeout`: an item unanswered by then ends the head.
"""

from __future__ import annotations

import collections
import queue
import time

from pool import Copies
from serve import logs
from serve.pipeline.liveness import HeadWatch, die
from serve.pipeline.transport import Message, Wire
from serve.pipeline.work import cells_to, encode_copies

__all__ = ["Pipeline"]


class Pipeline:
    """Runtime-like: `step`, `copy`, `park`, `wake`, `land`, `zero_slot`, `protocol`, over stages."""

    def __init__(self, work, protocol, down: Wire, watch: HeadWatch, stages: int, timeout: float,
                 host_page_bytes: int) -> None:
        self.work = work  # stage 0's StageWork
        self.local = local = work.runtime
        self.protocol = protocol  # the last stage's: it says what emits
        self.manifest = local.manifest
        self.unit = local.unit
        self.reach = local.reach
        self.lined = local.lined
        self.down = down
        self.watch = watch
        self.stages = stages
        self.timeout = timeout
        self.host_page_bytes = host_page_bytes
        self.items = 0
        self.in_flight: collections.deque[int] = collections.deque()
        self.plans: list = []
        self._emits = {f.program: bool(f.emits) for f in protocol.forwards}
        self._pending: dict[int, list] = {}

    # the pool's plans: here now, on the other stages before the next item

    def copy(self, copies) -> None:
        self.local.copy(copies)
        self.plans.append(["copy", *encode_copies(copies)])

    def park(self, copies) -> None:
        hp = self.host_page_bytes
        self.local.park(Copies([(d, h * hp) for d, h in copies.pages], None))
        self.plans.append(["park", *encode_copies(copies)])

    def wake(self, copies) -> None:
        hp = self.host_page_bytes
        self.local.wake(Copies([(h * hp, d) for h, d in copies.pages], None))
        self.plans.append(["wake", *encode_copies(copies)])

    def land(self, remap) -> None:
        self.local.land(remap)
        self.plans.append(["land", [[str(getattr(k, "value", k)), int(i)] for k, i in remap.made]])

    def zero_slot(self, slot: int) -> None:
        self.local.zero_slot(slot)
        self.plans.append(["zero", int(slot)])

    # steps

    def step(self, program: str, cells: list) -> list:
        while len(self.in_flight) >= self.stages:
            self._collect()
        n = self.items
        self.items += 1
        issued = time.time()
        leave = self.work.run(program, cells, {})
        head = {"item": n, "program": program, "cells": cells_to(cells), "plans": self.plans}
        self.plans = []
        self.down.send(Message("item", head, leave))
        logs.event("pp item", "DEBUG", stage=0, item=n, program=program, rows=sum(len(c.ids) for c in cells),
                   issued_us=int(issued * 1e6), done_us=int(time.time() * 1e6))
        self.in_flight.append(n)
        emits = self._emits.get(program)
        pending = [Pending(self, n) if emits else [] for _ in cells]
        self._pending[n] = pending if emits else []
        for c, toks in zip(cells, pending):
            c.tokens = toks
        return cells

    def hold_partial(self, wait_s: float = 0.005) -> bool:
        """Whether a partial prefill item should wait: yes while `stages` items are in flight (a
        full one goes at once). Answers already in are collected first; when it says hold, it has
        waited up to `wait_s` for the oldest answer, so a scheduler asking again does not spin."""
        while self.in_flight and not self.watch.inbox.empty():
            self._collect()
        if len(self.in_flight) < self.stages:
            return False
        try:
            msg = self.watch.inbox.get(timeout=wait_s)
        except queue.Empty:
            return True
        self._collect(msg)
        return True

    def wait(self, item: int) -> None:
        """Collect answers, in order, until `item`'s is in."""
        while self.in_flight and self.in_flight[0] <= item:
            self._collect()

    def drain(self) -> None:
        """Wait for every item in flight."""
        while self.in_flight:
            self._collect()

    def _collect(self, msg=None) -> tuple[int, list]:
        want = self.in_flight[0]
        try:
            msg = msg or self.watch.inbox.get(timeout=self.timeout)
        except queue.Empty:
            die("pp item timed out", item=want, in_flight=len(self.in_flight), pp_timeout=self.timeout)
        if msg.kind != "done":
            die("pp protocol error", reason=f"got {msg.kind!r} while waiting for item {want}")
        got = int(msg.head["item"])
        if got != want:
            die("pp protocol error", reason=f"the last stage answered item {got}, expected {want}")
        self.in_flight.popleft()
        for pending, toks in zip(self._pending.pop(got, []), msg.head["tokens"]):
            pending.fill(toks)
        return got, msg.head["tokens"]

    def synchronize(self) -> None:
        self.drain()


class Pending(list):
    """A cell's tokens from the last stage: empty until read, then whatever item `item` answered.
    Reading it (index, iterate, len, compare) waits for that answer."""

    __slots__ = ("_pipe", "_item", "_filled")

    def __init__(self, pipe: Pipeline, item: int) -> None:
        super().__init__()
        self._pipe, self._item, self._filled = pipe, item, False

    def fill(self, toks) -> None:
        list.extend(self, (int(t) for t in toks))
        self._filled = True

    def _ready(self) -> None:
        if not self._filled:
            self._pipe.wait(self._item)

    def __getitem__(self, i):
        self._ready()
        return list.__getitem__(self, i)

    def __setitem__(self, i, v):
        self._ready()
        list.__setitem__(self, i, v)

    def __iter__(self):
        self._ready()
        return list.__iter__(self)

    def __len__(self) -> int:
        self._ready()
        return list.__len__(self)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __eq__(self, other) -> bool:
        self._ready()
        return list.__eq__(self, other)

    __hash__ = None

    def __repr__(self) -> str:
        return list.__repr__(self) if self._filled else f"Pending(item={self._item})"
