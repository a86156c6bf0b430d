"""Hand-off: 12 concurrent requests of 200 tokens on a pool that seats one at a time (`--capacity 352`)
against a pool that seats them all (16384), measured in the same run on the same target.

    python bench/handoff.py [--target toy-paged] [--threads 1]

Served one after another, the requests take more steps (one row each instead of a batch), so the
ratio is the cost of seating them serially; it was about 15x when the scheduler idled 1 s on its
inbox at every hand-off, and should stay within 2x. `--threads` sets NUMBA_NUM_THREADS for both
servers: on a loaded machine the CPU kernels' parallel launch waits for its thread pool, a fixed cost
per step that the serial pool pays about five times as often. Never gates CI.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import launch

REPO = Path(__file__).resolve().parents[1]
PROMPT = "The lighthouse keeper had not seen a ship in eleven days, and the silence of the bay was"


def start(target: str, backend: str, log: Path, capacity: int, env_extra: dict) -> tuple[launch.Server, str]:
    return launch.start(target, ["--backend", backend, "--capacity", str(capacity)], log, timeout=120, env=env_extra)


def burst(url: str, n: int, max_tokens: int) -> int:
    import httpx

    def one(i: int) -> int:
        # a distinct first page per request, so no request hits another's snapshot
        body = {"prompt": f"{i:04d}. {PROMPT}", "max_tokens": max_tokens, "return_token_ids": True}
        r = httpx.post(url + "/v1/completions", json=body, timeout=900)
        r.raise_for_status()
        return len(r.json()["choices"][0]["token_ids"])

    with ThreadPoolExecutor(n) as pool:
        return sum(pool.map(one, range(n)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="toy-paged")
    ap.add_argument("--backend", default="cpu", choices=["auto", "cpu", "gpu"])
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=None, help="NUMBA_NUM_THREADS for both servers")
    args = ap.parse_args()
    env = {"NUMBA_NUM_THREADS": str(args.threads)} if args.threads else {}
    walls = {}
    with tempfile.TemporaryDirectory() as tmp:
        for capacity in (16384, 352):
            proc, url = start(args.target, args.backend, Path(tmp) / f"{capacity}.log", capacity, env)
            try:
                burst(url, 1, 4)  # warm: kernels loaded
                t0 = time.perf_counter()
                tokens = burst(url, args.requests, args.max_tokens)
                walls[capacity] = (time.perf_counter() - t0, tokens)
            finally:
                launch.stop(proc, 60)
    (small, n_small), (big, n_big) = walls[352], walls[16384]
    print("target | requests | tokens | s at --capacity 352 | s at 16384 | ratio (ceiling 2x)")
    print(f"{args.target} | {args.requests} | {n_small} | {small:.2f} | {big:.2f} | {small / big:.2f}")
    if n_small != n_big:
        raise SystemExit(f"the two pools answered different token counts: {n_small} vs {n_big}")


if __name__ == "__main__":
    main()
