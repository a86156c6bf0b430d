"""The smallest engine `e2e --engine` gates: the contract's core and nothing else (docs/gate-your-engine.md).

    e2e --engine "python examples/tiny_engine.py --port {port}" --targets toy-paged

Its "model" is the toy's reference arithmetic (toy/model.py's `generate`), standing in for whatever
model a real engine runs, and it has no cache at all: every request is computed from scratch. The gate
passes it on the core checks and reports every other check `skipped (engine lacks X)`.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's toy/, run from anywhere
from toy.model import EOS, generate  # noqa: E402

MANIFESTS = Path(__file__).resolve().parent.parent / "manifests" / "toy"


class Handler(BaseHTTPRequestHandler):
    manifest: dict = {}
    model = "toy-paged"

    def reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self.reply(200, {"status": "ok"})
        else:
            self.reply(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        if self.path != "/v1/completions":
            return self.reply(404, {"error": {"message": f"no route {self.path}"}})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            prompt, max_tokens = [int(t) for t in body["prompt"]], int(body["max_tokens"])
        except (ValueError, KeyError, TypeError) as exc:
            return self.reply(400, {"error": {"message": f"bad request: {type(exc).__name__}: {exc}"}})
        ids = generate(prompt, max_tokens, self.manifest)  # stops before EOS, which the contract wants kept
        stopped = len(ids) < max_tokens
        self.reply(200, {"choices": [{"token_ids": ids + [EOS] if stopped else ids, "prompt_token_ids": prompt,
                                      "finish_reason": "stop" if stopped else "length"}],
                         "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids) + stopped}})

    def log_message(self, *args) -> None:  # quiet: the gate keeps the log
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="toy-paged", help="which toy (its manifest under manifests/toy/)")
    args = ap.parse_args()
    Handler.manifest = json.loads((MANIFESTS / f"{args.model}.json").read_text())
    Handler.model = args.model
    ThreadingHTTPServer.request_queue_size = 128  # the default backlog of 5 resets a burst's connections
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"tiny engine serving {args.model} on 127.0.0.1:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
