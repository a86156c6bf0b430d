"""A lean closed-loop HTTP client for the load benchmarks (bench/serve_load.py, bench/serve_timeline.py).

One client process runs its streams as asyncio tasks, each over a keep-alive connection of its own,
and speaks just the HTTP/1.1 a `kern serve` answer needs: a head read up to its blank line, then a
`content-length` body or a chunked one (a stream's server-sent events, taken as they arrive). A
request costs such a client some tens of microseconds; a thread of an `httpx.Client` shared by a
process's streams costs several hundred (and the threads contend for one interpreter lock), so at a
round's boundary, when every stream's answer ends at once, the clients' own turnover was as long as the
server's (`--client httpx` keeps the old client, for comparison).

Each request's result is (output tokens, time to first token or None for a whole answer, the gaps per
token between a stream's chunks), as `serve_load.py`'s httpx worker gives them. A status other than
200 raises with the body's first bytes.
"""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlsplit

__all__ = ["HttpError", "worker"]

PATH = "/v1/completions"


class HttpError(RuntimeError):
    """The server answered a status other than 200."""


def _request(host: str, body: dict) -> bytes:
    data = json.dumps(body, separators=(",", ":")).encode()
    return (f"POST {PATH} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\n\r\n").encode() + data


async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    return status, headers


async def _chunks(reader: asyncio.StreamReader):
    """A chunked body's pieces, each as it arrives (the last, empty one ends it)."""
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";", 1)[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers: the blank line
            return
        piece = await reader.readexactly(size + 2)
        yield piece[:-2]


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    return b"".join([p async for p in _chunks(reader)])


async def _events(reader: asyncio.StreamReader, t0: float) -> tuple[int, float | None, list[float]]:
    """A stream's (tokens, time to first token, gaps per token): each `data:` event's token ids,
    timed when the piece holding it arrived."""
    clock, buf = Clock(t0), b""
    async for piece in _chunks(reader):
        now = time.perf_counter()
        buf += piece
        *events, buf = buf.split(b"\n\n")
        for event in events:
            if event.startswith(b"data: {"):
                clock.event(event[6:], now)
    return clock.n, clock.ttft, clock.gaps


class Clock:
    """A stream's tokens and their timing: each `data:` event's token ids counted when it arrived, the
    first's time from the request's start, then each event's gap shared among its tokens."""

    __slots__ = ("t0", "n", "ttft", "gaps", "last")

    def __init__(self, t0: float) -> None:
        self.t0, self.n, self.ttft, self.gaps, self.last = t0, 0, None, [], t0

    def event(self, data: bytes | str, now: float) -> None:
        k = len(json.loads(data)["choices"][0].get("token_ids") or [])
        if k:
            if self.ttft is None:
                self.ttft = now - self.t0
            else:
                self.gaps += [(now - self.last) / k] * k
            self.last = now
            self.n += k


class Connection:
    """One keep-alive connection, reopened when the server closes it."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.netloc = parts.netloc
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: dict) -> tuple[int, float | None, list[float]]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        t0 = time.perf_counter()
        self.writer.write(_request(self.netloc, body))
        status, headers = await _head(self.reader)
        if status != 200:
            raise HttpError(f"{PATH} answered {status}: {(await _body(self.reader, headers))[:300]!r}")
        if body.get("stream"):
            n, ttft, gaps = await _events(self.reader, t0)
            got = (n, ttft or 0.0, gaps)
        else:
            answer = json.loads(await _body(self.reader, headers))
            got = (len(answer["choices"][0]["token_ids"]), None, [])
        if headers.get("connection", "").lower() == "close":
            self.close()
        return got

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def worker(url: str, bodies: list[list[dict]], go, out, client: str = "asyncio") -> None:
    """One client process: stream j sends `bodies[j]` one after another, all streams at once, through
    `client` ("asyncio": this file's; "httpx": one keep-alive `httpx.Client` shared by a thread a
    stream); puts (every request's result, this process's CPU seconds) on `out` once `go` is set and
    all are done."""
    if client not in ("asyncio", "httpx"):
        raise ValueError(f"unknown client {client!r}: asyncio or httpx")
    go.wait()
    c0 = time.process_time()
    results = asyncio.run(_asyncio_run(url, bodies)) if client == "asyncio" else _httpx_run(url, bodies)
    out.put((results, time.process_time() - c0))


async def _asyncio_run(url: str, bodies: list[list[dict]]) -> list:
    results: list = []

    async def stream(conn: Connection, mine: list[dict]) -> None:
        try:
            for body in mine:
                results.append(await conn.post(body))
        finally:
            conn.close()

    await asyncio.gather(*(stream(Connection(url), mine) for mine in bodies))
    return results


def _httpx_run(url: str, bodies: list[list[dict]]) -> list:
    """The httpx client the benchmarks used before this file: a thread a stream, one client."""
    import threading

    import httpx

    client = httpx.Client(base_url=url, timeout=600, limits=httpx.Limits(max_connections=len(bodies),
                                                                          max_keepalive_connections=len(bodies)))
    results: list = []

    def one(body: dict) -> tuple:
        t0 = time.perf_counter()
        if not body.get("stream"):
            r = client.post(PATH, json=body)
            r.raise_for_status()
            return len(r.json()["choices"][0]["token_ids"]), None, []  # no first token to time: the answer comes whole
        clock = Clock(t0)
        with client.stream("POST", PATH, json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    clock.event(line[6:], time.perf_counter())
        return clock.n, clock.ttft or 0.0, clock.gaps

    def stream(mine: list[dict]) -> None:
        for body in mine:
            results.append(one(body))

    threads = [threading.Thread(target=stream, args=(mine,)) for mine in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    return results
