"""`kern serve --frontend-process`: the HTTP front end in this process, the engine core in a child.

One process on one interpreter lock ran both the scheduler thread and the event loop, and each slowed
the other. Here the process that binds the port forks the engine core (`serve/client/frontend_core.py`:
the engine, the scheduler thread) before the model loads, and keeps the HTTP side: uvicorn, request
bodies, replies, SSE framing, /metrics' histograms, logs of its own. The two speak msgpack over
ZeroMQ (`serve/client/frontend_wire.py`), as vLLM V1's API server and engine core do.

The routes are the in-process server's, unchanged: `RemoteEngine` and `RemoteScheduler` stand in for
the `Engine` and the `Scheduler` with the surface the routes use (submit, abort, name, drain, stop,
and `ask` for /stats, /stats/live, /metrics' snapshot and /health). The core's updates arrive one
message per step, read on the event loop itself (the socket's descriptor is one of the loop's
readers) and handed to the requests' queues there: no thread between them (a receiving thread took
the interpreter lock from the loop and woke it once a message).

If the core process ends without being told to stop (a crash of its scheduler thread: 101, or a
kill), every open request is answered with a 503 `engine_core_dead` (a stream: its error event,
then [DONE]), the server stops and the process exits with the core's code (101 when it was killed).

`--frontends N`: this process (the leader) also forks N - 1 more front ends, which serve the same
listening socket, each with its own sockets to the core; the leader drains and stops the core for
all of them, and watches them (docs/serve.md, "More than one front end").
"""

from __future__ import annotations

import asyncio
import atexit
import os
import secrets
import select
import shutil
import signal
import sys
import tempfile
import threading
import time

import zmq

from serve.client.frontend_core import die_with_parent
from serve.client.frontend_wire import dead_error
from serve.client.seam import Delivery
from serve.common import logs
from serve.common.threads import name_native
from serve.core.faults import Faults
from serve.core.messages import (Answer, Arrive, Bye, DrainFor, FrontEndDied, HungUp, Question, Ready, StopCore,
                            Updates, decode, done_of, encode)
from serve.common.api_error import ApiError
from serve.core.request import Done, Request, Update

__all__ = ["RemoteEngine", "RemoteScheduler", "start_core"]

POLL_MS = 200
CRASH = 101  # the exit code when the core was killed (serve/cli.py's EXIT_CRASHED)


def start_core(build, start_scheduler, sock=None, frontends: int = 1) -> tuple[RemoteEngine, RemoteScheduler]:
    """Fork the engine core (`build()` gives (engine, pipeline head or None) there, or exits;
    `start_scheduler(engine)` starts its scheduler and logs the ready line) and wait until it is
    ready. A core that ends first (a target that cannot be served) ends this process with its code.

    With `frontends` > 1 this process forks the other front ends too (`--frontends`), before it makes
    a thread or a ZeroMQ context: each returns from here with a `RemoteScheduler` of its own index and
    goes on to serve the same listening socket; this one is the leader (index 0)."""
    if sys.platform.startswith("linux"):  # the abstract namespace: no file to leave behind
        tmp, name = None, f"@kern-core-{os.getpid()}-{secrets.token_hex(6)}"
    else:
        if frontends > 1:
            raise RuntimeError("--frontends above 1 needs Linux")  # the command refuses it first
        tmp = tempfile.mkdtemp(prefix="kern-core-")
        name = f"{tmp}/sock"
    addrs = [(f"ipc://{name}-{i}-in", f"ipc://{name}-{i}-out") for i in range(frontends)]
    shared = tempfile.mkdtemp(prefix="kern-metrics-") if frontends > 1 else None
    if shared is not None:
        janitor(shared)
    names = _Names() if frontends > 1 else None  # one numbering of requests across the front ends
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        if sock is not None:
            sock.close()
        from serve.client.frontend_core import core_main

        core_main(addrs, build, start_scheduler)  # never returns
    index, peers = 0, []
    for i in range(1, frontends):
        child = os.fork()
        if child == 0:
            index, peers = i, []
            # the leader's death ends this one as SIGTERM does: its open requests are answered (the core
            # dies with the leader: a 503 engine_core_dead each) and it removes the leader's directories
            die_with_parent(signal.SIGTERM)
            break
        peers.append(child)
    if shared is not None:
        share_metrics(shared)
        if index == 0:  # however the leader ends (its `join` removes it on a stop)
            atexit.register(shutil.rmtree, shared, True)
    remote = RemoteScheduler(pid, addrs[index], tmp, index=index, count=frontends, peers=peers, shared=shared,
                             names=names)
    return RemoteEngine(remote.wait_ready()), remote


JANITOR = ("import os, select, shutil, sys\n"
           "try:\n    fd = os.pidfd_open(int(sys.argv[1]))\nexcept ProcessLookupError:\n    fd = None\n"
           "if fd is not None:\n    select.select([fd], [], [])\n"
           "shutil.rmtree(sys.argv[2], ignore_errors=True)\n")


def janitor(path: str) -> None:
    """Remove `path` when this process ends, however it ends (SIGKILL of its whole process group too):
    a small process in a session of its own, not this one's child (forked twice), waits on this
    process through a pidfd, removes the directory and exits."""
    leader = os.getpid()
    first = os.fork()
    if first == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)
                os.closerange(3, 65536)
                os.execv(sys.executable, [sys.executable, "-c", JANITOR, str(leader), path])
        finally:
            os._exit(0)
    os.waitpid(first, 0)


def send_or_drop(push, raw: bytes, ended: threading.Event) -> None:
    """Send `raw` to the core; dropped once `ended` (the core's reaper saw it end: `_fail_all` answers
    whatever was sent). A PUSH socket with no peer blocks a send for good (the queue bound does not
    apply), and a core that died has none: the event loop, sending a request that arrived between the
    death and the reaper, froze, nothing was answered and the server never exited (1 in 6 runs of
    tests/test_serve_exit.py's core kill on a loaded box)."""
    while True:
        try:
            push.send(raw, zmq.NOBLOCK)
            return
        except zmq.Again:  # no core connected: gone (its reaper sets `ended` within moments) or not yet up
            if ended.wait(0.01):
                return


def _signal(pid: int, sig: int) -> None:
    """Send `sig` to a peer front end, which may have ended already."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class _Names:
    """Request numbers shared by the front ends (`--frontends`): a counter in memory mapped before they
    fork, under a lock made then too, so ids stay `req-0`, `req-1`, ... in the order requests arrive,
    whichever front end takes them (as one front end numbers them)."""

    def __init__(self) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        self.count = ctx.RawValue("q", 0)
        self.lock = ctx.Lock()

    def next(self) -> int | None:
        """The next number; None if the lock stays taken a second (a front end killed holding it)."""
        if not self.lock.acquire(timeout=1.0):
            return None
        n = self.count.value
        self.count.value = n + 1
        self.lock.release()
        return n


def share_metrics(path: str) -> None:
    """This front end's Prometheus values in per-process files under `path`, which every front end's
    /metrics sums (prometheus_client's multiprocess mode, as vLLM runs its API servers): set in each
    front-end process before its app makes its metrics."""
    from prometheus_client import values

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    values.ValueClass = values.MultiProcessValue()


class RemoteEngine:
    """The engine's facts as the routes read them (sent once by the core when it is ready)."""

    def __init__(self, d: dict) -> None:
        self._facts = d["facts"]
        self.model = d["model"]
        self.rows, self.reach, self.pages, self.unit = d["rows"], d["reach"], d["pages"], d["unit"]
        self.max_request_tokens = d["max_request_tokens"]
        self.faults = Faults(d["faults"])
        self.lined, self.backend, self.max_seqs, self.chunk = d["lined"], d["backend"], d["max_seqs"], d["chunk"]

    def facts(self) -> dict:
        return {**self._facts, "model": self.model}


class RemoteScheduler:
    """The scheduler as the routes use it, in another process. Every method but `stop` and `join`
    runs on the event loop, which alone uses the sockets while it runs (the receiving one is its
    reader from the first request or question on); before it, `wait_ready` reads, after it `join`."""

    delivery = Delivery.HELD  # on the event loop (a request's `send` may be a queue's put); a whole
    # answer's tokens after its first come with its finish, timed by the core

    def __init__(self, pid: int, addrs: tuple[str, str], tmp: str | None, index: int = 0, count: int = 1,
                 peers=(), shared: str | None = None, names: _Names | None = None) -> None:
        self.pid, self.tmp = pid, tmp
        # `--frontends`: this front end's index of `count`; the leader (0) forked the others (`peers`),
        # drains and stops the core for all of them; `shared`: the metrics' directory (`share_metrics`)
        self.index, self.count, self.leader, self.shared = index, count, index == 0, shared
        self.parent = os.getppid()  # a peer's: the leader, whose directories it removes if it outlives it
        self.peers: dict[int, int | None] = dict.fromkeys(peers)  # pid -> exit code once it ended
        self.names = names
        self.lost_peers: set[int] = set()  # peers that died unasked
        self.ctx = zmq.Context()
        self.push, self.pull = self.ctx.socket(zmq.PUSH), self.ctx.socket(zmq.PULL)
        for s, addr in ((self.push, addrs[0]), (self.pull, addrs[1])):
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 0)  # no bound: a send on the event loop never blocks
            s.setsockopt(zmq.RCVHWM, 0)
            s.bind(addr)
        self.reqs: dict[str, Request] = {}
        self.asks: dict[int, asyncio.Future] = {}
        self._qid = self._names = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.code: int | None = None  # the core's exit code, once it ended
        self.stopped = False  # told to stop: its end is expected
        self.cut_off = 0
        self.ended, self.said_bye = threading.Event(), threading.Event()
        self.on_death = None
        self.ready = False  # the core said it is ready
        self.pending = None  # the app's `serve.api.metrics.Pending`: where the core's timings of held tokens go
        self.letting_go = False  # the leader told its peers to stop
        self.sending = threading.Lock()
        threading.Thread(target=self._reap, name="core-reaper", daemon=True).start()
        for peer in self.peers:
            threading.Thread(target=self._reap_peer, args=(peer,), name="frontend-reaper", daemon=True).start()

    def measure(self, meter) -> None:
        """The app's metrics (`make_app`): the held tokens' timings the core sends are counted there."""
        self.pending = meter.pending

    # the handlers' side (the event loop)

    def name(self) -> str:
        n, self._names = self._names, self._names + 1
        if self.names is not None:
            shared = self.names.next()
            # unique still when the shared count is stuck: this front end's own count, apart
            return f"req-{shared}" if shared is not None else f"req-{self.index}.{n}"
        return f"req-{n}"

    def submit(self, req: Request) -> None:
        self._attach()
        if self.ended.is_set():
            req.send(Update([], Done(None, error=dead_error(self.code))))
            return
        self.reqs[req.id] = req
        self._send(encode(Arrive.of(self.index, req)))

    def abort(self, req: Request) -> None:
        if not self.ended.is_set() and self.reqs.pop(req.id, None) is not None:
            self._send(encode(HungUp(req.id)))

    async def ask(self, what: str):
        """A question of `serve.client.frontend_wire.QUESTIONS`, answered by the core; a 503 when it is gone."""
        if self.ended.is_set():
            raise ApiError(503, dead_error(self.code)[1], code="engine_core_dead", type="server_error")
        self._attach()
        self._qid += 1
        fut = self.asks[self._qid] = self.loop.create_future()
        self._send(encode(Question(self._qid, what, self.index)))
        return await fut

    def drain(self, seconds: float) -> None:
        """The leader drains the core (for every front end) and tells its peers to drain their own
        connections (SIGTERM); a peer leaves the core to the leader."""
        if not self.leader:
            return
        if not self.ended.is_set():
            self._send(encode(DrainFor(seconds)))
        self.letting_go = True
        for peer, code in self.peers.items():
            if code is None:
                _signal(peer, signal.SIGTERM)

    # the main thread's side

    def stop(self, timeout: float = 30.0) -> None:
        """The leader stops the core once its peers have ended (their open requests answered), at
        most `timeout` seconds later (then they are killed); a peer leaves the core to the leader."""
        self.stopped = True
        if not self.leader:
            return
        self.letting_go = True
        deadline = time.monotonic() + timeout
        for peer in self.peers:
            while self.peers[peer] is None and time.monotonic() < deadline:
                time.sleep(0.02)
            if self.peers[peer] is None:
                _signal(peer, signal.SIGKILL)
        if not self.ended.is_set():
            self._send(encode(StopCore()))

    @property
    def peers_cut(self) -> int:
        """The other front ends that, told to stop, ended other than cleanly (cut requests off, or were
        killed past the wait); not one that died on its own before (logged then, its requests aborted)."""
        return sum(1 for pid, code in self.peers.items() if code not in (0, None) and pid not in self.lost_peers)

    def join(self, timeout: float | None = None) -> None:
        """After the loop: wait for the core's goodbye (its cut-off count) and its end."""
        if not self.leader:
            self.release()  # the leader waits for the core; a peer that outlived it cleans up
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.ready and not self.said_bye.is_set() and (deadline is None or time.monotonic() < deadline):
            if self.pull.poll(POLL_MS):
                self._take(self.pull.recv(), deliver=False)  # updates and answers have nobody to go to now
            elif self.ended.is_set() and not self.pull.poll(POLL_MS):
                break  # one more look first: what the core sent just before it ended may still be on its way
        self.ended.wait(None if deadline is None else max(deadline - time.monotonic(), 0))
        self.release()

    def release(self) -> None:
        """The leader's temporary directories removed (the sockets' where not on Linux, the metrics'):
        by the leader, or by a peer front end whose leader ended before it (killed: its own removal
        never ran)."""
        if self.leader or os.getppid() != self.parent:
            for path in (self.tmp, self.shared):
                if path is not None:
                    shutil.rmtree(path, ignore_errors=True)

    def watch(self, on_death) -> None:
        """Call `on_death()` (any thread) if the core ends without being told to stop."""
        self.on_death = on_death
        if self.died is not None:
            on_death()

    @property
    def died(self) -> int | None:
        """The exit code to end with when the core ended on its own (never 0), else None."""
        if not self.ended.is_set() or self.stopped and self.said_bye.is_set():
            return None
        return self.code if self.code is not None and self.code > 0 else CRASH

    def wait_ready(self) -> dict:
        """The core's facts once it is ready; if it ends first, this process ends with its code."""
        while not self.ended.is_set():
            if self.pull.poll(POLL_MS):
                msg = decode(self.pull.recv())
                if isinstance(msg, Ready):
                    self.ready = True
                    return msg.facts
        self.ended.wait()
        if self.leader:
            for peer in self.peers:
                _signal(peer, signal.SIGKILL)  # waiting for a core that will never be ready
        self.release()
        sys.exit(self.code if self.code and self.code > 0 else 1)

    # receiving

    def _attach(self) -> None:
        """Read the core's messages on this event loop from now on."""
        loop = asyncio.get_running_loop()
        if loop is not self.loop:
            self.loop = loop
            loop.add_reader(self.pull.getsockopt(zmq.FD), self._readable)
            self._readable()  # what came before (the descriptor tells only of what arrives after)

    def _readable(self) -> None:
        """Every message waiting (ZeroMQ's descriptor is edge-triggered: read while its events say so)."""
        while self.pull.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            self._take(self.pull.recv(zmq.NOBLOCK))

    def _take(self, raw: bytes, deliver: bool = True) -> None:
        msg = decode(raw)
        if isinstance(msg, Bye):
            self.cut_off = msg.cut_off
            self.said_bye.set()
        elif deliver:
            self._deliver(msg)

    # the reaper's thread

    def _hand(self, fn, *args) -> None:
        loop = self.loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            pass  # the loop is closed: nobody is listening

    def _deliver(self, msg) -> None:
        if isinstance(msg, Updates):
            reqs = self.reqs
            for rid, tokens, done, adm in msg.entries:
                req = reqs.get(rid)
                if req is None:
                    continue  # aborted here already
                if adm is not None:
                    req.cached, req.tier, req.woken, req.t_admit = adm
                d = done_of(done)
                if d is not None:
                    del reqs[rid]
                req.send(Update(tokens, d))
            if msg.timed is not None and self.pending is not None:
                generated, pairs = msg.timed
                self.pending.generated += generated
                for seconds, n in pairs:
                    self.pending.observe(seconds, n)
                if self.pending.now:
                    self.pending.flush()
        elif isinstance(msg, Answer):
            fut = self.asks.pop(msg.qid, None)
            if fut is not None and not fut.done():
                if msg.ok:
                    fut.set_result(msg.value)
                else:
                    fut.set_exception(RuntimeError(msg.value))

    def _reap(self) -> None:
        name_native("kern-core-reaper")
        self.code = self._wait_core()
        self.ended.set()
        if self.stopped or not self.ready:
            return  # told to stop, or it never was ready (its own line said why)
        logs.event("engine core died", "ERROR", pid=self.pid, code=self.code, open=len(self.reqs))
        self._hand(self._fail_all)
        if self.on_death is not None:
            self.on_death()

    def _wait_core(self) -> int | None:
        """The core's exit code once it ended: the leader's child; a peer watches it through a pidfd
        and cannot read its code (None)."""
        if self.leader:
            _, status = os.waitpid(self.pid, 0)
            return os.waitstatus_to_exitcode(status)
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            return None  # gone already
        try:
            select.select([fd], [], [])
        finally:
            os.close(fd)
        return None

    def _reap_peer(self, pid: int) -> None:
        """The leader's watch on a peer front end: one that ends unasked is logged, and the core
        aborts its requests (their clients' connections went with it); the others serve on."""
        _, status = os.waitpid(pid, 0)
        self.peers[pid] = code = os.waitstatus_to_exitcode(status)
        if self.letting_go or self.ended.is_set():
            return
        left = sum(c is None for c in self.peers.values()) + 1
        if code == 0:  # it ended cleanly on its own (told to stop by someone else): its requests were answered
            logs.event("front end ended", "INFO", pid=pid, code=code, left=left)
        else:
            self.lost_peers.add(pid)
            logs.event("front end died", "ERROR", pid=pid, code=code, left=left)
        if not self.ended.is_set():
            self._send(encode(FrontEndDied(list(self.peers).index(pid) + 1)))

    def _send(self, raw: bytes) -> None:
        with self.sending:  # the event loop's, and a peer's reaper (`_reap_peer`)
            send_or_drop(self.push, raw, self.ended)

    def _fail_all(self) -> None:
        error = dead_error(self.code)
        reqs, self.reqs = self.reqs, {}
        for req in reqs.values():
            req.send(Update([], Done(None, error=error)))
        asks, self.asks = self.asks, {}
        for fut in asks.values():
            if not fut.done():
                fut.set_exception(ApiError(503, error[1], code="engine_core_dead", type="server_error"))
