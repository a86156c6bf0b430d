"""The contract's HTTP API (docs/engine-contract.md) in front of the engine: /health,
/kern/capabilities, /tokenize and /v1/completions (whole, or streamed as server-sent events), one
thread per connection."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .engine import Engine, Refused

WAIT_S = 600.0


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the gate keeps up to 64 requests in flight

    def __init__(self, addr, engine: Engine, model: str, ready):
        super().__init__(addr, Handler)
        self.engine, self.model, self.ready = engine, model, ready


class BadRequest(ValueError):
    pass


def prompt_ids(body: dict) -> list[int]:
    p = body.get("prompt")
    if isinstance(p, str):
        return list(p.encode("utf-8"))
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], list):
        p = p[0]
    if not isinstance(p, list) or not p:
        raise BadRequest("'prompt' must be a non-empty string or list of token ids")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= 256 for t in p):
        raise BadRequest("'prompt' token ids must be integers 0..256")
    return p


def max_tokens_of(body: dict) -> int:
    m = body.get("max_tokens", 16)
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise BadRequest("'max_tokens' must be a positive integer")
    return m


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, fmt, *args):  # the gate keeps our log; one line per request is noise
        pass

    def reply(self, code: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, code: int, msg: str) -> None:
        self.reply(code, {"error": {"message": msg, "type": "invalid_request_error", "code": code}})

    def do_GET(self):
        if self.path == "/health":
            return self.reply(200, {"status": "ok"}) if self.server.ready.is_set() else self.error(503, "loading")
        if self.path == "/kern/capabilities":
            return self.reply(200, {"contract": 1, "engine": {"name": "paged-engine", "version": "0.1"},
                                    "capabilities": ["text", "cached-tokens", "stream"],
                                    "facts": {"page": self.server.engine.B,
                                              "families": ["paged", "lined", "attn"]}})
        self.error(404, f"no route GET {self.path}")

    def body(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        try:
            obj = json.loads(self.rfile.read(n) or b"null")
        except ValueError as e:
            raise BadRequest(f"the body is not JSON: {e}") from None
        if not isinstance(obj, dict):
            raise BadRequest("the body must be a JSON object")
        return obj

    def do_POST(self):
        try:
            body = self.body()
            if self.path == "/tokenize":
                return self.reply(200, {"tokens": prompt_ids(body)})
            if self.path == "/v1/completions":
                return self.complete(body)
            self.error(404, f"no route POST {self.path}")
        except (BadRequest, Refused) as e:
            self.error(400, str(e))

    def complete(self, body: dict) -> None:
        if body.get("model") not in (None, self.server.model):
            return self.error(404, f"model {body.get('model')!r} is not served here (this is {self.server.model!r})")
        ids = prompt_ids(body)
        seq = self.server.engine.submit(ids, max_tokens_of(body))
        if body.get("stream"):
            return self.stream(ids, seq)
        if not seq.done.wait(WAIT_S) or seq.error:
            return self.error(500, f"the engine failed the request: {seq.error or 'timed out'}")
        self.reply(200, {
            "object": "text_completion", "model": self.server.model,
            "choices": [{"index": 0, "token_ids": seq.out, "prompt_token_ids": ids,
                         "finish_reason": seq.finish,
                         "text": bytes(t for t in seq.out if t < 256).decode("utf-8", "replace")}],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": len(seq.out),
                      "total_tokens": len(ids) + len(seq.out),
                      "prompt_tokens_details": {"cached_tokens": seq.cached}},
        })

    def stream(self, ids: list[int], seq) -> None:
        """Server-sent events: a chunk of each token as the engine makes it (polled every millisecond),
        the last with the finish reason and the usage, then ``data: [DONE]``; the connection then closes."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        sent = 0
        while True:
            ended = seq.done.wait(0.001)
            new = seq.out[sent:]
            if not new and not ended:
                continue
            sent += len(new)
            if ended and seq.error:
                self.event({"error": {"message": f"the engine failed the request: {seq.error}", "code": 500}})
                break
            choice = {"index": 0, "token_ids": new, "finish_reason": seq.finish if ended else None,
                      "text": bytes(t for t in new if t < 256).decode("utf-8", "replace")}
            if sent == len(new):
                choice["prompt_token_ids"] = ids
            chunk = {"object": "text_completion", "model": self.server.model, "choices": [choice]}
            if ended:
                chunk["usage"] = {"prompt_tokens": len(ids), "completion_tokens": len(seq.out),
                                  "total_tokens": len(ids) + len(seq.out),
                                  "prompt_tokens_details": {"cached_tokens": seq.cached}}
            self.event(chunk)
            if ended:
                break
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def event(self, obj: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()
