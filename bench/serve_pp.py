"""The pipeline rows of `bench/serve.py --stages 1 2 3`: a long prompt's time to first token at
concurrency 1 through 1, 2 and 3 stages (the ratio to one process, measured in the same run), and
prefill tokens/s packed against unpacked (`--no-pack`) at concurrency 16 through the most stages.

Each TTFT is the best of `reps` prompts of `tokens` tokens, each with its own first page (no prefix
hit), `max_tokens` 1, streamed: the time to the first chunk that carries a token.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import launch

REPO = Path(__file__).resolve().parents[1]


def start(target: str, flags: list[str], log: Path, timeout: float = 300) -> tuple[launch.Server, str]:
    return launch.start(target, flags, log, timeout=timeout)


def stop(proc: launch.Server) -> None:
    launch.stop(proc, 60)  # the head, then its stages (its process group)


def prompt(tag: int, tokens: int) -> list[int]:
    """`tokens` ids whose first page is unique to `tag` (so no request hits another's snapshot)."""
    head = [(tag * 37 + j * 11) % 256 for j in range(16)]
    return head + [(tag + j * 7) % 256 for j in range(tokens - 16)]


def ttft(url: str, ids: list[int]) -> float:
    import httpx

    body = {"prompt": ids, "max_tokens": 1, "stream": True, "return_token_ids": True}
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0].get("token_ids"):
                return time.perf_counter() - t0
    raise RuntimeError("the stream ended without a token")


def prefill_burst(url: str, n: int, tokens: int, tag: int) -> float:
    """Prefill tokens per second for `n` prompts of `tokens` tokens sent at once (max_tokens 1)."""
    import httpx

    def one(i: int) -> int:
        r = httpx.post(url + "/v1/completions", json={"prompt": prompt(tag * 1000 + i, tokens), "max_tokens": 1},
                       timeout=1200)
        r.raise_for_status()
        return r.json()["usage"]["prompt_tokens"]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        total = sum(pool.map(one, range(n)))
    return total / (time.perf_counter() - t0)


def run(target: str, stages: list[int], backend: str, tokens: int, reps: int, conc: int, burst_tokens: int,
        tmp: Path, extra: list[str]) -> None:
    base = ["--backend", backend, "--capacity", str(max(4 * tokens, conc * (burst_tokens + 64) + 1024)), *extra]
    rows = []
    one = None
    for s in stages:
        proc, url = start(target, [*base, "--stages", str(s)], tmp / f"pp{s}.log")
        try:
            ttft(url, prompt(9999, 64))  # warm
            best = min(ttft(url, prompt(100 * s + r, tokens)) for r in range(reps))
        finally:
            stop(proc)
        one = one or best
        rows.append((s, tokens, best * 1000, one / best))
        print(f"stages {s}: ttft {best * 1000:.1f} ms", file=sys.stderr, flush=True)
    print(f"time to first token, {target}, one prompt of {tokens} tokens at concurrency 1 (best of {reps})")
    print("stages | prompt | ttft ms | speedup vs 1 stage")
    for r in rows:
        print(f"{r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.2f}")
    s = max(stages)
    got = {}
    for label, flags in (("packed", []), ("unpacked", ["--no-pack"])):
        proc, url = start(target, [*base, "--stages", str(s), *flags], tmp / f"pp{s}-{label}.log")
        try:
            prefill_burst(url, 2, 64, 0)  # warm
            got[label] = prefill_burst(url, conc, burst_tokens, 1 if label == "packed" else 2)
        finally:
            stop(proc)
        print(f"{label}: {got[label]:.0f} prefill tok/s", file=sys.stderr, flush=True)
    print(f"prefill tokens/s, {target} through {s} stages, {conc} prompts of {burst_tokens} tokens at once")
    print("packed tok/s | unpacked tok/s | packed / unpacked")
    print(f"{got['packed']:.0f} | {got['unpacked']:.0f} | {got['packed'] / got['unpacked']:.2f}")
