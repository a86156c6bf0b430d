"""How fast one GPU's driver makes CUDA contexts: the floor under a gate that starts many GPU servers.

    python bench/cuda_contexts.py [--contexts 40] [--at-once 1 2 4 8 40]

For each --at-once K it forks --contexts children, at most K alive at a time, each of which makes its
CUDA context as a server does (cupy's device and stream, one allocation, numba.cuda's context) and
exits; it prints the wall time, the milliseconds a context, and when the tenth was made, and beside
each row, as a ratio, how much faster it went than the same count made one at a time (K = 1) in the
same run.

Measured on the H200 (docs/gate-speed.md): about 330 ms a context one at a time, 190 ms with 4-8 at
once, 245 ms with 40 at once (and the tenth made only after 8.6 s): the driver makes them in turn,
so N GPU processes cost about N x 0.19 s of it wherever they start.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_context() -> None:
    import cupy as cp

    import runtime.gpu

    cp.cuda.Device(0).use()
    cp.cuda.Stream(non_blocking=True)
    cp.zeros(1, cp.uint8)
    runtime.gpu.numba_cuda().current_context()


def wave(n: int, at_once: int) -> tuple[float, float]:
    """Make `n` contexts in forked children, `at_once` at a time; (seconds in all, seconds to the 10th)."""
    t0 = time.monotonic()
    running: set[int] = set()
    made, done = 0, []
    while made < n or running:
        while made < n and len(running) < at_once:
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    make_context()
                except BaseException:
                    code = 1
                os._exit(code)
            running.add(pid)
            made += 1
        pid, status = os.wait()
        running.discard(pid)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit("a child could not make its CUDA context (no GPU here?)")
        done.append(time.monotonic() - t0)
    return done[-1], done[min(9, len(done) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", type=int, default=40, help="contexts to make per row")
    ap.add_argument("--at-once", type=int, nargs="+", default=[1, 2, 4, 8, 40], help="children alive at a time, a row each")
    args = ap.parse_args()
    try:
        import runtime.gpu  # imported before the forks, as the gate's zygote does (CUDA is not initialised)

        runtime.gpu.numba_cuda()
    except ImportError as exc:
        raise SystemExit(f"bench/cuda_contexts.py: needs the GPU backend: {exc}") from None
    rows = [(k, *wave(args.contexts, k)) for k in sorted(set([1, *args.at_once]))]
    serial = next(total for k, total, _ in rows if k == 1)
    print(f"{'at once':>8} {'total s':>8} {'ms each':>8} {'10th at s':>10} {'vs one at a time':>17}")
    for k, total, tenth in rows:
        print(f"{k:8d} {total:8.2f} {total / args.contexts * 1000:8.0f} {tenth:10.2f} {serial / total:16.2f}x")


if __name__ == "__main__":
    main()
