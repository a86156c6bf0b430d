"""Bounds on what clients can hold: connections, read deadlines, body and /tokenize sizes (the flags
of `kern serve`), and the HTTP protocol that enforces the connection-level ones.

uvicorn (h11) has a keep-alive idle timeout but no deadline for reading a request's headers or body,
and it accepts every connection the kernel hands it. `protocol(limits, limit_log)` returns its h11
protocol with three additions:

- over `max_connections` open connections, a new one is answered a 503 at once and closed (the file
  descriptors stay bounded, whatever the clients do);
- a request's headers must arrive within `header_timeout` seconds of its first byte (or of the
  connection opening), else a 408 and the connection closes;
- its body must arrive within `body_timeout` seconds of its headers, else a 408 (when nothing was
  answered yet) and the connection closes; the handler reading it sees a disconnect.

Each closing goes through the per-reason log limiter, never one line per connection.
"""

from __future__ import annotations

import asyncio
import json
import resource
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from serve.logs import Limiter

__all__ = ["Limits", "fit_descriptors", "protocol", "raw_response"]

LINGER_S = 1.0  # a refused connection is read and dropped this long, so the client sees its 503


@dataclass(frozen=True, slots=True)
class Limits:
    max_connections: int = 1000
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keep_alive: float = 5.0
    max_body_bytes: int = 4 << 20
    max_tokenize_tokens: int = 1 << 16
    drain_timeout: float = 30.0

    def check(self) -> None:
        """ValueError naming the flag when a value cannot work."""
        for flag, v in (("--max-connections", self.max_connections), ("--max-body-bytes", self.max_body_bytes),
                        ("--max-tokenize-tokens", self.max_tokenize_tokens)):
            if v < 1:
                raise ValueError(f"{flag} must be at least 1, got {v}")
        for flag, v in (("--header-timeout", self.header_timeout), ("--body-timeout", self.body_timeout),
                        ("--keep-alive", self.keep_alive), ("--drain-timeout", self.drain_timeout)):
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


def protocol(limits: Limits, limit_log: Limiter) -> type[H11Protocol]:
    """uvicorn's h11 protocol bounded by `limits` (pass it as `uvicorn.Config(http=...)`)."""

    class Guarded(H11Protocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            self._deadline: asyncio.TimerHandle | None = None
            self._deadline_for: str | None = None
            self._refused = False
            super().connection_made(transport)
            open_now = len(self.connections)
            if open_now > limits.max_connections:
                self._refuse(open_now)
                return
            self._arm("header_timeout", limits.header_timeout)

        def _refuse(self, open_now: int) -> None:
            self._refused = True
            limit_log("connection refused", "WARN", reason="too_many_connections", open=open_now,
                      max_connections=limits.max_connections)
            self.transport.write(raw_response(
                503, "Service Unavailable", f"the server holds its limit of {limits.max_connections} connections "
                "(--max-connections); retry later", "too_many_connections", "server_error"))
            if open_now > limits.max_connections + max(64, limits.max_connections // 4):
                self.transport.close()  # far over: the descriptor back at once
                return
            # close our side for writing and drop what the client still sends, so it reads the 503
            # instead of a reset; then let go
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            super().data_received(data)
            self._follow()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._follow()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _follow(self) -> None:
            """Arm the deadline that fits where the request being read stands."""
            if self.transport.is_closing():
                self._disarm()
                return
            state = self.conn.their_state
            if state is h11.IDLE:
                if self.conn.trailing_data[0]:  # part of the next request's head is in
                    self._arm("header_timeout", limits.header_timeout)
                elif self._deadline_for == "body_timeout":
                    self._disarm()  # idle between requests: uvicorn's keep-alive timer takes over
            elif state is h11.SEND_BODY:
                self._arm("body_timeout", limits.body_timeout)
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
            limit_log("connection closed", "WARN", reason=reason, seconds=seconds)
            cycle = self.cycle if reason == "body_timeout" else None
            if cycle is None or not cycle.response_started:
                flag = "--header-timeout" if reason == "header_timeout" else "--body-timeout"
                self.transport.write(raw_response(408, "Request Timeout", f"the request's {what} did not arrive "
                                                  f"within {seconds:g} s ({flag})", reason))
            if cycle is not None:  # the handler reading the body sees a disconnect now, and answers nothing
                cycle.disconnected = True
                cycle.message_event.set()
            self.transport.close()

    return Guarded
