"""Liveness between the head and its stages, made explicit: ZeroMQ reconnects silently and a receive
from a dead peer just waits, so each side runs a watcher thread with a socket of its own that trades
heartbeats and ends the process when the other side falls silent past `--pp-timeout`.

    HeadWatch   the head's control socket (ROUTER): heartbeats out, heartbeats and replies in; a stage
                silent past the limit, whose connection closed, whose process exited or that reported
                an error is lost: `on_lost(stage, reason)` is told (once per loss; the serving head
                marks its pipeline broken), or, with no `on_lost`, the head ends (EXIT_PIPELINE)
    StageWatch  a stage's heartbeat socket (DEALER): a head silent past the limit, a closed
                connection, or a parent that exited ends the stage
    die_with_parent   ask Linux to SIGKILL this process when its parent dies (PR_SET_PDEATHSIG)
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import sys
import threading
import time

import zmq

from serve.common import logs
from serve.common.exits import EXIT_PIPELINE
from serve.pipeline.transport import Message, ZmqWire

__all__ = ["EXIT_PIPELINE", "HeadWatch", "StageWatch", "die_with_parent", "interval_for", "hb_identity"]

# EXIT_PIPELINE (serve/common/exits.py): the exit code of a head whose stage is gone, or of a stage whose head or
# neighbour is gone


def interval_for(timeout: float) -> float:
    """Heartbeat period: a quarter of the limit, at most 1 s."""
    return max(0.05, min(1.0, timeout / 4))


def hb_identity(stage: int) -> bytes:
    return f"s{stage}.hb".encode()


def die(event: str, fields: dict, code: int = EXIT_PIPELINE) -> None:
    """Log one clear line (`event` with its `fields`) and end the process now (threads and sockets included)."""
    logs.event(event, "ERROR", **fields)
    sys.stderr.flush()
    os._exit(code)


def die_with_parent(parent: int | None) -> None:
    """SIGKILL this process when its parent dies; exit at once if that already happened."""
    if parent is None:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: StageWatch's parent check still ends us
    if os.getppid() != parent:
        die("pp head gone", {"reason": "parent exited before the stage started", "parent": parent})


class HeadWatch(threading.Thread):
    """Owns the head's control wire from the start: `done` messages go to `inbox`, the handshake's
    (hello, ready) to `control`; heartbeats go only to stages already heard from. A stage is watched for
    silence once it said anything (its hello, from before its own watcher's first beat: a stage frozen
    that early was never missed), and one reported lost is not watched again until `revive`."""

    def __init__(self, ctl: ZmqWire, stages: list[int], timeout: float, on_lost=None) -> None:
        super().__init__(name="pp-watch", daemon=True)
        self.ctl = ctl
        self.stages = stages
        self.timeout = timeout
        self.interval = interval_for(timeout)
        self.inbox: queue.Queue = queue.Queue()  # done
        self.control: queue.Queue = queue.Queue()  # hello, ready
        self.known: set[bytes] = set()
        self.heard: set[int] = set()  # stages that said anything since they started: watched for silence
        now = time.monotonic()
        self.seen = {k: now for k in stages}
        self.on_lost = on_lost
        self.procs: dict[int, object] = {}  # stage -> the Popen of a stage this head started (polled)
        self.lost: set[int] = set()
        self._halt = threading.Event()
        self._outbox: queue.Queue = queue.Queue()

    def post(self, to: bytes, msg: Message) -> None:
        """Send `msg` to a peer identity from any thread (the watcher sends it)."""
        self._outbox.put((to, msg))

    def revive(self, k: int) -> None:
        """Stage k was replaced: watch it again from now (any thread)."""
        self.seen[k] = time.monotonic()
        self.lost.discard(k)

    def silent(self) -> dict[int, float]:
        """Seconds since each watched stage was last heard from (any thread)."""
        now = time.monotonic()
        return {k: now - t for k, t in list(self.seen.items()) if k not in self.lost}

    def stop_stages(self) -> None:
        """Tell every stage to end (each exits 0), then stop watching."""
        for k in self.stages:
            if hb_identity(k) in self.known:
                self.post(hb_identity(k), Message("stop"))
        deadline = time.monotonic() + 2.0
        while not self._outbox.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
        self._halt.set()

    def stop(self) -> None:
        self._halt.set()

    def _lose(self, k: int | None, event: str, fields: dict) -> None:
        if self.on_lost is None:
            die(event, {"stage": k, **fields})
        if k is not None and k in self.lost:
            return
        if k is not None:
            self.lost.add(k)
            self.known.discard(hb_identity(k))  # beat to its replacement once that is heard from
            self.heard.discard(k)  # and watch it from its first word
        logs.event(event, "ERROR", stage=k, **fields)
        self.on_lost(k, fields.get("reason") or fields.get("error") or event)

    def run(self) -> None:
        last_beat = 0.0
        while not self._halt.is_set():
            msg = self.ctl.recv(self.interval / 2)
            now = time.monotonic()
            if msg is not None:
                self._handle(msg, now)
            while not self._outbox.empty():
                to, out = self._outbox.get_nowait()
                self._send(to, out)
            if now - last_beat >= self.interval:
                last_beat = now
                for k in self.stages:
                    if hb_identity(k) in self.known:
                        self._send(hb_identity(k), Message("hb"))
            for k, p in list(self.procs.items()):
                if k not in self.lost and p.poll() is not None:
                    self._lose(k, "pp stage lost", {"reason": f"its process exited with {p.returncode}"})
            for k, t in list(self.seen.items()):
                if k in self.heard and k not in self.lost and now - t > self.timeout:
                    # a stage not heard from yet is starting: startup has its own deadline
                    self._lose(k, "pp stage lost", {"reason": "no heartbeat", "silent_s": round(now - t, 1),
                                                        "pp_timeout": self.timeout})

    def _stage_of(self, sender: bytes | None) -> int | None:
        try:
            return int(sender.decode().split(".")[0][1:])
        except (AttributeError, ValueError):
            return None

    def _handle(self, msg: Message, now: float) -> None:
        k = self._stage_of(msg.sender)
        if k in self.seen:
            if k not in self.lost:
                self.seen[k] = now
            self.known.add(msg.sender)
            self.heard.add(k)
        if msg.kind == "error":
            self._lose(k, "pp stage failed", {"error": msg.head.get("error", "?")})
        elif msg.kind in ("hello", "ready"):
            self.control.put(msg)
        elif msg.kind != "hb":
            self.inbox.put(msg)

    def _send(self, to: bytes, msg: Message) -> None:
        if self._halt.is_set():
            return
        k = self._stage_of(to)
        try:
            self.ctl.send(msg, to=to)
        except zmq.ZMQError as exc:
            # ROUTER_MANDATORY: the peer's connection is gone (EHOSTUNREACH) or stuck (EAGAIN)
            if k in self.lost:
                return
            self._lose(k, "pp stage lost", {"reason": f"its connection closed ({exc.strerror})"})


class StageWatch(threading.Thread):
    """A stage's heartbeat socket: beats to the head; a silent or disconnected head, or a dead
    parent, ends this process."""

    def __init__(self, ctx: zmq.Context, head: str, stage: int, timeout: float, parent: int | None = None) -> None:
        super().__init__(name="pp-watch", daemon=True)
        self.wire = ZmqWire.make(ctx, zmq.DEALER, connect=head, identity=hb_identity(stage),
                                 send_timeout=timeout)
        self.monitor = self.wire.sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.stage = stage
        self.timeout = timeout
        self.interval = interval_for(timeout)
        self.parent = parent
        self.stopped = threading.Event()

    def run(self) -> None:
        seen = time.monotonic()
        connected = False
        last_beat = 0.0
        poller = zmq.Poller()
        poller.register(self.wire.sock, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        while True:
            ready = dict(poller.poll(int(self.interval * 500)))
            now = time.monotonic()
            if self.monitor in ready:
                from zmq.utils.monitor import recv_monitor_message

                ev = recv_monitor_message(self.monitor)["event"]
                if ev == zmq.EVENT_CONNECTED:
                    connected = True
                elif ev == zmq.EVENT_DISCONNECTED and connected:
                    die("pp head gone", {"stage": self.stage, "reason": "its connection closed"})
            if self.wire.sock in ready:
                msg = self.wire.recv(0)
                seen = now
                if msg is not None and msg.kind == "stop":
                    self.stopped.set()
                    return
            if now - last_beat >= self.interval:
                last_beat = now
                try:
                    self.wire.send(Message("hb"))
                except zmq.ZMQError:
                    pass  # the silence check below decides
            if now - seen > self.timeout:
                die("pp head gone", {"stage": self.stage, "reason": "no heartbeat", "silent_s": round(now - seen, 1),
                                     "pp_timeout": self.timeout})
            if self.parent is not None and os.getppid() != self.parent:
                die("pp head gone", {"stage": self.stage, "reason": "parent exited", "parent": self.parent})
