"""The predict kernel's read rate beside a plain reduction over the same bytes, in the same run.

    python bench/kernels.py                      # CPU: toy-big, 16 sequences x 256 tokens (256 MiB)
    python bench/kernels.py --backend gpu --seqs 256   # GPU: 4 GiB (SPEC §11)

The state is written by the toy's own write kernel; predict then reads every word of every slot of
every sequence (heads summed, tails checked). The ceiling is numpy's (or cupy's) sum over the
same arena bytes.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import manifests
from manifests.config import PACKAGED, load_config
from runtime.runtime import Runtime
from runtime.step import Cell


def best_of(n: int, fn) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="toy-big")
    ap.add_argument("--seqs", type=int, default=16, help="sequences in the batch (default 16)")
    ap.add_argument("--tokens", type=int, default=256, help="tokens per sequence (default 256)")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    t = load_config(PACKAGED).targets[args.target]
    m = manifests.load(t.manifest)
    unit = manifests.page_unit(m)
    per_seq = -(-args.tokens // unit)
    rt = Runtime(m, [str(w) for w in t.weights], pages=1 + args.seqs * per_seq, slots=args.seqs + 2,
                 backend=args.backend, max_seqs=args.seqs)
    rt.set_pad(0, 1 if rt.lined else None)
    cells = [Cell(list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)), 2 + i if rt.lined else None, [], 0)
             for i in range(args.seqs)]
    for i, c in enumerate(cells):  # write every slot with the toy's own kernel
        rt.step("prefill", [Cell(c.pages, c.slot, [(i + q) % 256 for q in range(args.tokens)], 0)])
    step = [Cell(c.pages, c.slot, [1], args.tokens - 1) for c in cells]
    predict_args = None

    def run_predict():
        rt.step("decode", step)
        rt.backend.synchronize()

    run_predict()  # compile / warm
    dt = best_of(args.repeat, run_predict)
    bpt = next(s.bytes_per_token for s in m.states.values() if s.paged)
    read = args.seqs * args.tokens * bpt
    arena = rt.arenas["kv"]
    used = rt.backend.view(arena[: (1 + args.seqs * per_seq) * unit * bpt], "u64")
    if args.backend == "gpu":
        import cupy as xp
    else:
        xp = np
    xp.sum(used)
    ceil_dt = best_of(args.repeat, lambda: (xp.sum(used), rt.backend.synchronize()))
    ceil_bytes = used.nbytes
    rate, ceiling = read / dt / 1e9, ceil_bytes / ceil_dt / 1e9
    del predict_args
    print(f"target {args.target}, backend {args.backend}: {args.seqs} seqs x {args.tokens} tokens x {bpt} B = {read / 2**20:.0f} MiB")
    print(f"{'figure':<34}{'GB/s':>10}")
    print(f"{'predict (decode step: write+predict)':<34}{rate:>10.2f}")
    print(f"{'ceiling: ' + xp.__name__ + ' sum, same bytes':<34}{ceiling:>10.2f}")
    print(f"{'ratio':<34}{rate / ceiling:>10.2f}")


if __name__ == "__main__":
    main()
