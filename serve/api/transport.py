"""A connection's transport as uvicorn's HTTP protocol sees it (serve/api/guard.py puts it in place):
writes held for one turn of the event loop and sent together, and a gentle close while a request's
body is still arriving."""

from __future__ import annotations

__all__ = ["LINGER_BODY_S", "Gentle"]

LINGER_BODY_S = 5.0  # a connection answered before its body arrived drains it this long at most


class Gentle:
    """The transport as the protocol sees it, with two changes.

    Writes are held until the event loop's next turn and leave together (`_flush`): uvicorn writes a
    response's head and its body each at once, so a whole answer took two sends and woke its client
    twice; now one send carries all one turn of the loop wrote (a stream's chunks that a turn made
    too). Closing, shutting for writing and the buffer's size see what is held.

    `close()` while the request's body is still arriving (a 413 answered before reading it) shuts our
    side for writing and drops what the client still sends, until it closes or `LINGER_BODY_S` passes:
    closing with unread data would send a reset, which can reach the client before it reads the
    answer."""

    def __init__(self, transport, conn) -> None:
        self._t = transport
        self._conn = conn
        self._closing = False
        self._held: list = []

    def __getattr__(self, name):
        return getattr(self._t, name)

    def write(self, data) -> None:
        if not data:
            return
        if not self._held:
            self._conn.loop.call_soon(self._flush)
        self._held.append(data)

    def writelines(self, lines) -> None:
        for data in lines:
            self.write(data)

    def _flush(self) -> None:
        held, self._held = self._held, []
        if held and not self._t.is_closing():
            self._t.write(held[0] if len(held) == 1 else b"".join(held))

    def get_write_buffer_size(self) -> int:
        return self._t.get_write_buffer_size() + sum(map(len, self._held))

    def write_eof(self) -> None:
        self._flush()
        self._t.write_eof()

    def abort(self) -> None:
        self._held.clear()
        self._t.abort()

    def is_closing(self) -> bool:
        return self._closing or self._t.is_closing()

    def close_now(self) -> None:
        self._closing = True
        self._flush()
        self._t.close()

    def close(self) -> None:
        if self._closing or self._t.is_closing():
            return
        self._closing = True
        self._flush()
        if not self._conn.linger():
            self._t.close()
            return
        self._t.write_eof()
        self._t.resume_reading()
        self._conn.loop.call_later(LINGER_BODY_S, self._t.close)
