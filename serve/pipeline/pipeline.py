"""`Pipeline`: what the scheduler calls instead of a runtime when it serves a cut manifest.

It runs stage 0 here (the head) and sends every step to the next stage as an item: {item number,
program, cells (ids, positions, pages, slots), the pool's plans since the last item} plus the buffers
crossing the cut. Plans (copies, remaps, park and wake, slots to zero) run at once on stage 0's
states and travel with the next item to the others, which carry them out before its calls, so every
stage sees them in item order. A step returns once stage 0 has run it and the item is sent; each
cell's `tokens` is a `Pending` list that waits for the last stage's answer only when it is read.
The scheduler reads a prefill chunk's tokens only when the chunk ends the prompt, so a long prompt's
chunks overlap across the stages (up to `stages` items in flight), while a decode step waits for
its tokens as it must.

A lost stage (the watcher's report, or an item unanswered past `--pp-timeout`) marks the pipeline
broken: every call from the scheduler then raises `StageLost`, and the scheduler takes the loss
(`take_loss`: a new epoch, every item in flight void) and either answers its requests with errors or
has the stages restarted (`begin_restart`, on a thread of its own) and requeues them. Items carry their
epoch and the stages' addresses (`route`), so a stage drops a stale item and a stage whose next one
was replaced connects to the new one; the head drops a stale `done`.
"""

from __future__ import annotations

import collections
import queue
import threading
import time

from serve.common import logs
from serve.core.device import StageLost  # re-exported: raised here, taken by the scheduler
from serve.pipeline.liveness import HeadWatch, die
from serve.pipeline.transport import Message, Wire
from serve.pipeline.work import apply_plans, cells_to, encode_plan

__all__ = ["Pipeline", "StageLost"]




class Pipeline:
    """The serving core's `Device` (serve/core/device.py) over stages: `step`, the pool's plans, `protocol`,
    and what a pipeline adds: `hold_partial`, `trouble`, `epoch`, `broken`, `while_waiting`."""

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
        # losing and restarting stages
        self.epoch = 0  # items of an older epoch are void
        self.losses = 0  # stages lost (each stage named in a take counts once; an unnamed loss once)
        self.route: list[str | None] = [None] * stages  # route[k]: stage k's item address (set by the head)
        self.down_at: str | None = None  # where `down` is connected
        self.reconnect = None  # address -> a new Wire to stage 1 (set by the head)
        self.restarter = None  # stages -> None, or why they could not be restarted (blocks; set by the head)
        self.failed: str | None = None  # why a restart failed: the head gives up
        self.broken = threading.Event()  # a loss the scheduler has not taken yet
        self.whole = threading.Event()  # every stage is up (cleared from a loss until its restart)
        self.whole.set()
        self._lost: dict[int | None, str] = {}
        self._taken: dict[int | None, str] = {}
        self._restart: set[int] = set()
        self._restarting: threading.Thread | None = None
        self._wanted = threading.Event()
        self._lock = threading.Lock()
        self._since: collections.deque[float] = collections.deque()  # when each item in flight was sent
        self.while_waiting = None  # called every 0.1 s while an answer is awaited (the scheduler's queries)
        self.timing = None  # the step timing is the stages' own: the head keeps none

    # losing a stage (lose: any thread; the rest: the scheduler's)

    def lose(self, stage: int | None, reason: str) -> None:
        """Stage `stage` (None: which one is unknown) is lost: mark the pipeline broken."""
        with self._lock:
            self._lost.setdefault(stage, reason)
            self.whole.clear()
            self.broken.set()

    def take_loss(self) -> dict[int | None, str]:
        """The losses since the last take, and a new epoch: every item in flight is void."""
        with self._lock:
            lost, self._lost = self._lost, {}
            if len(lost) > 1:
                lost.pop(None, None)  # a named stage explains an unanswered item
            self._taken = dict(lost)  # what /health names until the pipeline is whole
            self.broken.clear()
            self.losses += len(lost)
        self.epoch += 1
        self.in_flight.clear()
        self._since.clear()
        self._pending.clear()
        self.plans = []
        return lost

    def lost_stages(self) -> list[int]:
        """The stages lost and not restarted, in order."""
        return sorted(k for k in range(1, self.stages) if k in self.watch.lost)

    def die(self, reason: str, answered: int) -> None:
        """Give up (`Losable.die`): log and end the process with the pipeline's exit code."""
        die("pp stage lost", {"reason": reason, "answered": answered})

    def begin_restart(self, stages) -> None:
        """Restart `stages` (None in it: all of them) on the restart thread; `whole` is set when all
        are back, `failed` says why not. One thread, started once and kept: a stage process dies with
        the thread that started it (PR_SET_PDEATHSIG is per thread)."""
        with self._lock:
            self._restart.update(range(1, self.stages) if None in stages else stages)
            if self._restarting is None:
                self._restarting = threading.Thread(target=self._restarts, name="pp-restart", daemon=True)
                self._restarting.start()
            self._wanted.set()

    def _restarts(self) -> None:
        while True:
            self._wanted.wait()
            with self._lock:
                todo, self._restart = sorted(self._restart), set()
                self._wanted.clear()
                if not todo:
                    if not self._lost and not self.broken.is_set():
                        self.whole.set()
                    continue
            why = self.restarter(todo) if self.restarter is not None else "no restart for this pipeline"
            if why is not None:
                self.failed = why
                return
            self._wanted.set()  # once more: losses while it ran are restarted too, else whole

    def trouble(self) -> dict | None:
        """What /health says of the stages (any thread): None when they answer."""
        with self._lock:
            lost = {**self._taken, **self._lost}
        if self.failed is not None:
            return {"status": "stage lost", "reason": self.failed, "restarting": False}
        if not self.whole.is_set():
            stage, reason = next(iter(lost.items()), (None, "?"))
            return {"status": "stage lost", "stage": stage, "reason": reason, "restarting": self.restarter is not None}
        silent = self.watch.silent()
        if silent:
            k, s = max(silent.items(), key=lambda kv: kv[1])
            if s > self.timeout / 2:
                return {"status": "stage not answering", "stage": k, "silent_s": round(s, 1)}
        since = list(self._since)
        if since and time.monotonic() - since[0] > self.timeout / 2:
            return {"status": "stage not answering", "stage": None,
                    "item_waiting_s": round(time.monotonic() - since[0], 1)}
        return None

    # the pool's plans: here now, on the other stages before the next item, each by its Device method

    def copy(self, copies) -> None:
        self._plan("copy", copies)

    def park(self, copies) -> None:
        self._plan("park", copies)

    def wake(self, copies) -> None:
        self._plan("wake", copies)

    def land(self, remap) -> None:
        self._plan("land", remap)

    def zero_slot(self, slot: int) -> None:
        self._plan("zero_slot", slot)

    def _plan(self, method: str, arg) -> None:
        """`method(arg)` on stage 0 now, and the same call on every other stage before the next item's
        calls: the plan travels as the method's name and its argument (serve/pipeline/work.py)."""
        plan = encode_plan(method, arg)
        apply_plans(self.local, self.host_page_bytes, [plan])
        self.plans.append(plan)

    # steps

    def step(self, program: str, cells: list) -> list:
        if self.broken.is_set() or not self.whole.is_set():
            raise StageLost("the pipeline lost a stage")
        while len(self.in_flight) >= self.stages:
            self._collect()
        if self.route[1] is not None and self.route[1] != self.down_at and self.reconnect is not None:
            self.down.close()  # stage 1 was replaced: what waited for the old one is void
            self.down, self.down_at = self.reconnect(self.route[1]), self.route[1]
        n = self.items
        self.items += 1
        issued = time.time()
        leave = self.work.run(program, cells, {})
        head = {"item": n, "epoch": self.epoch, "route": self.route, "program": program, "cells": cells_to(cells),
                "plans": self.plans}
        self.plans = []
        try:
            self.down.send(Message("item", head, leave))
        except Exception as exc:  # zmq.Again: stage 1 takes nothing
            self.lose(1, f"it took no item ({exc})")
            raise StageLost("stage 1 took no item") from exc
        logs.event("pp item", "DEBUG", stage=0, item=n, program=program, rows=sum(len(c.ids) for c in cells),
                   issued_us=int(issued * 1e6), done_us=int(time.time() * 1e6))
        self.in_flight.append(n)
        self._since.append(time.monotonic())
        emits = self._emits.get(program)
        pending = [Pending(self, n, self.epoch) if emits else [] for _ in cells]
        self._pending[n] = pending if emits else []
        return pending

    def logits(self, groups: int) -> None:
        """The logits are the last stage's: the head has none to read."""
        return None

    def hold_partial(self, wait_s: float = 0.005) -> bool:
        """Whether a partial prefill item should wait: yes while `stages` items are in flight (a
        full one goes at once). Answers already in are collected first; when it says hold, it has
        waited up to `wait_s` for the oldest answer, so a scheduler asking again does not spin."""
        while self.in_flight and not self.watch.inbox.empty():
            self._collect()
        if len(self.in_flight) < self.stages:
            return False
        msg = self._next(wait_s)
        if msg is not None:
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

    def _next(self, wait_s: float):
        """The next `done` of this epoch within `wait_s` (older ones are dropped), or None."""
        deadline = time.monotonic() + wait_s
        while True:
            if self.broken.is_set():
                raise StageLost("the pipeline lost a stage")
            try:
                msg = self.watch.inbox.get(timeout=max(0.0, min(0.1, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    return None
                if self.while_waiting is not None:
                    self.while_waiting()  # the scheduler answers /stats meanwhile
                continue
            if msg.kind == "done" and msg.head.get("epoch", 0) != self.epoch:
                continue  # an item of a pipeline since broken: void
            return msg

    def _collect(self, msg=None) -> tuple[int, list]:
        want = self.in_flight[0]
        if msg is None:
            # the limit, and two heartbeats more: a silent stage is named by the watcher first
            left = self.timeout + 2 * getattr(self.watch, "interval", 0.0) - (time.monotonic() - self._since[0])
            msg = self._next(max(left, 0.0))
        if msg is None:
            self.lose(None, f"item {want} unanswered past --pp-timeout {self.timeout} s")
            logs.event("pp item timed out", "ERROR", item=want, in_flight=len(self.in_flight), pp_timeout=self.timeout)
            raise StageLost(f"item {want} unanswered")
        if msg.kind != "done":
            self.lose(None, f"protocol error: got {msg.kind!r} while waiting for item {want}")
            raise StageLost("protocol error")
        got = int(msg.head["item"])
        if got != want:
            self.lose(None, f"protocol error: the last stage answered item {got}, expected {want}")
            raise StageLost("protocol error")
        self.in_flight.popleft()
        self._since.popleft()
        for pending, toks in zip(self._pending.pop(got, []), msg.head["tokens"]):
            pending.fill(toks)
        return got, msg.head["tokens"]

    def synchronize(self) -> None:
        self.drain()


class Pending(list):
    """A cell's tokens from the last stage: empty until read, then whatever item `item` answered.
    Reading it (index, iterate, len, compare) waits for that answer."""

    __slots__ = ("_pipe", "_item", "_filled", "_epoch")

    def __init__(self, pipe: Pipeline, item: int, epoch: int = 0) -> None:
        super().__init__()
        self._pipe, self._item, self._filled, self._epoch = pipe, item, False, epoch

    def fill(self, toks) -> None:
        list.extend(self, (int(t) for t in toks))
        self._filled = True

    def _ready(self) -> None:
        if not self._filled:
            if self._pipe.epoch != self._epoch:
                raise StageLost(f"item {self._item} was lost with its stage")
            self._pipe.wait(self._item)
            if not self._filled:  # the wait ended without its answer: the pipeline broke meanwhile
                raise StageLost(f"item {self._item} was lost with its stage")

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
