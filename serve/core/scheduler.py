"""The scheduler thread: a thin shell over `serve.core.core.Core`, the thread-free serving policy.

The thread owns the core (and through it the runtime, the pool and the index). Each iteration it
drains its inbox (new requests, aborts, queries), admits from the head of the queue, then runs one
batch:

    plan = core.schedule()      # prefill calls (packed or within the chunk budget), then one batched step
    core.run(plan)              # launch each step on the runtime, commit what its cells emitted

Handlers on other threads only post to the inbox. An exception here ends the process with exit code
101: a server that accepts and never answers is worse than one that is gone (a server run in a
host, `serve/common/hosted.py`, ends its command with 101 instead, and stops at once).

A pipeline head's runtime can lose a stage (`serve/pipeline/pipeline.py`): the step in progress
raises `StageLost`, and the next iteration takes the loss. With restart, the core drops all state and
requeues its running requests at the front, the stages are replaced on a thread of their own, and
nothing is scheduled (the inbox is still served: /stats answers) until the pipeline is whole; without
(or when the restart fails) every request gets a 503 `pipeline_stage_lost` and the process exits 3
EXIT_AFTER_S later, once the answers are out.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import queue
import threading
import time
import traceback
from collections.abc import Callable

from serve.common import hosted, logs
from serve.common.exits import EXIT_PIPELINE
from serve.common.threads import name_native
from serve.core.core import Core, Plan, snapshot_holdings
from serve.core.device import Losable, StageLost
from serve.core.engine import Engine
from serve.core.messages import Abort, Drain, Query, Stop, Submit, dispatcher
from serve.core.request import Delivery, Request
from serve.core.stats import Window

__all__ = ["Plan", "Scheduler", "health_of", "snapshot", "snapshot_holdings"]

EXIT_CRASH = 101
EXPIRE_EVERY_S = 0.1  # how often the waiting queue is read for requests past --queue-timeout
EXIT_AFTER_S = 1.5  # a pipeline that cannot go on: the answers' time to reach their clients before exit 3
EXIT_BACKSTOP_S = 60.0  # ...and how long its HTTP server's orderly exit may take before the process ends anyway


class Scheduler(threading.Thread):
    def __init__(self, engine: Engine, stats_every: float = 5.0) -> None:
        super().__init__(name="scheduler", daemon=True)
        self.engine = engine
        self.core = engine.faults.bind(Core(engine))  # the faults asked for, bound once (serve/core/faults.py)
        self.counters = self.core.counters
        self.inbox: queue.Queue = queue.Queue()  # `serve.core.messages`' Submit, Abort, Query, Drain, Stop
        self._handlers = None  # each inbox message's handler, by its type (made on the first)
        self.window = Window(self.counters, stats_every)
        self.ready = threading.Event()
        self.warm = threading.Event()  # set once every program has run (serve/core/warmup.py)
        self.busy_since: float | None = None  # monotonic start of this iteration's work; None: waiting for work
        self._names = 0
        self._kept: collections.deque = collections.deque()  # what `_queries` left for the next drain
        self._expire_at = 0.0  # monotonic time of the next look for requests past --queue-timeout
        engine.runtime.while_waiting = self._queries  # a pipeline's waits answer /stats
        self._names_lock = threading.Lock()
        self.after_step: Callable[[], None] | None = None  # called on this thread after each iteration's work
        # and before it may wait: `--frontend-process` sends what the iteration's commits told in one message
        # and takes what the front end sent meanwhile (serve/client/frontend_core.py's `Bridge.flush`)

    # `serve.client.seam.EngineClient`, in this process (`serve.client.frontend.RemoteScheduler` is the other one)

    died: int | None = None  # the exit code a separate core process ended with; in process a crash ends it all
    delivery = Delivery.STEPS  # updates reach a request's `send` on this thread, each as the steps make it
    index, count, shared = 0, 1, None  # the only front end; no metrics shared with others
    peers_cut = 0  # no other front ends
    _on_death: Callable[[], None] | None = None  # the HTTP server's stop (`watch`); None in a core process of its own

    def release(self) -> None:
        """Nothing left by another process."""

    def measure(self, meter) -> None:
        """Nothing to bind: the handlers' tracks observe every update here (`make_app` calls it)."""

    def question(self, what: str) -> concurrent.futures.Future:
        """The answer to a question of `serve.client.frontend_wire.QUESTIONS`: /stats and /metrics' snapshot
        on this thread; /stats/live and /health at once on the caller's (they answer while a step is
        in progress, when /stats waits for it)."""
        if what == "stats":
            return self.query(self.stats)
        if what == "snapshot":
            return self.query(lambda: snapshot(self))
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if what == "live":
            fut.set_result(self.live())
        elif what == "health":
            fut.set_result(health_of(self, self.engine))
        else:
            fut.set_exception(ValueError(f"unknown question {what!r}"))
        return fut

    async def ask(self, what: str):
        """`question`, awaited (the routes' call; `serve.client.frontend.RemoteScheduler.ask` asks the core)."""
        return await asyncio.wrap_future(self.question(what))

    def watch(self, on_death) -> None:
        """`on_death()` is how a pipeline that gave up ends the HTTP server (`_give_up`): an orderly exit,
        so a request arriving meanwhile is answered 503, not reset. A crash of this thread ends the
        process (`hosted.crashed`)."""
        self._on_death = on_death

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
        self.inbox.put(Submit(req))

    def abort(self, req: Request) -> None:
        self.inbox.put(Abort(req))

    def query(self, fn) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.inbox.put(Query(fn, fut))
        return fut

    def stop(self) -> None:
        self.inbox.put(Stop())

    def drain(self, seconds: float) -> None:
        """Refuse new requests (a 503 each) but finish the queued and running ones; whatever is still
        unfinished `seconds` from now is cut off with a 503 and counted in `cut_off`."""
        self.inbox.put(Drain(time.monotonic() + seconds))

    @property
    def cut_off(self) -> int:
        return self.core.cut_off

    @property
    def cut_at(self) -> float | None:
        return self.core.cut_at

    # the thread

    def run(self) -> None:
        name_native("kern-scheduler")
        try:
            self.ready.set()
            from serve.core.warmup import warm_up

            try:
                warm_up(self.engine)  # requests submitted meanwhile wait in the inbox
            except StageLost:
                pass  # a pipeline stage was lost while warming: the loop takes the loss
            self.warm.set()
            self._loop()
        except BaseException:
            logs.event("scheduler crashed", "ERROR", error=traceback.format_exc().strip().splitlines()[-1])
            traceback.print_exc()
            hosted.crashed(EXIT_CRASH)  # the process (or, in a host, this server's command) ends

    def _loop(self) -> None:
        core = self.core
        pipe = self.engine.runtime if self.engine.runtime.broken is not None else None  # a device that can lose a stage
        while True:
            if self.after_step is not None:
                self.after_step()
            halted = pipe is not None and (not pipe.whole.is_set() or core.lost is not None)
            if not core.running or halted:
                self.busy_since = None  # the drain may block: waiting for work (or for the stages)
            self._drain(block=not core.running or halted, most=0.1 if pipe is not None else 1.0)
            self.busy_since = time.monotonic()
            if pipe is not None and self._stages(pipe):
                if self.window.due():
                    self.window.flush(core.gauges())
                continue
            if core.cut_at is not None and time.monotonic() >= core.cut_at:
                core.cut()
            if core.done:
                if self.after_step is not None:
                    self.after_step()
                return
            if core.queue_timeout is not None and time.monotonic() >= self._expire_at:
                self._expire_at = time.monotonic() + EXPIRE_EVERY_S
                core.expire(self._expire_at - EXPIRE_EVERY_S)
            try:
                core.admit()
                if core.running:
                    t0 = time.perf_counter()
                    core.run(core.schedule())
                    self.counters.loop_s += time.perf_counter() - t0
                    # what just finished freed room: admit now, so the next drain only blocks when nothing
                    # runs and the queue's head cannot be admitted
                    core.admit()
            except StageLost:
                pass  # taken at the top of the next iteration
            if self.window.due():
                self.window.flush(core.gauges())

    def _stages(self, pipe: Losable) -> bool:
        """Take a pipeline's loss, or its failure to restart; True while nothing may be scheduled."""
        core = self.core
        if pipe.broken.is_set():
            lost = pipe.take_loss()
            core.step_since = None
            reason = "; ".join(f"stage {k}: {why}" if k is not None else why for k, why in lost.items())
            if pipe.restarter is None or core.lost is not None:
                self._give_up(pipe, reason)
            else:
                n = core.lose_state()
                logs.event("pp resuming", "WARN", requeued=n, epoch=pipe.epoch, lost=reason)
                pipe.begin_restart(list(lost))
        if pipe.failed is not None and core.lost is None:
            self._give_up(pipe, pipe.failed)
        if core.cut_at is not None and time.monotonic() >= core.cut_at:
            core.cut()
        if core.done:
            return False  # the loop returns
        return core.lost is not None or not pipe.whole.is_set()

    def _give_up(self, pipe: Losable, reason: str) -> None:
        stages = pipe.lost_stages()
        where = f"stage {','.join(map(str, stages))}" if stages else "a stage"
        error = (503, f"the pipeline lost {where} ({reason}); this server is exiting", "pipeline_stage_lost", None)
        n = self.core.lose_state(error)
        logs.event("pp giving up", "ERROR", answered=n, reason=reason, exit_in_s=EXIT_AFTER_S)
        threading.Timer(EXIT_AFTER_S, self._end_lost, args=(pipe, reason, n)).start()

    def _end_lost(self, pipe: Losable, reason: str, answered: int) -> None:
        """A pipeline that cannot go on, once its answers had their time: with an HTTP server watching
        (`watch`), through its shutdown (what arrives meanwhile is answered 503 `server_shutting_down`,
        not reset; the process exits 3 from `serve.server.run`), with `pipe.die` as a backstop should
        that hang; a core of its own process (`--frontend-process`) ends at once, and its front end
        answers for it."""
        on_death = self._on_death
        if on_death is None:
            pipe.die(reason, answered)
            return
        logs.event("pp stage lost", "ERROR", reason=reason, answered=answered)
        self.died = EXIT_PIPELINE
        backstop = threading.Timer(EXIT_BACKSTOP_S, pipe.die, args=(reason, answered))
        backstop.daemon = True
        backstop.start()
        on_death()

    def _queries(self) -> None:
        """While a pipeline waits on its stages (inside a step): answer the queries (/stats, /metrics:
        reads) now and keep the rest, in order, for the next drain."""
        while True:
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(msg, Query):
                self._handle(msg)
            else:
                self._kept.append(msg)

    def _drain(self, block: bool, most: float = 1.0) -> None:
        while self._kept:
            self._handle(self._kept.popleft())
            block = False
        cut_at = self.core.cut_at
        left = None if cut_at is None else cut_at - time.monotonic()
        wait = min(most, left) if left is not None and left > 0 else most  # wake for a drain's deadline
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
        if self._handlers is None:
            self._handlers = dispatcher({Submit: lambda m: self.core.submit(m.req), Abort: lambda m: self.core.abort(m.req),
                                         Query: _answer, Drain: lambda m: self.core.drain(m.until),
                                         Stop: lambda m: self.core.stop()})
        self._handlers(msg)


def _answer(q: Query) -> None:
    """A read on the scheduler thread: its result (or its exception) to the asker's future."""
    if not q.fut.set_running_or_notify_cancel():
        return  # its asker stopped waiting (a route's bounded wait)
    try:
        q.fut.set_result(q.fn())
    except Exception as exc:  # a query is a read; its failure is the asker's
        q.fut.set_exception(exc)


def snapshot(scheduler) -> dict:
    """What the collector reads: /stats' dict plus the prefix-cache queries. Run it on the scheduler
    thread: `await asyncio.wrap_future(scheduler.query(lambda: snapshot(scheduler)))`."""
    return {**scheduler.stats(), "prefix_queries": scheduler.counters.queried}


def health_of(scheduler, engine) -> dict:
    """/health's facts (any thread): a pipeline's trouble (a stage lost or silent, else None), whether
    the scheduler is ready, alive and warm, and how long its iteration in progress has run (`busy_s`,
    None while it waits for work: the front end calls it stuck past `--stuck-after`)."""
    busy = getattr(scheduler, "busy_since", None)
    return {"trouble": engine.runtime.trouble(), "ready": scheduler.ready.is_set(),
            "alive": scheduler.is_alive(), "warm": scheduler.warm.is_set(),
            "busy_s": None if busy is None else round(time.monotonic() - busy, 3)}
