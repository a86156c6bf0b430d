"""One `kern serve` under load against the engine alone, in one run: output tokens per second over
HTTP as a ratio of what the same engine does with no HTTP at all (its ceiling here).

    python bench/serve_load.py [--target toy-paged] [--streams 64] [--max-tokens 256] [--backend cpu|gpu]
                               [--workers 4] [--prompt-tokens 32] [--rounds 4] [--serve-flag=--no-graphs ...]

Both sides run the same closed loop: `--streams` requests in flight, each replaced by the next as it
ends, `--rounds` requests per stream (one round alone is mostly the ramp-up of 64 prefills and the tail).

- **engine alone**: `serve.engine.build` and `serve.core.Core` driven in this process (admit, schedule,
  launch, commit) for `--streams` requests at once, nothing else: the ceiling the server's HTTP side
  and scheduler thread are measured against.
- **HTTP**: a `kern serve` process, loaded by `--workers` client processes, each one keep-alive
  `httpx.Client` shared by its threads (`--streams` requests in flight in all); every request has its
  own prompt (no cache hits) and `ignore_eos`, so each generates exactly `--max-tokens` tokens. Run
  once non-streaming and once streaming: output tok/s, its ratio to the engine alone, time to first
  token and the inter-token latency (the gaps between a stream's chunks, per token) at p50 and p99, and
  the server's CPU time per output token (its process, then its children: with
  `--serve-flag=--frontend-process` the HTTP front end, then the engine core).

Prints one table. Never gates CI.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import launch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def prompt(i: int, n: int) -> list[int]:
    """Request i's prompt: n byte ids, distinct in its first page from every other request's."""
    head = f"{i:06d}:".encode()
    return list((head + bytes((i * 7 + k * 13) % 251 for k in range(n)))[:n])


def engine_alone(target: str, backend: str, streams: int, max_tokens: int, prompt_tokens: int,
                 flags: list[str], rounds: int = 1) -> tuple[float, float]:
    """(tokens per second, CPU microseconds per token) of the engine and scheduler core alone, the
    best of two tries: `streams` requests in flight, each replaced by the next as it ends, until
    `rounds` x `streams` have been answered (the HTTP clients' closed loop, without HTTP)."""
    from serve.core import Core
    from serve.engine import Options, build
    from serve.request import Request

    opts = Options(backend=backend, max_seqs=streams, graphs="--no-graphs" not in flags,
                   capacity=capacity(streams, max_tokens, prompt_tokens))
    e = build(target, opts)
    best, cpu = 0.0, 0.0
    for rnd in range(2):
        core = Core(e)
        got, ended = [0], [0]

        def sink(u, got=got, ended=ended):
            got[0] += len(u.tokens)
            ended[0] += u.done is not None

        sent = 0

        def top_up() -> None:
            nonlocal sent
            while sent < rounds * streams and sent - ended[0] < streams:
                core.submit(Request(f"r{rnd}-{sent}", prompt(rnd * 100000 + sent, prompt_tokens), max_tokens, e.rows,
                                    sink, ignore_eos=True))
                sent += 1

        top_up()
        t0, c0 = time.perf_counter(), time.process_time()
        while core.waiting or core.running:
            core.admit()
            core.run(core.schedule())
            top_up()
        getattr(e.runtime, "synchronize", lambda: None)()
        wall = time.perf_counter() - t0
        if got[0] / wall > best:
            best, cpu = got[0] / wall, (time.process_time() - c0) / got[0] * 1e6
    return best, cpu


def capacity(streams: int, max_tokens: int, prompt_tokens: int) -> int:
    """The pool both runs get: every stream's prompt and answer twice over (the same for both, and far
    under a GPU's memory, so the engine alone leaves the server room)."""
    return 2 * streams * (prompt_tokens + max_tokens + 64)


def start_server(target: str, backend: str, streams: int, log: Path, flags: list[str],
                 tokens: int) -> tuple[launch.Server, str]:
    return launch.start(target, ["--backend", backend, "--max-seqs", str(streams), "--capacity", str(tokens),
                                 "--log-level", "info", *flags], log, timeout=600)


def _worker(url: str, first: int, count: int, max_tokens: int, prompt_tokens: int, stream: bool, go, out,
            rounds: int = 1) -> None:
    """One client process: `count` streams at once over one keep-alive client, each sending `rounds`
    requests one after another; each request's (tokens, ttft_s, [gap per token, ...])."""
    import httpx

    client = httpx.Client(base_url=url, timeout=600, limits=httpx.Limits(max_connections=count,
                                                                          max_keepalive_connections=count))
    results = []

    def streamed(j: int) -> None:
        for r in range(rounds):
            results.append(one(first + j + r * 10_000))

    def one(i: int) -> tuple:
        body = {"prompt": prompt(i, prompt_tokens), "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True, "stream": stream}
        t0 = time.perf_counter()
        if not stream:
            r = client.post("/v1/completions", json=body)
            r.raise_for_status()
            n = len(r.json()["choices"][0]["token_ids"])
            return n, None, []  # no first token to time: the answer comes whole
        n, ttft, gaps, last = 0, None, [], t0
        with client.stream("POST", "/v1/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                k = len(json.loads(line[6:])["choices"][0].get("token_ids") or [])
                now = time.perf_counter()
                if k:
                    if ttft is None:
                        ttft = now - t0
                    else:
                        gaps += [(now - last) / k] * k
                    last = now
                    n += k
        return n, ttft or 0.0, gaps

    go.wait()
    threads = [threading.Thread(target=streamed, args=(j,)) for j in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(results)
    client.close()


def http_load(url: str, streams: int, workers: int, max_tokens: int, prompt_tokens: int, stream: bool,
              base: int, rounds: int = 1) -> dict:
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    per = [streams // workers + (1 if w < streams % workers else 0) for w in range(workers)]
    procs, first = [], base
    for n in per:
        p = ctx.Process(target=_worker, args=(url, first, n, max_tokens, prompt_tokens, stream, go, out, rounds))
        p.start()
        procs.append(p)
        first += n
    time.sleep(1.0)  # every worker imported and waiting
    t0 = time.perf_counter()
    go.set()
    results = [r for _ in procs for r in out.get()]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    tokens = sum(r[0] for r in results)
    ttft = sorted(r[1] for r in results if r[1] is not None)
    gaps = sorted(g for r in results for g in r[2])

    def pct(xs, q):
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")

    return {"tok_s": tokens / wall, "tokens": tokens, "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99),
            "itl_p50": pct(gaps, 0.5), "itl_p99": pct(gaps, 0.99), "wall": wall,
            "mean_ttft": statistics.mean(ttft) * 1000 if ttft else float("nan")}


def cpu_s(pid: int) -> tuple[float, float]:
    """(CPU seconds, user + system) of process `pid` and of its children now (with --frontend-process:
    the front end and the engine core), from Linux's /proc; zeros elsewhere."""
    def one(p: int) -> float:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return 0.0

    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(k) for k in f.read().split()]
    except OSError:
        kids = []
    return one(pid), sum(one(k) for k in kids)


def main() -> None:
    from tabulate import tabulate

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="toy-paged")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--workers", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)))
    ap.add_argument("--rounds", type=int, default=4, help="requests each stream sends one after another (the "
                    "engine alone keeps the same number in flight): one round is mostly ramp-up and tail")
    ap.add_argument("--serve-flag", action="append", default=[], help="an extra kern serve flag (repeatable)")
    args = ap.parse_args()
    ceiling, alone_cpu = engine_alone(args.target, args.backend, args.streams, args.max_tokens, args.prompt_tokens,
                                      args.serve_flag, args.rounds)
    rows = [("engine alone", ceiling, 1.0, "-", "-", "-", "-", f"{alone_cpu:.0f}")]
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(args.target, args.backend, args.streams, Path(tmp) / "serve.log", args.serve_flag,
                                 capacity(args.streams, args.max_tokens, args.prompt_tokens))
        try:
            http_load(url, min(4, args.streams), 1, 4, args.prompt_tokens, False, 10_000_000)  # warm
            for k, stream in enumerate((False, True)):
                before = cpu_s(proc.pid)
                r = http_load(url, args.streams, args.workers, args.max_tokens, args.prompt_tokens, stream,
                              (k + 1) * 1_000_000, args.rounds)
                after = cpu_s(proc.pid)
                cpu = "/".join(f"{(a - b) / r['tokens'] * 1e6:.0f}" for a, b in zip(after, before))
                rows.append(("HTTP streaming" if stream else "HTTP", r["tok_s"], r["tok_s"] / ceiling,
                             f"{r['ttft_p50']:.1f}" if stream else "-", f"{r['ttft_p99']:.1f}" if stream else "-",
                             f"{r['itl_p50']:.2f}" if stream else "-", f"{r['itl_p99']:.2f}" if stream else "-", cpu))
        finally:
            launch.stop(proc, 30)
    print(f"{args.target}, backend {args.backend}, {args.streams} streams x {args.rounds} requests x "
          f"{args.max_tokens} tokens ({args.prompt_tokens}-token prompts), {args.workers} client processes")
    print(tabulate([(m, f"{t:,.0f}", f"{x:.2f}", *rest) for m, t, x, *rest in rows],
                   headers=("path", "output tok/s", "x engine alone", "TTFT p50 ms", "TTFT p99 ms",
                            "ITL p50 ms", "ITL p99 ms", "server CPU us/token"), tablefmt="github"))
    print("server CPU us/token: the server process's CPU time (user + system) per output token over the run, "
          "then its children's (with --frontend-process: the engine core's); a process held by one "
          "interpreter lock serves at most about 1e6 / its figure tokens a second")


if __name__ == "__main__":
    main()
