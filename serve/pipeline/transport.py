"""The pipeline's transport seam: messages between the head and its stages.

A `Message` is a kind, a small header (msgpack) and named numpy arrays (activations, tables) that
travel as their own frames, zero-copy on both sides. A `Wire` sends and receives messages with a
deadline; `ZmqWire` is ZeroMQ's (one socket, multipart frames, no framing of our own). A later
device-to-device path (NCCL through `cupy.cuda.nccl`) sits behind the same seam: it would carry the
header as here and move `arrays` GPU to GPU.

    Message        kind, header, arrays
    Wire           the seam: send(msg, to=None), recv(timeout) -> Message | None, close()
    ZmqWire        a Wire over one ZeroMQ socket (ROUTER, DEALER, PUSH or PULL)
    PeerGone       a receive found the peer's connection closed (a ROUTER/DEALER monitor event)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgpack
import numpy as np
import zmq

from kern.errors import KernError

__all__ = ["Message", "PeerGone", "Wire", "ZmqWire", "encode", "decode"]


class PeerGone(KernError, ConnectionError):
    """The other side's connection closed: a pipeline has no use for half of itself."""


@dataclass(slots=True)
class Message:
    kind: str
    head: dict = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    sender: bytes | None = None  # a ROUTER's peer identity, set on receive


def encode(msg: Message) -> list:
    """Frames: [kind+header (msgpack), array buffers...]; arrays go by reference, not copied."""
    specs = []
    bufs = []
    for name, arr in msg.arrays.items():
        arr = np.ascontiguousarray(arr)
        specs.append((name, arr.dtype.str, list(arr.shape)))
        bufs.append(memoryview(arr).cast("B") if arr.size else b"")
    return [msgpack.packb({"kind": msg.kind, "head": msg.head, "arrays": specs}, use_bin_type=True), *bufs]


def decode(frames: list) -> Message:
    """The inverse of `encode`; arrays view the received frames (no copy), read-only."""
    meta = msgpack.unpackb(_bytes(frames[0]), raw=False, strict_map_key=False)
    specs = meta.get("arrays", [])
    if len(specs) != len(frames) - 1:
        raise ValueError(f"message {meta.get('kind')!r} names {len(specs)} arrays but carries {len(frames) - 1} frames")
    arrays = {}
    for (name, dtype, shape), frame in zip(specs, frames[1:]):
        buf = frame.buffer if isinstance(frame, zmq.Frame) else frame
        arrays[name] = np.frombuffer(buf, dtype=np.dtype(dtype)).reshape(shape)
    return Message(meta["kind"], meta.get("head", {}), arrays)


def _bytes(frame) -> bytes:
    return frame.bytes if isinstance(frame, zmq.Frame) else bytes(frame)


class Wire:
    """One endpoint of the pipeline's messages."""

    def send(self, msg: Message, to: bytes | None = None) -> None:
        raise NotImplementedError

    def recv(self, timeout: float) -> Message | None:
        """The next message, or None when `timeout` seconds pass without one."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class ZmqWire(Wire):
    """A Wire over one ZeroMQ socket. A ROUTER addresses peers by identity (`to`) and tags what it
    receives with `sender`; the other kinds have one peer. Sends never block forever: a full queue
    past `send_timeout` seconds raises (zmq.Again)."""

    def __init__(self, sock: zmq.Socket, send_timeout: float = 60.0) -> None:
        self.sock = sock
        self.router = sock.type == zmq.ROUTER
        sock.setsockopt(zmq.SNDTIMEO, int(send_timeout * 1000))
        sock.setsockopt(zmq.LINGER, 0)
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)

    @classmethod
    def make(cls, ctx: zmq.Context, kind: int, *, bind: str | None = None, connect: str | None = None,
             identity: bytes | None = None, send_timeout: float = 60.0) -> "ZmqWire":
        sock = ctx.socket(kind)
        if identity is not None:
            sock.setsockopt(zmq.IDENTITY, identity)
        if kind == zmq.ROUTER:
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a peer that is gone raises
            sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a replacement peer takes over a lost one's identity
        if bind is not None:
            sock.bind(bind)
        if connect is not None:
            sock.connect(connect)
        return cls(sock, send_timeout)

    @property
    def address(self) -> str:
        """The endpoint it is bound to (a `tcp://...:*` bind resolved to its port)."""
        return self.sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def send(self, msg: Message, to: bytes | None = None) -> None:
        frames = encode(msg)
        if self.router:
            if to is None:
                raise ValueError("a ROUTER wire needs `to` (the peer's identity)")
            frames = [to, *frames]
        self.sock.send_multipart(frames, copy=False)

    def recv(self, timeout: float) -> Message | None:
        if not self._poller.poll(max(0, int(timeout * 1000))):
            return None
        frames = self.sock.recv_multipart(copy=False)
        sender = None
        if self.router:
            sender, frames = frames[0].bytes, frames[1:]
        msg = decode(frames)
        msg.sender = sender
        return msg

    def close(self) -> None:
        self.sock.close(linger=0)
