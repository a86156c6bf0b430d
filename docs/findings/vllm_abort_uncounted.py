"""vllm#31503 reproduced: a streamed request the client hangs up on is aborted (its generation stops),
counted in vllm:prompt_tokens_total, and never in vllm:request_success_total (no finished_reason,
`abort` included) nor in any per-request histogram.

usage: python docs/findings/vllm_abort_uncounted.py http://127.0.0.1:PORT MODEL
(a vLLM OpenAI server: `examples/vllm_toy/serve.sh PORT` serves MODEL kern-toy-vllm; any model works,
with token-id prompts). Prints the metric deltas of one hung-up stream; exit 1 when the abort was
not counted (the bug), 0 when it was.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

NAMES = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
         "vllm:e2e_request_latency_seconds_count", "vllm:request_prompt_tokens_count")


def scrape(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        for s in fam.samples:
            if s.name in NAMES:
                key = s.name + (f"{{{s.labels['finished_reason']}}}" if "finished_reason" in s.labels else "")
                out[key] = out.get(key, 0.0) + s.value
    return out


def hang_up(url: str, model: str, chunks: int = 3) -> None:
    """Stream a long completion, read `chunks` SSE lines, close the socket."""
    u = urlsplit(url)
    body = json.dumps({"model": model, "prompt": list(range(65, 97)), "max_tokens": 900, "ignore_eos": True,
                       "temperature": 0, "stream": True}).encode()
    with socket.create_connection((u.hostname, u.port), timeout=60) as s:
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        f, got = s.makefile("rb"), 0
        while got < chunks:
            line = f.readline()
            if not line:
                break
            got += line.startswith(b"data:")


def main() -> int:
    url, model = sys.argv[1].rstrip("/"), sys.argv[2]
    before = scrape(url)
    hang_up(url, model)
    time.sleep(5)  # the abort reaches the engine; nothing else runs
    after = scrape(url)
    for k in sorted(set(before) | set(after)):
        print(f"{k:60} +{after.get(k, 0) - before.get(k, 0):g}")
    counted = after.get("vllm:request_success_total{abort}", 0) - before.get("vllm:request_success_total{abort}", 0)
    print("abort counted" if counted == 1 else "BUG: the aborted request is in no finished count (vllm#31503)")
    return 0 if counted == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
