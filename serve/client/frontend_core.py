"""The engine core process of `kern serve --frontend-process`: the engine, the scheduler thread and a
bridge to the HTTP front end (`serve/client/frontend.py`), over the messages of `serve/client/frontend_wire.py`.

The process is forked from the front end after the port is bound, and builds the engine itself (a
target that cannot be served ends it with its one `kern serve: error:` line and exit 2, which the
front end exits with). Its log lines go to the stderr it shares with the front end, in the same
format. It ignores SIGTERM and SIGINT (the front end drains and then tells it to stop) and ends when
the front end does (Linux's parent-death signal, and a check of its parent every poll). A crash of
the scheduler thread ends it with 101, which the front end answers and exits with.

Three threads. The scheduler's commits gather each request's update in the bridge, and the scheduler
thread itself sends them as one message after each iteration of its loop (one message per step,
every sequence's new tokens in it: handing each update to another thread cost the core a lock and an
interpreter-lock handoff per step), and then reads what the front end sent (requests, aborts,
questions, drain, stop) before its next iteration: a request that waited for the main thread to win
the interpreter lock from a busy scheduler waited up to its 5 ms switch interval. The main thread
reads too, woken by the socket's descriptor, for when the scheduler waits for work or is inside a
long step (a question about /health must be answered then); one of them at a time (`Bridge.pull`).
`Outgoing`'s thread sends the rest (answers to questions, ready, bye), the socket shared under a lock.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time

import zmq

from serve.common import logs
from serve.common.threads import name_native
from serve.core.messages import (Answer, Arrive, Bye, DrainFor, FrontEndDied, HungUp, Question, Ready, StopCore,
                            Updates, decode, dispatcher, encode, pack_done)
from serve.core.request import Request, Update

__all__ = ["Outgoing", "core_main", "die_with_parent", "facts_of"]

POLL_MS = 200  # how often the receiving thread looks at its parent and the scheduler thread
PR_SET_PDEATHSIG = 1


class Outgoing:
    """What the core sends from other threads than the scheduler's (answers to questions, ready, bye),
    gathered from any thread and sent by one; the sockets (not thread-safe; one per front end) are used
    under `sending`, which the scheduler thread's `send_now` of each iteration's updates takes too."""

    def __init__(self, socks: list) -> None:
        self.socks = socks
        self.dead: set[int] = set()  # front ends that died (`--frontends`): nobody reads their socket
        self.lock = threading.Lock()
        self.items: list = []  # (front end or None for every one, message)
        self.sending = threading.Lock()  # one thread at a time on the sockets (the scheduler's `send_now`)
        self.wake = threading.Event()
        self.closing = False
        self.thread = threading.Thread(target=self._run, name="core-out", daemon=True)
        self.thread.start()

    def put(self, item, to: int | None = None) -> None:
        """Send `item` to front end `to` (None: to every front end)."""
        with self.lock:
            self.items.append((to, item))
            first = len(self.items) == 1
        if first:
            self.wake.set()

    def send_now(self, data: bytes, to: int = 0) -> None:
        """Send `data` to front end `to` from the calling thread (the scheduler's, after an iteration)."""
        with self.sending:
            self.socks[to].send(data)

    def close(self) -> None:
        """Send what is left, then end the thread."""
        self.closing = True
        self.wake.set()
        self.thread.join(10)

    def _run(self) -> None:
        name_native("kern-core-out")
        while True:
            self.wake.wait()
            self.wake.clear()
            with self.lock:
                items, self.items = self.items, []
            for to, item in items:
                data = encode(item)
                for k in range(len(self.socks)) if to is None else (to,):
                    self.send_now(data, k)
            if self.closing and not self.items:
                return


def facts_of(engine) -> dict:
    """What the front end's routes read of the engine (`serve.client.frontend.RemoteEngine`)."""
    return {"facts": engine.facts(), "model": engine.model, "rows": engine.rows, "reach": engine.reach,
            "pages": engine.pages, "unit": engine.unit, "max_request_tokens": engine.max_request_tokens,
            "faults": sorted(engine.faults.names), "lined": engine.lined, "backend": engine.backend,
            "max_seqs": engine.max_seqs, "chunk": engine.chunk}


class Stamp:
    """One iteration of the scheduler, its end's time set when the bridge flushes it."""

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t: float | None = None


class Timed:
    """Whole answers' tokens after their first, timed in the core: the front end's inter-token latency
    and generation tokens for tokens it is not sent one step at a time. `step(last, n)` counts an
    update of n tokens whose previous update was in iteration `last`; at the iteration's end `close`
    turns the counts into (seconds per token, tokens) pairs (one per distinct previous iteration and
    n: usually one an iteration), `take` hands them over ([generated, [[seconds, tokens], ...]] or
    None), due every `EVERY_S` or when an update goes anyway."""

    EVERY_S = 0.05  # the longest the front end's /metrics lags the core's held tokens (a scrape: none)

    __slots__ = ("stamp", "counts", "pairs", "generated", "sent_at", "every_s")

    def __init__(self, every_s: float = EVERY_S) -> None:
        self.every_s = every_s
        self.stamp = Stamp()  # this iteration's
        self.counts: dict[tuple[Stamp, int], int] = {}
        self.pairs: list[list] = []
        self.generated = 0
        self.sent_at = 0.0

    def step(self, last: Stamp, n: int) -> Stamp:
        key = (last, n)
        self.counts[key] = self.counts.get(key, 0) + 1
        return self.stamp

    def close(self, now: float) -> None:
        """The iteration ends at `now`: its updates' gaps become pairs."""
        if self.counts:
            for (last, n), c in self.counts.items():
                gap = now - last.t if last.t is not None else 0.0  # None: the same iteration (no gap)
                self.pairs.append([gap / n, n * c])
                self.generated += n * c
            self.counts = {}
        self.stamp.t = now
        self.stamp = Stamp()

    def pending(self) -> bool:
        return bool(self.pairs)

    def due(self, now: float) -> bool:
        return bool(self.pairs) and now - self.sent_at >= self.every_s

    def take(self, now: float) -> list | None:
        self.sent_at = now
        if not self.pairs:
            return None
        out = [self.generated, self.pairs]
        self.pairs, self.generated = [], 0
        return out


class Bridge:
    """The front end's requests turned into the scheduler's, and their updates sent back."""

    def __init__(self, scheduler, engine, out: Outgoing, inp=None) -> None:
        self.scheduler = scheduler
        self.engine = engine
        self.out = out
        self.inp = inp  # the front ends' socket, read by `pull` (from two threads, one at a time)
        self.reading = threading.Lock()
        self.reqs: dict[str, Request] = {}
        self.owner: dict[str, int] = {}  # request -> the front end it came from (`--frontends`)
        # the updates since the last `flush`, one list per front end (appended and sent on the scheduler thread)
        self.updates: list[list] = [[] for _ in (out.socks if out is not None else [None])]
        # whole answers' tokens after their first, timed here (`Timed`, one per front end: a request's
        # timings go to its own front end, with or before its finish) and held until their finish
        self.timeds = [Timed() for _ in self.updates]
        # a front end's message to the handler for its type
        self.handle = dispatcher({Arrive: self._arrive, HungUp: self._hung_up,
                                  Question: lambda m: self.question(m.qid, m.what, m.fe),
                                  FrontEndDied: self._front_end_died,
                                  DrainFor: lambda m: self.scheduler.drain(m.seconds),
                                  StopCore: lambda m: self.scheduler.stop()})

    def flush(self) -> None:
        """Send each front end the updates gathered for it since the last call as one message (the
        scheduler's `after_step`), with its held tokens' timings, which also go alone when `Timed` says
        they are due; then take what the front ends sent meanwhile. An iteration that only stepped
        whole answers sends nothing."""
        now = time.monotonic()
        send = self.out.send_now
        for k, updates in enumerate(self.updates):
            timed = self.timeds[k]
            timed.close(now)
            if updates:
                data = encode(Updates(updates, timed.take(now)))
                updates.clear()  # the sinks hold this list
                send(data, k)
            elif timed.due(now):
                send(encode(Updates([], timed.take(now))), k)
        self.pull(wait=False)

    def send_timed(self, to: int = 0) -> None:
        """Send front end `to` its held tokens' timings now (on the scheduler thread, before /metrics'
        snapshot is taken for it: the scrape then counts every token committed before it, of its own
        requests; with `--frontends` another front end's come at most `Timed.EVERY_S` later, and with
        their request's finish)."""
        timed = self.timeds[to]
        if timed.pending():
            self.out.send_now(encode(Updates([], timed.take(time.monotonic()))), to)

    def pull(self, wait: bool = True) -> None:
        """Handle every message waiting from the front end; without `wait`, nothing when the other
        thread is at it. ZeroMQ's descriptor is edge-triggered: read while the socket's events say so."""
        if self.inp is None or not self.reading.acquire(blocking=wait):
            return
        try:
            while self.inp.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                self.handle(decode(self.inp.recv(zmq.NOBLOCK)))
        finally:
            self.reading.release()

    def sink(self, rid: str, whole: bool = False, to: int = 0):
        """Request `rid`'s `send`: its updates gathered for the next `flush`. A `whole` answer (not
        streamed) has its first tokens sent at once (the front end times the first token) and the
        rest held here, each update timed (`Timed.step`), until its finish carries them all."""
        told = [False]
        last: list = [None]  # a whole answer's last update's `Stamp`: None before its first tokens
        held: list[int] = []
        timed = self.timeds[to]
        updates = self.updates[to]

        def send(update: Update) -> None:  # on the scheduler thread
            adm = None
            if not told[0]:
                told[0] = True
                req = self.reqs.get(rid)
                if req is not None:
                    adm = [req.cached, req.tier, req.woken, req.t_admit]
            tokens, done = update.tokens, update.done
            if whole and (held or last[0] is not None and tokens):
                if tokens:
                    last[0] = timed.step(last[0], len(tokens))
                    held.extend(tokens)
                if done is None:
                    return
                tokens = held
            elif whole and tokens:
                last[0] = timed.stamp
            if done is not None:
                self.reqs.pop(rid, None)
                self.owner.pop(rid, None)
            updates.append([rid, tokens, pack_done(done), adm])

        return send

    def _arrive(self, m: Arrive) -> None:
        req = Request(m.id, m.ids, m.max_tokens, self.engine.rows, None, **m.kwargs())
        req.send = self.sink(req.id, req.whole, m.fe)
        self.reqs[req.id] = req
        self.owner[req.id] = m.fe
        self.scheduler.submit(req)

    def _hung_up(self, m: HungUp) -> None:
        req = self.reqs.get(m.id)
        if req is not None:
            self.scheduler.abort(req)

    def _front_end_died(self, m: FrontEndDied) -> None:  # its clients are gone with it
        self.out.dead.add(m.fe)  # what is still sent to it is dropped at the end, not waited for
        for rid in [r for r, fe in self.owner.items() if fe == m.fe]:
            req = self.reqs.get(rid)
            if req is not None:
                self.scheduler.abort(req)

    def question(self, qid: int, what: str, to: int = 0) -> None:
        """Answer front end `to`'s question `qid` (the scheduler's `question`) when its answer is ready;
        /metrics' snapshot after the held tokens' timings are sent to it (both on the scheduler thread,
        in order)."""
        if what == "snapshot":
            self.scheduler.query(lambda: self.send_timed(to))
        self.scheduler.question(what).add_done_callback(lambda f: self.out.put(
            Answer(qid, True, f.result()) if f.exception() is None else Answer(qid, False, str(f.exception())), to))


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """`sig` (SIGKILL) to this process when the one that forked it dies (Linux; elsewhere a poll
    notices). A peer front end takes SIGTERM: it answers its open requests and ends."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass  # not Linux: the poll's parent check still ends it


def core_main(addrs: list[tuple[str, str]], build, start_scheduler) -> None:
    """The forked child's whole life; never returns. `build()` gives (engine, head or None), or exits
    (a target that cannot be served); `start_scheduler(engine)` starts the scheduler thread and logs
    the ready line."""
    name_native("kern-core")  # the process's own name in `ps`, `top`
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_parent()
    code = 0
    try:
        engine, head = build()
        logs.event("engine core", pid=os.getpid(), frontend=parent)
        ctx = zmq.Context()
        inp, outs = ctx.socket(zmq.PULL), [ctx.socket(zmq.PUSH) for _ in addrs]  # one in from all, one out each
        for sock in (inp, *outs):
            sock.setsockopt(zmq.SNDHWM, 0)  # no bound: the sender never waits on the front end
            sock.setsockopt(zmq.RCVHWM, 0)
        for (into, back), o in zip(addrs, outs):
            inp.connect(into)
            o.connect(back)
        scheduler = start_scheduler(engine)
        out = Outgoing(outs)
        out.put(Ready(facts_of(engine)))
        bridge = Bridge(scheduler, engine, out, inp)
        scheduler.after_step = bridge.flush
        _receive(inp, bridge, parent)
        scheduler.join(30)
        out.put(Bye(scheduler.cut_off))
        out.close()
        if head is not None:
            head.stop()
        for k, o in enumerate(outs):  # only the leader (0) waits for the goodbye; the others ended before
            o.close(linger=0 if k in out.dead or k > 0 else 5000)  # the leader sent "x" (queued: never read)
        inp.close(linger=0)
        ctx.term()  # sends what is queued (the goodbye above: its cut-off count) before os._exit ends the I/O thread
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the front end reads the exit code; the line says why
        import traceback

        logs.event("engine core failed", "ERROR", error=traceback.format_exc().strip().splitlines()[-1])
        code = 1
    sys.stderr.flush()
    os._exit(code)


def _receive(inp, bridge: Bridge, parent: int) -> None:
    """Hand the front end's messages to the bridge until the scheduler thread ends (after a stop),
    woken by the socket's descriptor (polled as a plain descriptor: the socket itself is used only
    under `Bridge.pull`'s lock, which the scheduler thread takes too)."""
    ready = select.poll()
    ready.register(inp.getsockopt(zmq.FD), select.POLLIN)
    while bridge.scheduler.is_alive():
        if os.getppid() != parent:
            os._exit(1)  # the front end is gone
        ready.poll(POLL_MS)
        bridge.pull()
