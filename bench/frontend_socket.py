"""The HTTP front end over a socket: the server process's CPU time per whole answer through uvicorn
and the app (`serve.app.make_app` under `serve.guard`'s limits) with each HTTP parser, beside a bare
asyncio server's on the same socket traffic (it finds the request's end and writes a canned answer
of the same size: the least a keep-alive request can cost a Python event loop), as a ratio.

    python bench/frontend_socket.py [--connections 64] [--seconds 4] [--tokens 256] [--rounds 2]

The app's scheduler is bench/frontend.py's stand-in (every request answered at once, its tokens in
one update), so the figures are the front end's alone: parsing, routing, the body's checks, the
handler, the reply's JSON, the write. One server process at a time, on CPU 0; the client (raw
asyncio, `--connections` keep-alive connections, each sending its next request on its answer) on
CPU 1. The best of `--rounds` runs of each. Never gates CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from frontend import FACTS, Answering, body_of  # noqa: E402


def _pin(cpu: int) -> None:
    if (os.cpu_count() or 1) > 1 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})


def _serve(sock: socket.socket, which: str, canned: bytes, tokens: int) -> None:
    _pin(0)
    import logging

    logging.disable(logging.WARNING)
    if which == "floor":
        asyncio.run(_floor(sock, canned))
        return
    import uvicorn

    from serve import guard, logs
    from serve.app import make_app
    from serve.frontend import RemoteEngine

    app = make_app(Answering(1, tokens), RemoteEngine(FACTS))
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            http=guard.protocol(guard.Limits(), logs.Limiter(), which))
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


async def _floor(sock: socket.socket, canned: bytes) -> None:
    """A bare asyncio server: per request, find the head's end and its content-length, skip the body,
    write `canned`."""
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
                self.t.write(canned)

    server = await asyncio.get_running_loop().create_server(Bare, sock=sock)
    await server.serve_forever()


async def _load(port: int, connections: int, seconds: float, request: bytes) -> int:
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


def measure(which: str, connections: int, seconds: float, tokens: int, canned: bytes) -> tuple[float, float]:
    """(server CPU us per answer, answers a second) for one server: "h11", "httptools" or "floor"."""
    body = body_of(False, tokens)
    request = (f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
               f"content-length: {len(body)}\r\n\r\n").encode() + body
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    proc = mp.get_context("fork").Process(target=_serve, args=(sock, which, canned, tokens), daemon=True)
    proc.start()
    try:
        asyncio.run(_load(port, connections, 1.0, request))  # warm: imports, first requests
        c0, t0 = _cpu_s(proc.pid), time.perf_counter()
        n = asyncio.run(_load(port, connections, seconds, request))
        return (_cpu_s(proc.pid) - c0) / n * 1e6, n / (time.perf_counter() - t0)
    finally:
        proc.terminate()
        proc.join(10)
        sock.close()


def canned_answer(tokens: int) -> bytes:
    """What the app answers the bench's request, head and body, byte for byte in size."""
    from serve.app import make_app
    from serve.frontend import RemoteEngine
    from frontend import call_answer

    status_headers, body = asyncio.run(call_answer(make_app(Answering(1, tokens), RemoteEngine(FACTS)), body_of(False, tokens)))
    from email.utils import formatdate

    status_headers += [("date", formatdate(usegmt=True)), ("server", "uvicorn")]  # what uvicorn adds
    head = "HTTP/1.1 200 OK\r\n" + "".join(f"{k}: {v}\r\n" for k, v in status_headers) + "\r\n"
    return head.encode() + body


def main() -> None:
    from tabulate import tabulate

    from serve.guard import parser

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=64, help="keep-alive connections at once")
    ap.add_argument("--seconds", type=float, default=4.0, help="each run's length")
    ap.add_argument("--tokens", type=int, default=256, help="tokens in a whole answer")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each server; the best is shown")
    args = ap.parse_args()
    _pin(1)
    canned = canned_answer(args.tokens)
    servers = ["floor", "h11"] + (["httptools"] if parser("auto") == "httptools" else [])
    best = {w: min((measure(w, args.connections, args.seconds, args.tokens, canned) for _ in range(args.rounds)),
                   key=lambda r: r[0]) for w in servers}
    floor = best["floor"][0]
    print(f"the front end over a socket: {args.connections} keep-alive connections, whole answers of {args.tokens} "
          f"tokens ({len(canned)} bytes), the best of {args.rounds} runs of {args.seconds:g} s")
    print(tabulate([(w if w != "floor" else "bare asyncio (floor)", f"{us:.1f}", f"{floor / us:.2f}", f"{rate:,.0f}")
                    for w, (us, rate) in best.items()],
                   headers=("server", "server CPU us an answer", "floor / server", "answers/s"), tablefmt="github"))
    if "httptools" not in best:
        print("(httptools is not installed here: only h11 measured)")


if __name__ == "__main__":
    main()
