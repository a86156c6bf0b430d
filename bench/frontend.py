"""The HTTP front end's own CPU cost, in process: microseconds per stream chunk and per whole answer
through the app (`serve.api.app.make_app`: routing, the body's checks, the handler, replies, SSE
framing, metrics), beside the least each can cost: serializing what is sent (a chunk's or an
answer's JSON and its framing) and nothing else.

    python bench/frontend.py [--streams 64] [--chunks 64] [--requests 2000] [--rounds 3]

A stand-in scheduler answers every request at once from the event loop (as the engine core's
messages arrive there under `--frontend-process`): a stream gets `--chunks` updates of one token,
one a loop turn, so each makes a chunk of its own (no folding), `--streams` streams at once; a whole
answer gets its `--tokens` tokens in one update. ASGI's `send` is a list append: uvicorn's HTTP framing and the
socket are not in the figures (bench/frontend_socket.py has them, under each HTTP parser; so does the
server's `--frontend-process` CPU a token in bench/serve_load.py). The best of `--rounds` runs of each. Never gates CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serve.api.app import make_app  # noqa: E402
from serve.client.frontend import RemoteEngine  # noqa: E402
from serve.core.request import Delivery, Done, Update  # noqa: E402

FACTS = {"facts": {}, "model": "toy-paged", "rows": 1, "reach": 4096, "pages": 4096, "unit": 16,
         "max_request_tokens": 4096, "faults": [], "lined": False, "backend": "cpu", "max_seqs": 256, "chunk": 2048}


class Answering:
    """A scheduler that answers at once: `chunks` updates of `per` tokens each, one a loop turn."""

    delivery = Delivery.HELD  # updates on the event loop, as a front end of its own process gets them
    shared = None  # the only front end: no metrics shared with others (as `serve.core.scheduler.Scheduler`)

    def measure(self, meter) -> None:
        pass

    def __init__(self, chunks: int, per: int = 1) -> None:
        self.chunks, self.per = chunks, per
        self.tokens = [[65 + (k * per + j) % 26 for j in range(per)] for k in range(chunks)]  # as msgpack hands them
        self.n = 0

    def name(self) -> str:
        self.n += 1
        return f"req-{self.n}"

    def submit(self, req) -> None:
        loop = asyncio.get_running_loop()

        def give(k: int) -> None:
            last = k == self.chunks - 1
            req.send(Update(list(self.tokens[k]), Done("length", 0, None) if last else None))
            if not last:
                loop.call_soon(give, k + 1)

        loop.call_soon(give, 0)

    def abort(self, req) -> None:
        pass


def scope_of(body: bytes) -> dict:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
            "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
            "headers": [(b"host", b"x"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())], "state": {}}


async def messages(app, body: bytes) -> list[dict]:
    """One request through the app: the ASGI messages it sent."""
    sent = [False]
    out: list = []

    async def receive():
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)  # no hang-up

    async def send(message) -> None:
        out.append(message)

    await app(scope_of(body), receive, send)
    return out


async def call(app, body: bytes) -> int:
    """One request through the app; the number of body parts it sent."""
    return sum(1 for m in await messages(app, body) if m["type"] == "http.response.body" and m.get("body"))


async def call_answer(app, body: bytes) -> tuple[list[tuple[str, str]], list[bytes]]:
    """One request through the app: its answer's headers and body parts."""
    out = await messages(app, body)
    headers = [(k.decode(), v.decode()) for m in out if m["type"] == "http.response.start" for k, v in m["headers"]]
    return headers, [m["body"] for m in out if m["type"] == "http.response.body" and m.get("body")]


def body_of(stream: bool, tokens: int) -> bytes:
    return json.dumps({"model": "toy-paged", "prompt": list(range(32)), "max_tokens": tokens, "temperature": 0,
                       "ignore_eos": True, "return_token_ids": True, "stream": stream}).encode()


def streamed(streams: int, chunks: int, rounds: int) -> tuple[float, int]:
    """(us per chunk, the chunks one stream sent), the best of `rounds`."""
    app = make_app(Answering(chunks), RemoteEngine(FACTS))
    body = body_of(True, chunks)
    best, parts = float("inf"), 0

    async def run() -> tuple[float, int]:
        t0 = time.perf_counter()
        got = await asyncio.gather(*(call(app, body) for _ in range(streams)))
        return (time.perf_counter() - t0) / sum(got) * 1e6, got[0]

    asyncio.run(run())  # warm
    for _ in range(rounds):
        us, parts = asyncio.run(run())
        best = min(best, us)
    return best, parts


def whole(requests: int, tokens: int, rounds: int) -> float:
    """Microseconds per whole answer (`tokens` tokens in one update), the best of `rounds`."""
    app = make_app(Answering(1, tokens), RemoteEngine(FACTS))
    body = body_of(False, tokens)

    async def run() -> float:
        t0 = time.perf_counter()
        for _ in range(requests):
            await call(app, body)
        return (time.perf_counter() - t0) / requests * 1e6

    asyncio.run(run())
    return min(asyncio.run(run()) for _ in range(rounds))


def floor_chunk(n: int = 20000) -> float:
    """The least a chunk costs: its JSON (a middle chunk of a completion stream) and SSE framing."""
    chunk = {"id": "cmpl-req-1", "object": "text_completion", "created": 1700000000, "model": "toy-paged",
             "choices": [{"index": 0, "finish_reason": None, "logprobs": None, "text": "A", "stop_reason": None,
                          "token_ids": [65]}]}
    t0 = time.perf_counter()
    for _ in range(n):
        (f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n").encode()
    return (time.perf_counter() - t0) / n * 1e6


def floor_whole(tokens: int, n: int = 5000) -> float:
    """The least a whole answer costs: its JSON."""
    ids = [65 + k % 26 for k in range(tokens)]
    answer = {"id": "cmpl-req-1", "object": "text_completion", "created": 1700000000, "model": "toy-paged",
              "choices": [{"index": 0, "finish_reason": "length", "logprobs": None, "text": bytes(ids).decode(),
                           "stop_reason": None, "token_ids": ids, "prompt_token_ids": list(range(32))}],
              "usage": {"prompt_tokens": 32, "completion_tokens": tokens, "total_tokens": 32 + tokens},
              "kern": {"request_id": "req-1", "cache_tier": None, "snapshot": "none", "woken": False}}
    t0 = time.perf_counter()
    for _ in range(n):
        json.dumps(answer, separators=(",", ":")).encode()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> None:
    from tabulate import tabulate

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=64, help="streams at once")
    ap.add_argument("--chunks", type=int, default=64, help="one-token updates each stream gets")
    ap.add_argument("--requests", type=int, default=2000, help="whole answers, one after another")
    ap.add_argument("--tokens", type=int, default=256, help="tokens in a whole answer")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import logging

    logging.disable(logging.WARNING)
    chunk, parts = streamed(args.streams, args.chunks, args.rounds)
    answer = whole(args.requests, args.tokens, args.rounds)
    fc, fw = floor_chunk(), floor_whole(args.tokens)
    print(f"the front end in process: {args.streams} streams x {args.chunks} one-token updates ({parts} body parts "
          f"each); {args.requests} whole answers of {args.tokens} tokens")
    print(tabulate([("a stream chunk", f"{chunk:.1f}", f"{fc:.1f}", f"{fc / chunk:.2f}"),
                    ("a whole answer", f"{answer:.1f}", f"{fw:.1f}", f"{fw / answer:.2f}")],
                   headers=("us each", "through the app", "its JSON alone (floor)", "floor / app"), tablefmt="github"))


if __name__ == "__main__":
    main()
