"""Server throughput: answer tokens per second at concurrency 1, 12 and 64 on toy-paged and
toy-stateful (a real `kern serve` process over HTTP), and the scheduler's time per step outside the
kernels (from /stats: whole iterations less the runtime steps inside them).

    python bench/serve.py [--targets toy-paged toy-stateful] [--concurrency 1 12 64] [--max-tokens 64]
    python bench/serve.py --backend gpu --graphs both     # CUDA graphs against launch by launch
    python bench/serve.py --stages 1 2 3 [--ttft-tokens 8192]      # the pipeline (bench/serve_pp.py)

Each row is measured in the same run as the concurrency-1 row of its target, which is its ceiling
for per-request latency and its floor for throughput (`x c1`). A second table splits a step's time
(per step, ms): host staging of the fills, their upload, issuing the launches (or a graph replay),
the kernels of decode steps alone (device time by CUDA events on a GPU), the token readback, and
the scheduler outside the step. With `--graphs both` every target runs twice, with captured graphs
and with `--no-graphs`, and each graph row is printed beside the plain row of the same concurrency
(`x plain`). Never gates CI.

    python bench/serve.py --pack [--pack-target toy-layers] [--pack-concurrency 16]

Packed prefill against unpacked: the same prompts (distinct, 100 to 700 tokens) sent at once to two
servers of one target, one packing prefill calls (the default where the manifest declares
`cu_seqlens`), one started with `--no-pack`; prints each one's prefill calls and prompt tokens per
second, the ratio to unpacked, and checks the answers are identical.
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


def start(target: str, backend: str, log: Path, extra: tuple[str, ...] = ()) -> tuple[launch.Server, str]:
    return launch.start(target, ["--backend", backend, "--max-seqs", "64", *extra], log, timeout=120)


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


SPLIT = ("rt_stage", "rt_upload", "rt_launch", "rt_readback")


def measure(target: str, backend: str, concurrency: list[int], max_tokens: int, log: Path,
            extra: tuple[str, ...]) -> list[dict]:
    """One server: a row per concurrency, with tokens/s and where a step's time went."""
    proc, url = start(target, backend, log, extra)
    rows = []
    try:
        burst(url, 2, 4, 0)  # warm: kernels loaded, arenas touched
        for k, n in enumerate(concurrency, 1):
            t0, s0 = time.perf_counter(), timing(url)
            tokens = burst(url, n, max_tokens, k)
            wall, s1 = time.perf_counter() - t0, timing(url)
            d = {key: s1[key] - s0[key] for key in s1 if isinstance(s1[key], (int, float))}
            steps = max(d["steps"], 1)
            row = dict(target=target, conc=n, tokens=tokens, tok_s=tokens / wall, steps=d["steps"],
                       kern_ms=1000 * d["step_s"] / steps, sched_ms=1000 * (d["loop_s"] - d["step_s"]) / steps)
            for key in SPLIT:
                row[key] = 1000 * d.get(key, 0.0) / steps
            row["decode_kernel_ms"] = 1000 * d.get("rt_decode_kernel", 0.0) / max(d.get("rt_decode_steps", 0), 1)
            rows.append(row)
    finally:
        launch.stop(proc, 30)
    return rows


def pack_prompts(n: int) -> list[list[int]]:
    """n distinct prompts of 100 to 700 tokens (ids), the same every run."""
    base = PROMPT.encode()
    return [list((f"{i:03d} ".encode() + base * 8)[: 100 + (i * 211) % 601]) for i in range(n)]


def pack_compare(args) -> None:
    """The same prompts at once to a packing server and a --no-pack one: prefill calls, tok/s, answers."""
    import httpx
    from tabulate import tabulate

    prompts = pack_prompts(args.pack_concurrency)
    rows, answers = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode, extra in (("unpacked", ("--no-pack",)), ("packed", ())):
            proc, url = start(args.pack_target, args.backend, Path(tmp) / f"{mode}.log", extra)
            try:
                burst(url, 2, 4, 0)  # warm
                before = httpx.get(url + "/stats", timeout=30).json()

                def one(ids):
                    body = {"prompt": ids, "max_tokens": args.max_tokens, "return_token_ids": True}
                    r = httpx.post(url + "/v1/completions", json=body, timeout=600)
                    r.raise_for_status()
                    return r.json()["choices"][0]["token_ids"]

                t0 = time.perf_counter()
                with ThreadPoolExecutor(len(prompts)) as pool:
                    answers[mode] = list(pool.map(one, prompts))
                wall = time.perf_counter() - t0
                after = httpx.get(url + "/stats", timeout=30).json()
            finally:
                launch.stop(proc, 30)
            if mode == "packed" and not after["facts"].get("pack"):
                raise SystemExit(f"{args.pack_target} does not pack prefill (its chunk program takes no cu_seqlens)")
            c0, c1 = before["counters"], after["counters"]
            tokens = c1["prefill_tokens"] - c0["prefill_tokens"]
            rows.append((mode, c1["prefill_calls"] - c0["prefill_calls"], tokens, wall, tokens / wall))
    same = answers["packed"] == answers["unpacked"]
    print(f"{args.pack_target}, concurrency {len(prompts)}, max_tokens {args.max_tokens}, backend {args.backend}")
    print(tabulate([(m, calls, tokens, f"{wall:.2f}", f"{tok_s:.1f}", f"{tok_s / rows[0][4]:.2f}")
                    for m, calls, tokens, wall, tok_s in rows],
                   headers=("mode", "prefill calls", "prefill tokens", "wall s", "prefill tok/s", "x unpacked"),
                   tablefmt="github"))
    print(f"answers identical: {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit(1)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", nargs="+", default=["toy-paged", "toy-stateful"])
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 12, 64])
    ap.add_argument("--max-tokens", type=int, default=None, help="Answer tokens per request (default 64; 1 with --pack).")
    ap.add_argument("--backend", default="cpu", choices=["auto", "cpu", "gpu"])
    ap.add_argument("--graphs", default="on", choices=["on", "off", "both"],
                    help="captured CUDA graphs for decode (on), launch by launch (off), or both side by side")
    ap.add_argument("--stages", nargs="+", type=int, default=None,
                    help="Pipeline rows instead: TTFT through these stage counts, packed vs unpacked through the most.")
    ap.add_argument("--pp-target", default="toy-layers", help="The target the pipeline rows serve.")
    ap.add_argument("--ttft-tokens", type=int, default=8192, help="The long prompt's tokens.")
    ap.add_argument("--ttft-reps", type=int, default=2, help="TTFT is the best of this many prompts.")
    ap.add_argument("--pack-concurrency", type=int, default=16)
    ap.add_argument("--pack-tokens", type=int, default=512, help="Tokens per prompt of the packed/unpacked burst.")
    ap.add_argument("--serve-flag", action="append", default=[], help="Extra kern serve flag (repeatable), e.g. --serve-flag=--gpus=0.")
    ap.add_argument("--pack", action="store_true", help="Compare packed prefill against --no-pack in one process (--pack-target).")
    ap.add_argument("--pack-target", default="toy-layers")
    return ap.parse_args()


def main() -> None:
    args = _args()
    if args.stages:
        import serve_pp

        with tempfile.TemporaryDirectory() as tmp:
            serve_pp.run(args.pp_target, args.stages, args.backend, args.ttft_tokens, args.ttft_reps,
                         args.pack_concurrency, args.pack_tokens, Path(tmp), args.serve_flag)
        return
    if args.pack:
        args.max_tokens = args.max_tokens or 1
        return pack_compare(args)
    args.max_tokens = args.max_tokens or 64
    modes = {"on": [("graphs", ())], "off": [("plain", ("--no-graphs",))],
             "both": [("plain", ("--no-graphs",)), ("graphs", ())]}[args.graphs]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for target in args.targets:
            for mode, extra in modes:
                for r in measure(target, args.backend, args.concurrency, args.max_tokens,
                                 Path(tmp) / f"{target}-{mode}.log", extra):
                    rows.append(dict(r, mode=mode))
    _tables(rows)


def _tables(rows: list[dict]) -> None:
    """The throughput table (against concurrency 1 and the plain mode) and where a step's time goes."""
    from tabulate import tabulate

    base = {}
    plain = {}
    for r in rows:
        base.setdefault((r["target"], r["mode"]), r["tok_s"])
        r["x_c1"] = r["tok_s"] / base[(r["target"], r["mode"])]
        if r["mode"] == "plain":
            plain[(r["target"], r["conc"])] = r
    print(tabulate(
        [(r["target"], r["mode"], r["conc"], r["tokens"], f"{r['tok_s']:.1f}", f"{r['x_c1']:.2f}",
          f"{r['tok_s'] / plain[(r['target'], r['conc'])]['tok_s']:.2f}" if (r["target"], r["conc"]) in plain else "-",
          r["steps"], f"{r['kern_ms']:.3f}", f"{r['sched_ms']:.3f}", f"{r['sched_ms'] / max(r['kern_ms'], 1e-9):.3f}")
         for r in rows],
        headers=("target", "mode", "conc", "tokens", "tok/s", "x c1", "x plain", "steps", "step ms", "sched ms/step",
                 "sched/step"), tablefmt="github"))
    print()
    print("where a step's time goes (ms per step; decode kernel = device time of a decode step's kernels)")
    print(tabulate(
        [(r["target"], r["mode"], r["conc"], *(f"{r[k]:.3f}" for k in SPLIT), f"{r['sched_ms']:.3f}",
          f"{r['decode_kernel_ms']:.4f}",
          f"{r['decode_kernel_ms'] / max(plain[(r['target'], r['conc'])]['decode_kernel_ms'], 1e-9):.2f}"
          if (r["target"], r["conc"]) in plain else "-")
         for r in rows],
        headers=("target", "mode", "conc", "stage", "upload", "launch", "readback", "sched", "decode kernel",
                 "x plain"), tablefmt="github"))


if __name__ == "__main__":
    main()
