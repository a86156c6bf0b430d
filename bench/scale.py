"""Scale curves: the engine alone swept over sequences and over context, each point beside its ceiling.

    python bench/scale.py [--target toy-paged] [--backend gpu] [--seqs 1,4,16,64,256,1024] [--seq-context 2048]
                          [--contexts 256,1024,4096,8192] [--context-seqs 64] [--max-tokens 64] [--rounds 3]
                          [--out DIR] [--quick]

Two lines, each point a fresh engine driven as `bench/engine_step.py` drives one (admit, schedule, launch,
commit; no HTTP), every request `ignore_eos` with a prompt of (context - max_tokens) tokens:

- **sequences**: `--seqs` requests at once, each at a context of `--seq-context` tokens;
- **context**: `--context-seqs` requests at once, at each context of `--contexts` (up to the target's reach).

Each point runs one warm-up round (discarded: numba's or CUDA's first call, the pool's first touch), then
`--rounds` measured rounds, and prints the MEDIAN decode tok/s with its spread (least and most over the
rounds), beside the ceiling measured in the same rounds: decode tokens over the decode kernels' own time
(the toy's predict and write kernels alone, as engine_step.py's ceiling). The ratio is the median over the
ceiling's median. A point whose engine cannot be built (device memory, a context past the target's reach) is
skipped and named with the reason. With `--out DIR`, `DIR/scale.json` holds every point and `DIR/scale.png`
the two curves (tok/s and ceiling, log-log). Pin the process (`taskset -c 2 python bench/scale.py ...`)
for the steadiest figures: the host CPU sets the pace of a step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def _ints(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be >= 1")
    return out


def point(target: str, backend: str, seqs: int, context: int, max_tokens: int, rounds: int) -> dict:
    """One point: a fresh engine, a warm-up round, then `rounds` measured rounds. Raises KernError (or the
    backend's memory error) when the engine cannot be built or cannot hold the batch."""
    from engine_step import one_round
    from serve.core.engine import Options, build

    prompt_tokens = context - max_tokens
    cap = seqs * (context + 64)
    e = build(target, Options(backend=backend, max_seqs=seqs, capacity=cap))
    try:
        runs = [one_round(e, rnd, seqs, max_tokens, prompt_tokens) for rnd in range(rounds + 1)][1:]
    finally:
        del e
        _release()
    tok_s = [r["decode_tokens"] / _step_s(r) for r in runs]
    ceiling = [r["decode_tokens"] / r["kernel"] for r in runs if r["kernel"]]
    med, top = statistics.median(tok_s), statistics.median(ceiling) if ceiling else float("inf")
    return {"seqs": seqs, "context": context, "tok_s": med, "tok_s_min": min(tok_s), "tok_s_max": max(tok_s),
            "ceiling": top, "ratio": med / top, "steps": runs[0]["steps"]}


def _release() -> None:
    """The last point's engine gone before the next is built: its host and device memory returned (cupy's
    pool keeps freed blocks otherwise, and the next point would be measured beside them)."""
    import gc

    gc.collect()
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()


def _step_s(r: dict) -> float:
    """A round's decode-step wall time: every part but the kernel (it runs inside launch on the CPU, and
    overlaps launch and readback on a GPU), as engine_step.py counts it."""
    return sum(r[k] for k in ("schedule", "stage", "upload", "launch", "readback", "commit"))


def sweep(name: str, cases: list[tuple[int, int]], args) -> list[dict]:
    from kern.errors import KernError

    out = []
    print(f"\n{name}: {args.target} backend={args.backend} max_tokens={args.max_tokens} rounds={args.rounds} "
          f"(median decode tok/s [least..most] beside the kernels-only ceiling)", flush=True)
    for seqs, context in cases:
        try:
            p = point(args.target, args.backend, seqs, context, args.max_tokens, args.rounds)
        except (KernError, MemoryError) as exc:
            print(f"  seqs {seqs:>5} context {context:>6}: skipped ({exc})", flush=True)
            out.append({"seqs": seqs, "context": context, "skipped": str(exc)})
            continue
        except Exception as exc:  # noqa: BLE001 - cupy's OutOfMemoryError is no MemoryError; named, not fatal
            if "OutOfMemory" not in type(exc).__name__:
                raise
            print(f"  seqs {seqs:>5} context {context:>6}: skipped (device memory: {exc})", flush=True)
            out.append({"seqs": seqs, "context": context, "skipped": f"device memory: {exc}"})
            continue
        print(f"  seqs {seqs:>5} context {context:>6}: {p['tok_s']:>12,.0f} tok/s [{p['tok_s_min']:,.0f}.."
              f"{p['tok_s_max']:,.0f}]  ceiling {p['ceiling']:>12,.0f}  = {p['ratio']:.2f} x ceiling", flush=True)
        out.append(p)
    return out


def plot(lines: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (name, pts), key in zip(axes, lines.items(), ("seqs", "context")):
        pts = [p for p in pts if "skipped" not in p]
        xs = [p[key] for p in pts]
        ax.plot(xs, [p["tok_s"] for p in pts], "o-", label="engine (median decode tok/s)")
        ax.fill_between(xs, [p["tok_s_min"] for p in pts], [p["tok_s_max"] for p in pts], alpha=0.25)
        ax.plot(xs, [p["ceiling"] for p in pts], "s--", label="kernels alone (ceiling)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequences" if key == "seqs" else "context (tokens)")
        ax.set_ylabel("tokens / s")
        ax.set_title(name)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="toy-paged")
    ap.add_argument("--backend", default="cpu", choices=("cpu", "gpu"))
    ap.add_argument("--seqs", type=_ints, default=[1, 4, 16, 64, 256, 1024], help="the sequences line's points")
    ap.add_argument("--seq-context", type=int, default=2048, help="the sequences line's context (tokens)")
    ap.add_argument("--contexts", type=_ints, default=[256, 512, 1024, 2048, 4096, 8192],
                    help="the context line's points (tokens; up to the target's reach)")
    ap.add_argument("--context-seqs", type=int, default=64, help="the context line's sequences")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens generated a request (decode steps)")
    ap.add_argument("--rounds", type=int, default=3, help="measured rounds a point, after one warm-up round")
    ap.add_argument("--quick", action="store_true", help="a small sweep (CPU-sized): seqs 1,4,16; contexts 256,512")
    ap.add_argument("--out", type=Path, default=None, help="write scale.json and scale.png here")
    args = ap.parse_args(argv)
    if args.quick:
        args.seqs, args.contexts, args.seq_context, args.context_seqs = [1, 4, 16], [256, 512], 256, 8
        args.max_tokens, args.rounds = min(args.max_tokens, 16), min(args.rounds, 2)
    for flag, v in (("--max-tokens", args.max_tokens), ("--rounds", args.rounds),
                    ("--context-seqs", args.context_seqs)):
        if v < 1:
            ap.error(f"{flag} {v} must be >= 1")
    short = [c for c in [args.seq_context, *args.contexts] if c <= args.max_tokens]
    if short:
        ap.error(f"a context of {short[0]} tokens leaves no prompt beside --max-tokens {args.max_tokens}")
    lines = {
        f"sequences at a {args.seq_context}-token context": sweep(
            "sequences", [(s, args.seq_context) for s in args.seqs], args),
        f"context at {args.context_seqs} sequences": sweep(
            "context", [(args.context_seqs, c) for c in args.contexts], args),
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "scale.json").write_text(json.dumps({"target": args.target, "backend": args.backend,
                                                         "max_tokens": args.max_tokens, "lines": lines}, indent=1))
        plot(lines, args.out / "scale.png")
        print(f"\nwrote {args.out / 'scale.json'} and {args.out / 'scale.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
