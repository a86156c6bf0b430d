"""The scheduler thread: a thin shell over `serve.core.Core`, the thread-free serving policy.

The thread owns the core (and through it the runtime, the pool and the index). Each iteration it
drains its inbox (new requests, aborts, queries), admits from the head of the queue, then runs one
batch:

    plan = core.schedule()      # prefill calls (packed or within the chunk budget), then one batched step
    core.run(plan)              # launch each step on the runtime, commit what its cells emitted

Handlers on other threads only post to the inbox. An exception here ends the process with exit code
101: a server that accepts and never answers is worse than one that is gone (a server run in a
host, `serve/hosted.py`, ends its command with 101 instead, and stops at once).
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
import traceback

from serve import hosted, logs
from serve.core import Core, Plan, snapshot_holdings
from serve.engine import Engine
from serve.request import Request
from serve.stats import Window

__all__ = ["Plan", "Scheduler", "snapshot_holdings"]

EXIT_CRASH = 101


class Scheduler(threading.Thread):
    def __init__(self, engine: Engine, stats_every: float = 5.0) -> None:
        super().__init__(name="scheduler", daemon=True)
        self.engine = engine
        self.core = Core(engine)
        self.counters = self.core.counters
        self.inbox: queue.Queue = queue.Queue()
        self.window = Window(self.counters, stats_every)
        self.ready = threading.Event()
        self.warm = threading.Event()  # set once every program has run (serve/warmup.py)
        self.busy_since: float | None = None  # monotonic start of this iteration's work; None: waiting for work
        self._names = 0
        self._names_lock = threading.Lock()

    # views of the core (read on this thread, or through `query`)

    @property
    def waiting(self):
        return self.core.waiting

    @property
    def running(self):
        return self.core.running

    @property
    def stopping(self) -> bool:
        return self.core.stopping

    def gauges(self) -> dict[str, int]:
        return self.core.gauges()

    def stats(self) -> dict:
        return self.core.stats()

    def live(self) -> dict:
        """What any thread can read while this one is busy (``GET /stats/live``): the step counter, how
        long the current iteration and the runtime step in it have run (None: waiting for work, not in
        a step) and the queues' lengths. /stats waits for the scheduler; this never does."""
        now = time.monotonic()
        busy, step = self.busy_since, self.core.step_since
        return {"steps": self.counters["steps"], "busy_s": None if busy is None else round(now - busy, 3),
                "step_s": None if step is None else round(now - step, 3),
                "running": len(self.core.running), "waiting": len(self.core.waiting)}

    # the handlers' side (any thread)

    def name(self) -> str:
        with self._names_lock:
            n, self._names = self._names, self._names + 1
        return f"req-{n}"

    def submit(self, req: Request) -> None:
        self.inbox.put(("submit", req))

    def abort(self, req: Request) -> None:
        self.inbox.put(("abort", req))

    def query(self, fn) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.inbox.put(("query", fn, fut))
        return fut

    def stop(self) -> None:
        self.inbox.put(("stop",))

    def drain(self, seconds: float) -> None:
        """Refuse new requests (a 503 each) but finish the queued and running ones; whatever is still
        unfinished `seconds` from now is cut off with a 503 and counted in `cut_off`."""
        self.inbox.put(("drain", time.monotonic() + seconds))

    @property
    def cut_off(self) -> int:
        return self.core.cut_off

    @property
    def cut_at(self) -> float | None:
        return self.core.cut_at

    # the thread

    def run(self) -> None:
        try:
            self.ready.set()
            from serve.warmup import warm_up

            warm_up(self.engine)  # requests submitted meanwhile wait in the inbox
            self.warm.set()
            self._loop()
        except BaseException:
            logs.event("scheduler crashed", "ERROR", error=traceback.format_exc().strip().splitlines()[-1])
            traceback.print_exc()
            hosted.crashed(EXIT_CRASH)  # the process (or, in a host, this server's command) ends

    def _loop(self) -> None:
        core = self.core
        while True:
            if not core.running:
                self.busy_since = None  # the drain may block: waiting for work
            self._drain(block=not core.running)
            self.busy_since = time.monotonic()
            if core.cut_at is not None and time.monotonic() >= core.cut_at:
                core.cut()
            if core.done:
                return
            core.admit()
            if core.running:
                t0 = time.perf_counter()
                core.run(core.schedule())
                self.counters.loop_s += time.perf_counter() - t0
                # what just finished freed room: admit now, so the next drain only blocks when nothing
                # runs and the queue's head cannot be admitted
                core.admit()
            if self.window.due():
                self.window.flush(core.gauges())

    def _drain(self, block: bool) -> None:
        cut_at = self.core.cut_at
        left = None if cut_at is None else cut_at - time.monotonic()
        wait = min(1.0, left) if left is not None and left > 0 else 1.0  # wake for a drain's deadline
        try:
            msg = self.inbox.get(timeout=wait) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(msg)
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, msg) -> None:
        kind = msg[0]
        if kind == "submit":
            self.core.submit(msg[1])
        elif kind == "abort":
            self.core.abort(msg[1])
        elif kind == "query":
            fut = msg[2]
            try:
                fut.set_result(msg[1]())
            except Exception as exc:  # a query is a read; its failure is the asker's
                fut.set_exception(exc)
        elif kind == "drain":
            self.core.drain(msg[1])
        elif kind == "stop":
            self.core.stop()
