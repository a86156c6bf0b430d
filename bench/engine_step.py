"""The engine alone, one step at a time: where a decode step's time goes, beside its ceiling.

    python bench/engine_step.py [--target toy-paged] [--seqs 64] [--max-tokens 256] [--backend cpu|gpu]
                                [--prompt-tokens 32] [--rounds 2] [--warmup 1] [--pin CPUS] [--no-graphs]
                                [--decode-steps K] [--overlap | --no-overlap] [--profile FILE] [--no-pack]

`serve.core.engine.build` and `serve.core.core.Core` driven in this process (admit, schedule, run) for
`--seqs` requests at once, no HTTP, as `bench/serve_load.py`'s "engine alone" is. Every forward step
(a launch of several decode steps, `--decode-steps K`, counted as K steps) is split into: schedule
(admit and schedule), stage (the runtime's host staging of fills and tables), upload, launch (issuing
the calls or a graph replay), kernel (device time between two marks; the CPU runs kernels as issued),
readback (waiting for the emitted tokens), and commit (the core's own work around the runtime: the
cells, chaining the next launch under `--overlap`, positions, answers, checkpoints). Iterations with
prefill calls are timed apart. Prints output tok/s and, as the ceiling measured in the same run, the
tok/s the kernels alone would give (decode tokens / decode kernel time) with their ratio, and the
staging share of the step (stage + upload over the whole step). Best round of `--rounds` (each a fresh
Core) for tok/s, and each part's least over the rounds (a shared machine's noise only adds time). With
`--profile FILE`, the last round runs under cProfile and its stats are written to FILE.

A steady figure (issue 43): `--warmup` rounds run first and are discarded (numba's or CUDA's first
calls, the pool's first touch); `--pin CPUS` keeps the process on those CPUs (the host CPU sets a
step's pace, and a migrated thread pays for it); the last line gives the median over the measured
rounds with its spread (least and most) of tok/s, of the decode step and of the kernels' own time a
step, and the step over the kernels (the ratio issue 43 bounds at 2), so one run's ratio can gate.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PARTS = ("schedule", "stage", "upload", "launch", "kernel", "readback", "commit")


def prompt(i: int, n: int) -> list[int]:
    """Request i's prompt: n byte ids, distinct in its first page from every other request's."""
    head = f"{i:06d}:".encode()
    return list((head + bytes((i * 7 + k * 13) % 251 for k in range(n)))[:n])


def one_round(e, rnd: int, seqs: int, max_tokens: int, prompt_tokens: int) -> dict:
    from serve.core.core import Core
    from serve.core.request import Request

    core = Core(e)
    got = [0]

    def sink(u):
        got[0] += len(u.tokens)

    for i in range(seqs):
        core.submit(Request(f"r{rnd}-{i}", prompt(rnd * 100000 + i, prompt_tokens), max_tokens, e.rows, sink,
                            ignore_eos=True))
    rt = e.runtime
    spent = dict.fromkeys(PARTS, 0.0)
    prefill_s = 0.0
    steps = 0
    decode_tokens = 0
    t_start = time.perf_counter()
    while core.waiting or core.running or core.pending is not None:
        t0 = time.perf_counter()
        core.admit()
        plan = core.schedule()
        t1 = time.perf_counter()
        spent["schedule"] += t1 - t0
        if plan.prefill:  # prefill calls (and the forward step beside them): timed apart
            core.run(plan)
            prefill_s += time.perf_counter() - t1
            continue
        before = {k: getattr(rt.timing, k) for k in ("stage", "upload", "launch", "kernel", "readback")}
        launched = rt.timing.decode_steps
        before_tokens = got[0]
        core.run(plan)  # a launch and its commit; with --overlap, the next launch and the last one's commit
        c = time.perf_counter()
        for k, v in before.items():
            spent[k] += getattr(rt.timing, k) - v
        steps += rt.timing.decode_steps - launched  # a launch of several steps (--decode-steps) counts each
        decode_tokens += got[0] - before_tokens
        # the core's own work around the runtime's parts: the cells, chaining, the commit
        spent["commit"] += (c - t1) - sum(getattr(rt.timing, k) - v for k, v in before.items() if k != "kernel")
    getattr(rt, "synchronize", lambda: None)()
    wall = time.perf_counter() - t_start
    return {"wall": wall, "tokens": got[0], "steps": steps, "decode_tokens": decode_tokens, "prefill_s": prefill_s,
            **spent}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="toy-paged")
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="rounds run first and discarded (default 1)")
    ap.add_argument("--pin", default=None, help="CPUs to keep this process on, e.g. 2 or 2,3 (default: any)")
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--decode-steps", type=int, default=None,
                    help="decode steps a launch (kern serve's flag; default 8 on a GPU, 1 on the CPU)")
    ap.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                    help="send the next launch before committing the last (kern serve's flag; default on a GPU)")
    ap.add_argument("--profile", default=None, help="write the last round's cProfile stats here")
    ap.add_argument("--no-pack", action="store_true",
                    help="one sequence a prefill call, as before a manifest's chunk packed (kern serve's flag)")
    args = ap.parse_args(argv)

    from kern.errors import KernError
    from serve.core.engine import Options, build

    for flag, v in (("--seqs", args.seqs), ("--max-tokens", args.max_tokens), ("--prompt-tokens", args.prompt_tokens),
                    ("--rounds", args.rounds)):
        if v < 1:
            ap.error(f"{flag} {v} must be >= 1")
    if args.warmup < 0:
        ap.error(f"--warmup {args.warmup} must be >= 0")
    if args.pin is not None:
        try:
            os.sched_setaffinity(0, {int(c) for c in args.pin.split(",")})
        except (ValueError, OSError) as exc:
            ap.error(f"--pin {args.pin!r}: {exc}")
    cap = 2 * args.seqs * (args.prompt_tokens + args.max_tokens + 64)
    try:
        e = build(args.target, Options(backend=args.backend, max_seqs=args.seqs, graphs=not args.no_graphs,
                                       capacity=cap, decode_steps=args.decode_steps,
                                       overlap=args.overlap, pack=not args.no_pack))
    except KernError as exc:  # an unknown target, a backend that cannot load, flags it cannot serve
        ap.error(str(exc))
    for rnd in range(args.warmup):
        one_round(e, args.rounds + rnd, args.seqs, args.max_tokens, args.prompt_tokens)
    results = []
    for rnd in range(args.rounds):
        prof = cProfile.Profile() if args.profile and rnd == args.rounds - 1 else None
        if prof:
            prof.enable()
        results.append(one_round(e, rnd, args.seqs, args.max_tokens, args.prompt_tokens))
        if prof:
            prof.disable()
            prof.dump_stats(args.profile)
    args.engine_decode_steps = e.decode_steps
    args.engine_overlap = e.overlap
    report(args, results)
    return 0


def report(args, results: list[dict]) -> None:
    """Print the run: the best round's tok/s, each part's least over the rounds, the ceiling, the steady line."""
    # a shared machine's noise only ever adds time: each part's least over the rounds, the best round's tok/s
    best = max(results, key=lambda r: r["tokens"] / r["wall"])
    r = {**best, **{k: min(x[k] for x in results) for k in PARTS}}
    n = max(r["steps"], 1)
    # the step's wall time: the kernel runs inside launch (CPU) or overlaps launch and readback (GPU)
    step_s = sum(r[k] for k in PARTS if k != "kernel")
    ms = {k: 1000 * r[k] / n for k in PARTS}
    tok_s = r["tokens"] / r["wall"]
    ceiling = r["decode_tokens"] / r["kernel"] if r["kernel"] else float("inf")
    print(f"engine alone: {args.target} backend={args.backend} seqs={args.seqs} max_tokens={args.max_tokens} "
          f"prompt={args.prompt_tokens} graphs={not args.no_graphs} decode_steps={args.engine_decode_steps} "
          f"overlap={args.engine_overlap}")
    print(f"  best of {args.rounds} rounds: {r['tokens']} tokens in {r['wall']:.3f} s: {tok_s:,.0f} tok/s; {r['steps']} decode steps, "
          f"prefill {1000 * r['prefill_s']:.1f} ms in all")
    print("  per decode step (ms, each part's least over the rounds): " + "  ".join(f"{k} {ms[k]:.3f}" for k in PARTS)
          + f"  | step {1000 * step_s / n:.3f}")
    print("  (kernel is not added to the step: on the CPU it runs inside launch, on a GPU it overlaps launch and readback)")
    stage_share = (r["stage"] + r["upload"]) / step_s if step_s else 0.0
    commit_share = r["commit"] / step_s if step_s else 0.0
    print(f"  staging share {stage_share:.1%}  commit share {commit_share:.1%}  outside the kernel "
          f"{1000 * (step_s - r['kernel']) / n:.3f} ms a step")
    print(f"  ceiling (decode tokens / kernel time): {ceiling:,.0f} tok/s; decode tok/s "
          f"{r['decode_tokens'] / step_s:,.0f} = {r['decode_tokens'] / step_s / ceiling:.2f} x ceiling")
    print(steady(results))


def steady(results: list[dict]) -> str:
    """The median over the rounds, with the least and the most: tok/s, the decode step (ms), the kernels'
    own time a step (ms), and step over kernels, each round's own ratio (what issue 43 bounds at 2)."""
    def line(name: str, xs: list[float], fmt: str) -> str:
        return f"{name} {statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"

    steps = [max(x["steps"], 1) for x in results]
    step_ms = [1000 * sum(x[k] for k in PARTS if k != "kernel") / n for x, n in zip(results, steps)]
    kernel_ms = [1000 * x["kernel"] / n for x, n in zip(results, steps)]
    parts = [line("tok/s", [x["tokens"] / x["wall"] for x in results], ",.0f"),
             line("step ms", step_ms, ".3f"), line("kernel ms", kernel_ms, ".3f")]
    if all(kernel_ms):
        parts.append(line("step/kernel", [a / b for a, b in zip(step_ms, kernel_ms)], ".2f"))
    return f"  median of {len(results)} rounds (least-most): " + "; ".join(parts)


if __name__ == "__main__":
    sys.exit(main())
