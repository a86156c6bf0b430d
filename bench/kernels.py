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
    ap.add_argument("--split-blocks", default="", help="GPU: comma-separated toy.kernels.cuda.SPLIT_BLOCKS values to time too")
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
    if args.backend == "gpu":
        gpu_figures(rt, m, step, args)
        return

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
    print(f"target {args.target}, backend {args.backend}: {args.seqs} seqs x {args.tokens} tokens x {bpt} B = {read / 2**20:.0f} MiB")
    print(f"{'figure':<34}{'GB/s':>10}")
    print(f"{'predict (decode step: write+predict)':<34}{rate:>10.2f}")
    print(f"{'ceiling: ' + xp.__name__ + ' sum, same bytes':<34}{ceiling:>10.2f}")
    print(f"{'ratio':<34}{rate / ceiling:>10.2f}")


def gpu_figures(rt: Runtime, m, step: list[Cell], args) -> None:
    """The predict kernel alone (the decode program's predict call, launched through the runtime)
    against cupy's sum over the same bytes, both timed with CUDA events on the runtime's stream."""
    import cupy as cp

    be = rt.backend
    rt.step("decode", step)  # stages seq_lens and the page table for these cells
    b = len(step)
    env = {rt.rows_var: b, rt.groups_var: b}
    predict = [c for c in m.programs["decode"].calls if c.op == "predict"]
    unit = manifests.page_unit(m)
    bpt = next(s.bytes_per_token for s in m.states.values() if s.paged)
    read = b * args.tokens * bpt
    per_seq = -(-args.tokens // unit)
    arena = rt.arenas["kv"]
    used = be.view(arena[unit * bpt : (1 + b * per_seq) * unit * bpt], "u64")  # the sequences' pages

    def timed(fn, n):
        with be.stream:
            fn()  # warm (compiles on first use)
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            start.record(be.stream)
            for _ in range(n):
                fn()
            stop.record(be.stream)
            stop.synchronize()
        return cp.cuda.get_elapsed_time(start, stop) / 1e3 / n

    def run_predict():
        for call in predict:
            rt.run_call(call, env)

    from toy.kernels import cuda as gk

    n = max(args.repeat, 10)
    dt = min(timed(run_predict, n) for _ in range(3))
    ceil_dt = min(timed(lambda: cp.sum(used), n) for _ in range(3))
    rate, ceiling = read / dt / 1e9, used.nbytes / ceil_dt / 1e9
    print(f"target {args.target}, backend gpu: {b} seqs x {args.tokens} tokens x {bpt} B = {read / 2**20:.0f} MiB read by predict")
    print(f"{'figure':<44}{'GB/s':>10}{'ms':>10}")
    print(f"{f'predict kernel (SPLIT_BLOCKS {gk.SPLIT_BLOCKS})':<44}{rate:>10.1f}{dt * 1e3:>10.3f}")
    print(f"{'ceiling: cupy sum, same bytes':<44}{ceiling:>10.1f}{ceil_dt * 1e3:>10.3f}")
    print(f"{'ratio':<44}{rate / ceiling:>10.2f}")
    default = gk.SPLIT_BLOCKS
    for v in [int(x) for x in args.split_blocks.split(",") if x.strip()]:
        gk.SPLIT_BLOCKS = v
        d = min(timed(run_predict, n) for _ in range(3))
        print(f"{f'  variant: SPLIT_BLOCKS {v}':<44}{read / d / 1e9:>10.1f}{d * 1e3:>10.3f}  ratio {ceil_dt / d:.2f}")
    gk.SPLIT_BLOCKS = default


if __name__ == "__main__":
    main()
