"""Server throughput: answer tokens per second at concurrency 1, 12 and 64 on toy-paged and
toy-stateful (a real `kern serve` process over HTTP), and the scheduler's time per step outside the
kernels (from /stats: whole iterations less the runtime steps inside them).

    python bench/serve.py [--targets toy-paged toy-stateful] [--concurrency 1 12 64] [--max-tokens 64]

Each row is measured in the same run as the concurrency-1 row of its target, which is its ceiling
for per-request latency and its floor for throughput (`x c1`). Never gates CI.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVING = re.compile(r" serving .*\bport=(\d+)")
PROMPT = "The lighthouse keeper had not seen a ship in eleven days, and the silence of the bay was"


def start(target: str, backend: str, log: Path) -> tuple[subprocess.Popen, str]:
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=str(REPO) + (os.pathsep + path if path else ""))
    cmd = [sys.executable, "-m", "serve", target, "--backend", backend, "--port", "0", "--max-seqs", "64"]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        m = SERVING.search(log.read_text(errors="replace"))
        if m:
            return proc, f"http://127.0.0.1:{m.group(1)}"
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"server for {target} did not start:\n{log.read_text()[-2000:]}")


def burst(url: str, n: int, max_tokens: int, tag: int) -> int:
    import httpx

    def one(i: int) -> int:
        # a distinct first page per request, so no request hits another's snapshot
        body = {"prompt": f"{tag}-{i:04d}. {PROMPT}", "max_tokens": max_tokens, "return_token_ids": True}
        r = httpx.post(url + "/v1/completions", json=body, timeout=600)
        r.raise_for_status()
        return len(r.json()["choices"][0]["token_ids"])

    with ThreadPoolExecutor(n) as pool:
        return sum(pool.map(one, range(n)))


def timing(url: str) -> dict:
    import httpx

    return httpx.get(url + "/stats", timeout=30).json()["timing"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", nargs="+", default=["toy-paged", "toy-stateful"])
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 12, 64])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--backend", default="cpu", choices=["auto", "cpu", "gpu"])
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for target in args.targets:
            proc, url = start(target, args.backend, Path(tmp) / f"{target}.log")
            try:
                burst(url, 2, 4, 0)  # warm: kernels loaded, arenas touched
                base = None
                for k, n in enumerate(args.concurrency, 1):
                    t0, s0 = time.perf_counter(), timing(url)
                    tokens = burst(url, n, args.max_tokens, k)
                    wall, s1 = time.perf_counter() - t0, timing(url)
                    steps = max(s1["steps"] - s0["steps"], 1)
                    kern_ms = 1000 * (s1["step_s"] - s0["step_s"]) / steps
                    sched_ms = 1000 * ((s1["loop_s"] - s0["loop_s"]) - (s1["step_s"] - s0["step_s"])) / steps
                    tok_s = tokens / wall
                    base = base or tok_s
                    rows.append((target, n, tokens, tok_s, tok_s / base, steps, kern_ms, sched_ms, sched_ms / kern_ms))
            finally:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    head = ("target", "conc", "tokens", "tok/s", "x c1", "steps", "kernel ms/step", "sched ms/step", "sched/kernel")
    print(" | ".join(head))
    for r in rows:
        print(" | ".join([r[0], str(r[1]), str(r[2]), f"{r[3]:.1f}", f"{r[4]:.2f}", str(r[5]), f"{r[6]:.3f}",
                          f"{r[7]:.3f}", f"{r[8]:.3f}"]))


if __name__ == "__main__":
    main()
