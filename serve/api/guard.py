"""Bounds on what clients can hold: connections, read deadlines, body and /tokenize sizes (the flags
of `kern serve`), and the HTTP protocol that enforces the connection-level ones.

uvicorn has a keep-alive idle timeout but no deadline for reading a request's headers or body, and it
accepts every connection the kernel hands it. `protocol(limits, limit_log, http)` returns its HTTP
protocol (httptools' C parser where installed, or h11's pure Python one: `--http`) with these additions:

- over `max_connections` open connections, or over `max_per_client` from one peer address, a new one is
  answered a 503 at once and closed (the file descriptors stay bounded, whatever the clients do);
  refused connections do not count against the caps while they linger;
- at `max_connections`, a new connection from a peer that holds fewer than another sheds that other
  peer's longest-silent connection (no request in progress: not yet a byte, or idle between requests)
  instead of being refused, so one client cannot hold everyone else out;
- once the server shuts down (`going_away`), a new connection is answered a 503 `server_shutting_down`
  and closed, and one silent between requests is held open until the server lets go, a request on it
  answered so: no request that reached the server is met with a reset;
- a connection closed while its request's body is still arriving (a 413) is closed gently: our side
  is shut for writing and what the client still sends is read and dropped for up to `serve.api.transport.LINGER_BODY_S`,
  so a client that sends its whole body before reading gets the answer, not a reset;
- a request's headers must arrive within `header_timeout` seconds of its first byte (or of the
  connection opening), else a 408 and the connection closes;
- its body must arrive within `body_timeout` seconds of its headers, else a 408 (when nothing was
  answered yet) and the connection closes; the handler reading it sees a disconnect;
- its head is at most `HEAD_LIMIT` bytes (h11 bounds it itself, a 400; under httptools a 431 here).

Each closing goes through the per-reason log limiter, never one line per connection.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from serve.api.transport import Gentle
from serve.common.logs import Limiter

__all__ = ["Limits", "Peers", "fit_descriptors", "parser", "protocol", "raw_response"]

LINGER_S = 1.0  # a refused connection is read and dropped this long, so the client sees its 503
HEAD_LIMIT = 16 * 1024  # a request's head at most, bytes, unless uvicorn's config says otherwise (h11's default)


@dataclass(frozen=True, slots=True)
class Limits:
    max_connections: int = 1000
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keep_alive: float = 5.0
    max_body_bytes: int = 4 << 20
    max_tokenize_tokens: int = 1 << 16
    drain_timeout: float = 30.0
    max_per_client: int = 256
    max_tokens_ceiling: int | None = None  # a larger max_tokens is refused with a 400 (None: no ceiling)
    stuck_after: float = 10.0  # /health is a 503 once the engine core's iteration has run this long

    def check(self) -> None:
        """ValueError naming the flag when a value cannot work."""
        for flag, v in (("--max-connections", self.max_connections), ("--max-body-bytes", self.max_body_bytes),
                        ("--max-connections-per-client", self.max_per_client),
                        ("--max-tokenize-tokens", self.max_tokenize_tokens)):
            if v < 1:
                raise ValueError(f"{flag} must be at least 1, got {v}")
        for flag, v in (("--header-timeout", self.header_timeout), ("--body-timeout", self.body_timeout),
                        ("--keep-alive", self.keep_alive), ("--drain-timeout", self.drain_timeout),
                        ("--stuck-after", self.stuck_after)):
            if not v > 0:
                raise ValueError(f"{flag} must be a positive number of seconds, got {v}")


def fit_descriptors(limits: Limits, spare: int = 256) -> int:
    """Raise the process's open-file soft limit so `max_connections` (and the refused ones lingering
    over it) fit with `spare` left; ValueError naming the flag when the hard limit is too low.
    Returns the soft limit now in force."""
    need = limits.max_connections + max(64, limits.max_connections // 4) + spare
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            room = hard - spare - max(64, hard // 5)
            raise ValueError(f"--max-connections {limits.max_connections} needs {need} open files, but this "
                             f"process may open at most {hard} (ulimit -Hn); use at most {max(room, 1)}")
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        except (ValueError, OSError) as exc:
            raise ValueError(f"--max-connections {limits.max_connections} needs {need} open files, but this process "
                             f"may not open that many ({exc}); use a smaller value") from None
        soft = need
    return soft


def raw_response(status: int, reason: str, message: str, code: str, type: str = "invalid_request_error") -> bytes:
    """A whole HTTP/1.1 response with an OpenAI-style error body, closing the connection."""
    body = json.dumps({"error": {"message": message, "type": type, "param": None, "code": code}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n\r\n").encode()
    return head + body


def protocol(limits: Limits, limit_log: Limiter, http: str = "auto") -> type:
    """uvicorn's HTTP protocol bounded by `limits` (pass it as `uvicorn.Config(http=...)`): `http`
    "httptools" (its C parser), "h11" (pure Python), or "auto", httptools where it is installed.
    ValueError naming the flag when httptools is asked for and missing."""
    base = GuardedH11 if parser(http) == "h11" else _httptools_guarded()
    spare = max(64, limits.max_connections // 4)  # refused connections that may linger at once
    return type("Guarded", (base,), {"limits": limits, "limit_log": staticmethod(limit_log), "peers": Peers(),
                                     "spare": spare})


def parser(http: str) -> str:
    """The HTTP parser `--http` names ("auto": httptools where it is installed, else h11)."""
    if http not in ("auto", "httptools", "h11"):
        raise ValueError(f"--http must be auto, httptools or h11, got {http!r}")
    if http == "h11":
        return "h11"
    try:
        import httptools  # noqa: F401
    except ImportError:
        if http == "httptools":
            raise ValueError("--http httptools: the httptools package is not installed (pip install httptools), "
                             "or use --http h11") from None
        return "h11"
    return "httptools"


class Guarded:
    """The connection limits over one of uvicorn's HTTP protocols (a subclass puts it first, then the
    protocol); `protocol()` binds a subclass to one server's limits, its log limiter and the count of
    who holds what (class attributes, set once). The subclass says where the request being read stands
    (`_reading`: "idle", "head", "body" or "" when the whole request is in) and whether the connection
    is silent between requests (`_silent`)."""

    limits: Limits
    limit_log: Limiter
    peers: "Peers"
    spare: int
    going_away = False  # the server is shutting down: `serve.cli` sets it (on this bound class) as it starts

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_for: str | None = None
        self._refused = False
        self._lingering = False
        self._going = False  # idle when the shutdown began: held open, a request on it answered 503
        self._peer = _peer_of(transport)
        _no_delay(transport)
        super().connection_made(Gentle(transport, self))
        if self.going_away:
            self._refuse("server_shutting_down", self.peers.total, "the server is shutting down")
            return
        held = self.peers.count.get(self._peer, 0)
        if held >= self.limits.max_per_client:
            self._refuse("too_many_connections_from_client", held, f"this client ({self._peer}) holds the server's "
                         f"limit of {self.limits.max_per_client} connections per client (--max-connections-per-client)")
            return
        if self.peers.total >= self.limits.max_connections and not self.peers.shed_for(self._peer, self.limit_log):
            self._refuse("too_many_connections", self.peers.total, f"the server holds its limit of "
                         f"{self.limits.max_connections} connections (--max-connections)")
            return
        self.peers.admit(self)
        self._arm("header_timeout", self.limits.header_timeout)

    def _refuse(self, reason: str, open_now: int, message: str) -> None:
        self._refused = True
        self._disarm()
        self.limit_log("connection refused", "WARN", reason=reason, open=open_now, max_connections=self.limits.max_connections,
                  max_per_client=self.limits.max_per_client)
        self.transport.write(raw_response(503, "Service Unavailable", message + "; retry later", reason,
                                          "server_error"))
        if self.peers.lingering >= self.spare:
            self.transport.close()  # far over: the descriptor back at once
            return
        # close our side for writing and drop what the client still sends, so it reads the 503
        # instead of a reset; then let go
        self.peers.lingering += 1
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)

    def shutdown(self) -> None:
        """The server shuts down: a connection silent between requests is held open until the server
        lets go (`let_go`), a request arriving on it answered 503 `server_shutting_down` (closing it
        now could reset a request already on its way); the rest as uvicorn does."""
        if self._refused or self._lingering or not self._silent() or self.transport.is_closing():
            super().shutdown()
            return
        self._going = True
        self._disarm()
        keep_alive = getattr(self, "timeout_keep_alive_task", None)
        if keep_alive is not None:
            keep_alive.cancel()

    def let_go(self) -> None:
        """The server's last act: close a connection held since the shutdown."""
        if self._going and not self._refused:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._going and not self._refused:
            self._refuse("server_shutting_down", self.peers.total, "the server is shutting down")
        if self._refused or self._lingering:
            return  # read and dropped
        self.peers.busy(self)
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()
        if self._silent():
            self.peers.idle(self)

    def connection_lost(self, exc) -> None:
        self._disarm()
        if self._lingering:
            self.peers.lingering -= 1
        self.peers.gone(self)
        super().connection_lost(exc)

    def linger(self) -> bool:
        """Close gently when the request's body is still arriving (see `serve.api.transport.Gentle.close`)."""
        if self._refused or self._lingering or self._reading() != "body":
            return False
        if self.peers.lingering >= self.spare or not self.transport.can_write_eof():
            return False
        self._lingering = True
        self.peers.lingering += 1
        self._disarm()
        self.peers.gone(self)  # no longer holds a place: it only drains
        return True

    def _follow(self) -> None:
        """Arm the deadline that fits where the request being read stands."""
        if self.transport.is_closing():
            self._disarm()
            return
        state = self._reading()
        if state == "head":  # part of a request's head is in
            self._arm("header_timeout", self.limits.header_timeout)
        elif state == "idle":
            if self._deadline_for == "body_timeout":
                self._disarm()  # idle between requests: uvicorn's keep-alive timer takes over
        elif state == "body":
            self._arm("body_timeout", self.limits.body_timeout)
        else:
            self._disarm()

    def _arm(self, reason: str, seconds: float) -> None:
        if self._deadline_for == reason:
            return  # the deadline counts from the first byte, not the last
        self._disarm()
        self._deadline_for = reason
        self._deadline = self.loop.call_later(seconds, self._expired, reason, seconds)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self._deadline_for = None

    def _expired(self, reason: str, seconds: float) -> None:
        self._deadline = self._deadline_for = None
        if self.transport.is_closing():
            return
        what = "headers" if reason == "header_timeout" else "body"
        self.limit_log("connection closed", "WARN", reason=reason, seconds=seconds)
        cycle = self.cycle if reason == "body_timeout" else None
        if cycle is None or not cycle.response_started:
            flag = "--header-timeout" if reason == "header_timeout" else "--body-timeout"
            self.transport.write(raw_response(408, "Request Timeout", f"the request's {what} did not arrive "
                                              f"within {seconds:g} s ({flag})", reason))
        if cycle is not None:  # the handler reading the body sees a disconnect now, and answers nothing
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close_now()  # the client stopped sending: nothing to drain


def _no_delay(transport) -> None:
    """TCP_NODELAY on the connection: a response goes out as its head and then its body (an SSE
    stream as one write per batch), and with Nagle's algorithm on each second write waits for the
    client's delayed ACK of the first, 40 ms on Linux, on every request."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass  # a socket already closing


def _peer_of(transport) -> str:
    """The peer's address without its port: what the per-client cap counts by."""
    name = transport.get_extra_info("peername")
    if isinstance(name, (tuple, list)) and name:
        return str(name[0])
    return "local"  # a Unix socket, or unknown


class Peers:
    """The admitted connections, counted per peer address, and each peer's silent ones (no request in
    progress), oldest silent first: what a newcomer at the total cap may shed."""

    def __init__(self) -> None:
        self.total = 0
        self.lingering = 0  # refused or answered connections draining before their close
        self.count: dict[str, int] = {}
        self.silent: dict[str, dict] = {}  # peer -> {protocol: None}, in the order they fell silent
        self._held: set = set()

    def admit(self, conn) -> None:
        self._held.add(conn)
        self.total += 1
        self.count[conn._peer] = self.count.get(conn._peer, 0) + 1
        self.idle(conn)  # silent until its first byte

    def idle(self, conn) -> None:
        if conn in self._held:
            q = self.silent.setdefault(conn._peer, {})
            q.pop(conn, None)
            q[conn] = None

    def busy(self, conn) -> None:
        q = self.silent.get(conn._peer)
        if q is not None and q.pop(conn, 0) is None and not q:
            del self.silent[conn._peer]

    def gone(self, conn) -> None:
        if conn not in self._held:
            return
        self._held.discard(conn)
        self.busy(conn)
        self.total -= 1
        n = self.count[conn._peer] - 1
        if n:
            self.count[conn._peer] = n
        else:
            del self.count[conn._peer]

    def shed_for(self, peer: str, limit_log) -> bool:
        """Close the longest-silent connection of the peer holding the most connections, when it holds
        more than `peer` would after one more; whether one was closed (the newcomer takes its place)."""
        mine = self.count.get(peer, 0) + 1
        for other, q in sorted(self.silent.items(), key=lambda kv: -self.count.get(kv[0], 0)):
            if self.count.get(other, 0) <= mine:
                return False
            victim = next(iter(q))
            limit_log("connection shed", "WARN", reason="silent_under_pressure", peer=other,
                      held=self.count.get(other, 0))
            self.gone(victim)
            victim._disarm()
            victim.transport.close()
            return True
        return False


class GuardedH11(Guarded, H11Protocol):
    """The limits over uvicorn's h11 protocol: where a request stands is h11's state of the client."""

    def _reading(self) -> str:
        state = self.conn.their_state
        if state is h11.IDLE:
            return "head" if self.conn.trailing_data[0] else "idle"
        return "body" if state is h11.SEND_BODY else ""

    def _silent(self) -> bool:
        return self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]


def _httptools_guarded() -> type:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpTools(Guarded, HttpToolsProtocol):
        """The limits over uvicorn's httptools protocol: where a request stands is followed through
        the parser's callbacks. A request's head is bounded as h11 bounds it (uvicorn's
        `h11_max_incomplete_event_size`, 16 KiB): llhttp itself sets no limit, so a head that grows
        past it is answered a 431 and the connection closes."""

        _phase = "idle"
        _begun = _answered = _head_bytes = 0

        def _reading(self) -> str:
            return self._phase

        def _silent(self) -> bool:
            return self._phase == "idle" and self._begun == self._answered

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._phase == "head" and not self._refused and not self._lingering:
                self._head_bytes += len(data)
                if self._head_bytes > self._head_limit() and not self.transport.is_closing():
                    self._head_too_large()

        def _head_limit(self) -> int:
            return self.config.h11_max_incomplete_event_size or HEAD_LIMIT

        def _head_too_large(self) -> None:
            limit = self._head_limit()
            self.limit_log("connection closed", "WARN", reason="header_too_large", bytes=self._head_bytes)
            self._disarm()
            self.transport.write(raw_response(431, "Request Header Fields Too Large", f"the request's head is "
                                              f"over {limit} bytes", "header_too_large"))
            self.transport.close_now()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._begun += 1
            self._phase, self._head_bytes = "head", 0

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._phase = "body"

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._phase = ""

        def on_response_complete(self) -> None:
            self._answered += 1
            if self._phase == "" and self._begun == self._answered:
                self._phase = "idle"
            super().on_response_complete()

    return GuardedHttpTools


HANDSHAKE_S = 0.02  # for a handshake under way when new ones were stopped to end in the backlog (loopback: microseconds)
_SO_ATTACH_FILTER = 26  # Linux
# a classic BPF socket filter over the TCP header: keep a segment with ACK set, drop a bare SYN
_NO_NEW_SYN = ((0x30, 0, 0, 13),  # ldb [13]: the flags byte
               (0x45, 2, 0, 0x10),  # jset ACK: keep
               (0x45, 0, 1, 0x02),  # jset SYN: drop, else keep
               (0x06, 0, 0, 0),  # ret 0: drop
               (0x06, 0, 0, 0xFFFFFFFF))  # ret all: keep


def stop_handshakes(sock) -> bool:
    """Let listening socket `sock` start no new TCP handshake (a filter dropping bare SYNs: their
    clients retry, and are refused once the socket is closed), while those under way complete into
    its backlog. False where it cannot (not Linux, or the filter refused): the caller closes as before."""
    import ctypes
    import socket
    import sys

    if not sys.platform.startswith("linux"):
        return False

    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Insn))]

    insns = (Insn * len(_NO_NEW_SYN))(*_NO_NEW_SYN)
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, bytes(Prog(len(_NO_NEW_SYN), insns)))
    except OSError:
        return False
    return True
