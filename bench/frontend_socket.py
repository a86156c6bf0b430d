"""The HTTP front end over a socket: the server process's CPU time per whole answer and per stream
chunk through uvicorn and the app (`serve.api.app.make_app` under `serve.api.guard`'s limits) with each HTTP
parser, beside a bare asyncio server's on the same socket traffic (it finds each request's end and
writes canned bytes of the same size, a stream's chunks one write a loop turn: the least a
keep-alive request costs a Python event loop), as a ratio.

    python bench/frontend_socket.py [--connections 64] [--seconds 4] [--tokens 256] [--chunks 64] [--rounds 2]

The app's scheduler is bench/frontend.py's stand-in (every request answered at once: a whole answer's
`--tokens` tokens in one update; a stream's `--chunks` one-token updates one a loop turn), so the
figures are the front end's alone: parsing, routing, the body's checks, the handler, the reply's JSON
or SSE framing, the writes (a stream's figure is its CPU over its chunks, its request's share
included). One server process at a time, on CPU 0; the client (raw asyncio,
`--connections` keep-alive connections, each sending its next request on its answer) on CPU 1. The
best of `--rounds` runs of each. Never gates CI.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from frontend import FACTS, Answering, body_of, call_answer  # noqa: E402

END = b"\r\n0\r\n\r\n"  # a chunked answer's last chunk (SSE's JSON never holds a CR)


def _pin(cpu: int) -> None:
    if (os.cpu_count() or 1) > 1 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})


def _app(chunks: int, tokens: int):
    from serve.api.app import make_app
    from serve.client.frontend import RemoteEngine

    return make_app(Answering(chunks, 1) if chunks > 1 else Answering(1, tokens), RemoteEngine(FACTS))


def _serve(sock: socket.socket, which: str, canned: list[bytes], chunks: int, tokens: int) -> None:
    _pin(0)
    import logging

    logging.disable(logging.WARNING)
    if which == "floor":
        asyncio.run(_floor(sock, canned))
        return
    import uvicorn

    from serve.api import guard
    from serve.common import logs

    config = uvicorn.Config(_app(chunks, tokens), log_level="warning", access_log=False, lifespan="off",
                            http=guard.protocol(guard.Limits(), logs.Limiter(), which))
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


async def _floor(sock: socket.socket, canned: list[bytes]) -> None:
    """A bare asyncio server: per request, find the head's end and its content-length, skip the body,
    write `canned`'s pieces, one a loop turn."""
    loop = asyncio.get_running_loop()

    class Bare(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            self.t, self.buf, self.need = transport, b"", None

        def data_received(self, data: bytes) -> None:
            self.buf += data
            while True:
                if self.need is None:
                    end = self.buf.find(b"\r\n\r\n")
                    if end < 0:
                        return
                    head = self.buf[:end].lower()
                    at = head.find(b"content-length:")
                    self.need = end + 4 + (int(head[at + 15:head.find(b"\r\n", at)]) if at >= 0 else 0)
                if len(self.buf) < self.need:
                    return
                self.buf, self.need = self.buf[self.need:], None
                self.write(0)

        def write(self, k: int) -> None:
            self.t.write(canned[k])
            if k + 1 < len(canned):
                loop.call_soon(self.write, k + 1)

    server = await loop.create_server(Bare, sock=sock)
    await server.serve_forever()


async def _load(port: int, connections: int, seconds: float, request: bytes, stream: bool) -> int:
    """Requests answered in `seconds` by `connections` keep-alive connections, each sending its next
    request on its answer."""
    stop = time.perf_counter() + seconds
    done = 0

    async def one() -> None:
        nonlocal done
        r, w = await asyncio.open_connection("127.0.0.1", port)
        while time.perf_counter() < stop:
            w.write(request)
            head = await r.readuntil(b"\r\n\r\n")
            if stream:
                await r.readuntil(END)
            else:
                at = head.lower().find(b"content-length:")
                await r.readexactly(int(head[at + 15:head.find(b"\r\n", at)]))
            done += 1
        w.close()

    await asyncio.gather(*(one() for _ in range(connections)))
    return done


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def canned(chunks: int, tokens: int) -> list[bytes]:
    """What the app answers the bench's request, as uvicorn writes it: a whole answer in one piece, or
    a stream's head and then each chunk framed (chunked transfer encoding), the last with the end."""
    from email.utils import formatdate

    stream = chunks > 1
    headers, parts = asyncio.run(call_answer(_app(chunks, tokens), body_of(stream, tokens)))
    headers += [("date", formatdate(usegmt=True)), ("server", "uvicorn")]  # what uvicorn adds
    if stream:
        headers.append(("transfer-encoding", "chunked"))
    head = ("HTTP/1.1 200 OK\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode()
    if not stream:
        return [head + b"".join(parts)]
    framed = [f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts]
    return [head + framed[0], *framed[1:-1], framed[-1] + END[2:]]


def measure(which: str, connections: int, seconds: float, chunks: int, tokens: int,
            pieces: list[bytes]) -> tuple[float, float]:
    """(server CPU us per answer, answers a second) for one server: "h11", "httptools" or "floor"."""
    body = body_of(chunks > 1, tokens)
    request = (f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
               f"content-length: {len(body)}\r\n\r\n").encode() + body
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    proc = mp.get_context("fork").Process(target=_serve, args=(sock, which, pieces, chunks, tokens), daemon=True)
    proc.start()
    try:
        asyncio.run(_load(port, connections, 1.0, request, chunks > 1))  # warm: imports, first requests
        c0, t0 = _cpu_s(proc.pid), time.perf_counter()
        n = asyncio.run(_load(port, connections, seconds, request, chunks > 1))
        return (_cpu_s(proc.pid) - c0) / n * 1e6, n / (time.perf_counter() - t0)
    finally:
        proc.terminate()
        proc.join(10)
        sock.close()


def main() -> None:
    from tabulate import tabulate

    from serve.api.guard import parser

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=64, help="keep-alive connections at once")
    ap.add_argument("--seconds", type=float, default=4.0, help="each run's length")
    ap.add_argument("--tokens", type=int, default=256, help="tokens in a whole answer")
    ap.add_argument("--chunks", type=int, default=64, help="one-token chunks in a stream (at least 2)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each server; the best is shown")
    args = ap.parse_args()
    if args.chunks < 2:
        ap.error(f"--chunks must be at least 2, got {args.chunks}")
    _pin(1)
    servers = ["floor", "h11"] + (["httptools"] if parser("auto") == "httptools" else [])
    rows = {w: [] for w in servers}
    for chunks, per in ((1, 1), (args.chunks, args.chunks)):
        pieces = canned(chunks, args.tokens)
        for w in servers:
            us, rate = min((measure(w, args.connections, args.seconds, chunks, args.tokens, pieces)
                            for _ in range(args.rounds)), key=lambda r: r[0])
            rows[w] += [us / per, rate]
    floor = rows["floor"]
    print(f"the front end over a socket: {args.connections} keep-alive connections; whole answers of {args.tokens} "
          f"tokens, streams of {args.chunks} one-token chunks; the best of {args.rounds} runs of {args.seconds:g} s")
    print(tabulate([(w if w != "floor" else "bare asyncio (floor)", f"{r[0]:.1f}", f"{floor[0] / r[0]:.2f}",
                     f"{r[2]:.1f}", f"{floor[2] / r[2]:.2f}") for w, r in rows.items()],
                   headers=("server", "CPU us a whole answer", "floor / server", "CPU us a stream chunk",
                            "floor / server"), tablefmt="github"))
    if "httptools" not in rows:
        print("(httptools is not installed here: only h11 measured)")


if __name__ == "__main__":
    main()
