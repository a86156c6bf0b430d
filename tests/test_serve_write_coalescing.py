"""The connection's writes held for one turn of the event loop and sent together (serve/api/transport.py's
`Gentle`, the transport as the HTTP protocol sees it): a whole answer's head and body leave in one send."""

from __future__ import annotations

import asyncio

from serve.api.transport import Gentle


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.events: list[str] = []
        self.closing = False

    def write(self, data) -> None:
        self.writes.append(bytes(data))
        self.events.append("write")

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True
        self.events.append("close")

    def abort(self) -> None:
        self.closing = True
        self.events.append("abort")

    def write_eof(self) -> None:
        self.events.append("eof")

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self.writes))


class _Conn:
    def __init__(self, loop) -> None:
        self.loop = loop

    def linger(self) -> bool:
        return False


def _run(body):
    async def main():
        t = _Transport()
        g = Gentle(t, _Conn(asyncio.get_running_loop()))
        await body(t, g)
        return t

    return asyncio.run(main())


def test_what_one_turn_writes_leaves_in_one_send_in_order():
    """A turn's writes (a head, a body) reach the transport as one write, in order, at the next turn;
    the buffer's size counts them meanwhile; the next turn's writes are a send of their own."""
    async def body(t, g):
        g.write(b"HTTP/1.1 200 OK\r\n\r\n")
        g.write(b"")  # nothing: no send
        g.write(b"{}")
        assert t.writes == [] and g.get_write_buffer_size() == 21
        await asyncio.sleep(0)
        assert t.writes == [b"HTTP/1.1 200 OK\r\n\r\n{}"]
        g.writelines([b"a", b"b"])
        await asyncio.sleep(0)

    t = _run(body)
    assert t.writes == [b"HTTP/1.1 200 OK\r\n\r\n{}", b"ab"]


def _held_then(act):
    """A turn that writes an answer, then `act(transport, gentle)`; the turn after."""
    async def body(t, g):
        g.write(b"answer")
        act(t, g)
        await asyncio.sleep(0)

    return body


def _closing_under(t, g) -> None:
    t.closing = True


def test_closing_sends_what_is_held_first_and_abort_drops_it():
    """close() and write_eof() send the held bytes before they act (an answer then a close loses
    nothing); abort() drops them; nothing is sent on a transport already closing."""
    closed = _run(_held_then(lambda t, g: g.close()))
    assert closed.events == ["write", "close"] and closed.writes == [b"answer"]
    assert _run(_held_then(lambda t, g: g.write_eof())).events == ["write", "eof"]
    aborted = _run(_held_then(lambda t, g: g.abort()))
    assert aborted.events == ["abort"] and aborted.writes == []
    assert _run(_held_then(_closing_under)).writes == []
