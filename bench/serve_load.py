"""One `kern serve` under load against the engine alone, in one run: output tokens per second over
HTTP as a ratio of what the same engine does with no HTTP at all (its ceiling here).

    python bench/serve_load.py [--target toy-paged] [--streams 64] [--max-tokens 256] [--backend cpu|gpu]
                               [--workers N] [--prompt-tokens 32] [--rounds 4] [--repeats 3] [--[no-]pin]
                               [--serve-flag=--no-graphs ...]

Both sides run the same closed loop: `--streams` requests in flight, each replaced by the next as it
ends, `--rounds` requests per stream (one round alone is mostly the ramp-up of 64 prefills and the tail).

- **engine alone**: `serve.core.engine.build` and `serve.core.core.Core` driven in this process (admit, schedule,
  launch, commit) for `--streams` requests at once, nothing else: the ceiling the server's HTTP side
  and scheduler thread are measured against.
- **HTTP**: a `kern serve` process, loaded by `--workers` client processes, each running its streams
  as asyncio tasks over a keep-alive connection each (bench/load_client.py; `--client httpx`: one
  `httpx.Client` shared by a thread a stream, the old client, whose own CPU a request was as long
  as the server's at a round's boundary), `--streams` requests in flight in all; every request has its
  own prompt (no cache hits) and `ignore_eos`, so each generates exactly `--max-tokens` tokens. Run
  once non-streaming and once streaming: output tok/s, its ratio to the engine alone, time to first
  token and the inter-token latency (the gaps between a stream's chunks, per token) at p50 and p99, and
  the server's CPU time per output token (its process, then its children: with
  `--serve-flag=--frontend-process` the HTTP front end, then the engine core).

The machine's speed drifts within a minute (on the H200 box the engine alone swung 92k-160k tok/s
over consecutive one-second runs), so every measurement is made `--repeats` times, interleaved (engine
alone, HTTP, streaming, ...; the engine alone once more at the end), and the table gives the medians,
each path's range beside it, and the ratios of the medians. On a GPU machine the server's two
processes get CPUs of their own (`--pin`; their ZeroMQ I/O threads a third), the engine alone the
engine core's: unpinned, they shared CPUs with the client processes now and then, and the same
server measured 61k and 101k tok/s a minute apart (pinned: 100k-118k). Prints
one table. Never gates CI.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import launch
import load_client
from server_threads import children, cpu_s

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def prompt(i: int, n: int) -> list[int]:
    """Request i's prompt: n byte ids, distinct in its first page from every other request's."""
    head = f"{i:06d}:".encode()
    return list((head + bytes((i * 7 + k * 13) % 251 for k in range(n)))[:n])


class Alone:
    """The engine and scheduler core alone (`serve.core.engine.build` and `serve.core.core.Core` driven in this
    process): `run()` keeps `streams` requests in flight, each replaced by the next as it ends, until
    `rounds` x `streams` have been answered (the HTTP clients' closed loop, without HTTP)."""

    def __init__(self, target: str, backend: str, streams: int, max_tokens: int, prompt_tokens: int,
                 flags: list[str], rounds: int = 1) -> None:
        from serve.core.engine import Options, build

        steps = [int(f.split("=", 1)[1]) for f in flags if f.startswith("--decode-steps=")]  # as the server's
        opts = Options(backend=backend, max_seqs=streams, graphs="--no-graphs" not in flags,
                       capacity=capacity(streams, max_tokens, prompt_tokens), decode_steps=(steps or [None])[-1],
                       pack="--no-pack" not in flags)  # packed prefill as the server's
        self.e = build(target, opts)
        self.streams, self.max_tokens, self.prompt_tokens, self.rounds = streams, max_tokens, prompt_tokens, rounds
        self.cpu: int | None = None  # with --pin: the CPU the server's engine core gets, this run's too
        self.runs = 0

    def warm(self) -> None:
        """One closed loop unmeasured (the first pays for first calls), then the heap frozen as a server
        freezes its own once warm (`serve.common.startup.freeze_heap`): the two engines alike."""
        from serve.common.startup import freeze_heap

        self.run()
        freeze_heap(say=lambda *_, **__: None)

    def run(self) -> tuple[float, float, dict]:
        """One closed loop: (tokens per second, CPU microseconds per token, the core's counters), on
        `cpu` alone when one is set (the server is idle meanwhile)."""
        if self.cpu is None:
            return self._run()
        was = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {self.cpu})
        try:
            return self._run()
        finally:
            os.sched_setaffinity(0, was)

    def _run(self) -> tuple[float, float, dict]:
        from serve.core.core import Core
        from serve.core.request import Request

        e, rnd = self.e, self.runs
        self.runs += 1
        core = Core(e)
        got, ended, sent = [0], [0], [0]

        def sink(u) -> None:
            got[0] += len(u.tokens)
            ended[0] += u.done is not None

        def top_up() -> None:
            while sent[0] < self.rounds * self.streams and sent[0] - ended[0] < self.streams:
                core.submit(Request(f"r{rnd}-{sent[0]}", prompt(rnd * 100_000 + sent[0], self.prompt_tokens),
                                    self.max_tokens, e.rows, sink, ignore_eos=True))
                sent[0] += 1

        top_up()
        rt0 = e.runtime.timing.as_dict()
        t0, c0 = time.perf_counter(), time.process_time()
        while core.waiting or core.running:
            core.admit()
            core.run(core.schedule())
            top_up()
        getattr(e.runtime, "synchronize", lambda: None)()
        wall = time.perf_counter() - t0
        counted = {**core.counters.values, "tokens": core.counters.tokens, "step_s": core.counters.step_s,
                   **{k: v - rt0[k] for k, v in e.runtime.timing.as_dict().items()}}
        return got[0] / wall, (time.process_time() - c0) / got[0] * 1e6, counted


def shape(before: dict, after: dict) -> str:
    """How the run's steps were made, from the core's counters: forward steps (all steps less the
    prefill calls) and output tokens per forward step, then prefill calls (the engine alone packs a
    round's prompts together; requests arriving one by one over HTTP may each take a call), and the
    mean time inside the runtime's step per call."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in ("steps", "prefill_calls", "tokens", "step_s")}
    forward = d["steps"] - d["prefill_calls"]
    return (f"{forward:,} x {d['tokens'] / max(forward, 1):.1f} + {d['prefill_calls']:,}, "
            f"{d['step_s'] / max(d['steps'], 1) * 1000:.3f} ms")


PHASES = ("time_to_first_token_seconds", "request_queue_time_seconds", "request_prefill_time_seconds")


def counters_of(url: str) -> dict:
    """The server's counters and output tokens so far (GET /stats), and the sums and counts of its
    first-token, queue and prefill histograms (GET /metrics)."""
    import httpx

    got = httpx.get(url + "/stats", timeout=60).json()
    out = {**got["counters"], "tokens": got["timing"]["tokens"], "step_s": got["timing"]["step_s"],
           **{k: v for k, v in got["timing"].items() if k.startswith("rt_")}}
    for line in httpx.get(url + "/metrics", timeout=60).text.splitlines():
        name, _, value = line.rpartition(" ")
        name = name.split("{", 1)[0]
        if name.endswith(("_sum", "_count")) and name.split(":", 1)[-1].rsplit("_", 1)[0] in PHASES:
            out[name.split(":", 1)[-1]] = float(value)
    return out


def phases(before: dict, after: dict) -> str:
    """The server's mean time to first token, then its queue and prefill parts (arrival to admission,
    admission to the first token), in ms, over the requests between `before` and `after`."""
    def mean(name: str) -> float:
        n = after.get(name + "_count", 0) - before.get(name + "_count", 0)
        return (after.get(name + "_sum", 0) - before.get(name + "_sum", 0)) / n * 1000 if n else float("nan")

    return " / ".join(f"{mean(name):.1f}" for name in PHASES)


def capacity(streams: int, max_tokens: int, prompt_tokens: int) -> int:
    """The pool both runs get: every stream's prompt and answer twice over (the same for both, and far
    under a GPU's memory, so the engine alone leaves the server room)."""
    return 2 * streams * (prompt_tokens + max_tokens + 64)


def start_server(target: str, backend: str, streams: int, log: Path, flags: list[str],
                 tokens: int) -> tuple[launch.Server, str]:
    return launch.start(target, ["--backend", backend, "--max-seqs", str(streams), "--capacity", str(tokens),
                                 "--log-level", "info", *flags], log, timeout=600)


def bodies_of(first: int, count: int, max_tokens: int, prompt_tokens: int, stream: bool, rounds: int) -> list:
    """Each of `count` streams' `rounds` request bodies, one after another: its own prompt each (no cache
    hits) and `ignore_eos`, so each answer is exactly `max_tokens` tokens."""
    return [[{"prompt": prompt(first + j + r * 10_000, prompt_tokens), "max_tokens": max_tokens, "temperature": 0,
              "ignore_eos": True, "return_token_ids": True, "stream": stream} for r in range(rounds)]
            for j in range(count)]


def http_load(url: str, streams: int, workers: int, max_tokens: int, prompt_tokens: int, stream: bool,
              base: int, rounds: int = 1, client: str = "asyncio") -> dict:
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    per = [streams // workers + (1 if w < streams % workers else 0) for w in range(workers)]
    procs, first = [], base
    for n in per:
        bodies = bodies_of(first, n, max_tokens, prompt_tokens, stream, rounds)
        p = ctx.Process(target=load_client.worker, args=(url, bodies, go, out, client))
        p.start()
        procs.append(p)
        first += n
    time.sleep(1.0)  # every worker imported and waiting
    t0 = time.perf_counter()
    go.set()
    got = [out.get() for _ in procs]
    wall = time.perf_counter() - t0
    results = [r for rs, _ in got for r in rs]
    busiest = max(c for _, c in got) / wall  # the busiest client process's share of one core
    for p in procs:
        p.join()
    tokens = sum(r[0] for r in results)
    ttft = sorted(r[1] for r in results if r[1] is not None)
    gaps = sorted(g for r in results for g in r[2])

    def pct(xs, q):
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")

    return {"tok_s": tokens / wall, "tokens": tokens, "t0": t0, "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99),
            "itl_p50": pct(gaps, 0.5), "itl_p99": pct(gaps, 0.99), "wall": wall,
            "mean_ttft": statistics.mean(ttft) * 1000 if ttft else float("nan"), "client_busy": busiest,
            "ttfts": ttft, "gaps": gaps}


SERVER_CPUS = 3  # with --pin: the engine core's, the front end's, and ZeroMQ's I/O threads' (both processes'),
# and one more for each front end past the first (`--serve-flag=--frontends=N`)


def frontends_of(flags: list[str]) -> int:
    """The front-end processes the server's flags ask for (`--frontends N` or `--frontends=N`; 1 without)."""
    for i, f in enumerate(flags):
        if f.startswith("--frontends="):
            return int(f.split("=", 1)[1])
        if f == "--frontends" and i + 1 < len(flags):
            return int(flags[i + 1])
    return 1


def server_cpus(frontends: int = 1) -> int:
    return SERVER_CPUS + frontends - 1


def pin(pid: int, apart: bool = False) -> None:
    """Process `pid` (every thread of it) on CPU 1, its first child (the engine core, with
    --frontend-process) on CPU 0, its other children (the other front ends, with --frontends) on
    CPUs 3, 4, ..., and every process's ZeroMQ I/O threads (named `ZMQbg/...`) on CPU 2: on the
    core's CPU, each step's message woke its I/O thread there and the kernel switched the scheduler
    thread out to run it (on an unpinned machine it runs on any other CPU). `apart`: only the core's
    scheduler thread (named kern-scheduler by the server) on CPU 0, its other threads on CPU 2 too,
    so a message arriving or leaving does not switch the scheduler thread out. Unpinned, the server's
    processes shared CPUs with the client processes now and then, and the same server measured 61k
    and 101k tok/s a minute apart."""
    def every_thread(p: int, cpus: set[int], alone: str | None = None) -> None:
        for tid in os.listdir(f"/proc/{p}/task"):
            try:
                with open(f"/proc/{p}/task/{tid}/comm") as f:
                    name = f.read().strip()
            except OSError:
                name = ""
            aside = name.startswith("ZMQbg") or alone is not None and name != alone
            os.sched_setaffinity(int(tid), {2} if aside else cpus)

    every_thread(pid, {1})
    kids = children(pid)
    if kids:
        every_thread(kids[0], {0}, "kern-scheduler" if apart else None)
    for i, peer in enumerate(kids[1:]):
        every_thread(peer, {SERVER_CPUS + i})


def client_cpus(frontends: int = 1) -> set[int]:
    """With --pin: the CPUs the bench and its client processes get (all but the server's)."""
    first = server_cpus(frontends)
    return set(range(first, os.cpu_count() or first + 1))


def default_workers(streams: int, pinned: bool, frontends: int = 1) -> int:
    """Client processes: with --pin one for each client CPU (at most 16 and `streams`: fewer streams a
    client at a wave's end, their next requests sooner), else half the CPUs, at most 8."""
    cpus = os.cpu_count() or 2
    return max(1, min(16, streams, len(client_cpus(frontends)))) if pinned else max(1, min(8, cpus // 2))


def loop_args(ap: argparse.ArgumentParser) -> None:
    """The closed loop's flags (this bench's and bench/serve_timeline.py's)."""
    ap.add_argument("--target", default="toy-paged")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "gpu"])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--workers", type=int, default=None, help="client processes. Default: with --pin, one for each "
                    f"CPU the clients get (all but the server's {SERVER_CPUS}, at most 16 and --streams: a client "
                    "process answering fewer streams at the end of a wave sends their next requests sooner), else "
                    "half the CPUs, at most 8")
    ap.add_argument("--rounds", type=int, default=4, help="requests each stream sends one after another (the "
                    "engine alone keeps the same number in flight): one round is mostly ramp-up and tail")
    ap.add_argument("--serve-flag", action="append", default=[], help="an extra kern serve flag (repeatable)")
    ap.add_argument("--client", default="asyncio", choices=["asyncio", "httpx"], help="the clients' HTTP: asyncio, "
                    "a keep-alive connection a stream as tasks of one loop (bench/load_client.py); httpx, one "
                    "httpx.Client a process shared by a thread a stream (several hundred us of client CPU a request)")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None, help="the server's processes on "
                    "CPUs of their own (the front end on CPU 1, its first child, the engine core, on CPU 0, where "
                    "the engine alone runs too; every process's ZeroMQ I/O threads on CPU 2; with "
                    "--serve-flag=--frontends=N the other front ends on CPUs 3 to N + 1; this process and the "
                    "clients on the rest). Default: on for --backend gpu on a machine of 8 or more "
                    "CPUs (on the CPU backend the kernels' threads want every core)")
    ap.add_argument("--core-threads", choices=("together", "apart"), default="together", help="with --pin: the "
                    "engine core's threads all on CPU 0 (together), or its scheduler thread (kern-scheduler) "
                    "alone there and its message threads (kern-core, kern-core-out) on CPU 2 with the ZeroMQ "
                    "I/O threads (apart)")


def loop_setup(ap: argparse.ArgumentParser, args) -> None:
    """`args.pin` and `args.workers` settled, and with --pin this process (and the clients it
    starts) on the client CPUs."""
    if args.pin is None:
        args.pin = args.backend == "gpu" and (os.cpu_count() or 1) >= 8
    args.frontends = frontends_of(args.serve_flag)
    if args.pin:
        need = server_cpus(args.frontends)
        if (os.cpu_count() or 1) <= need or not hasattr(os, "sched_setaffinity"):
            ap.error(f"--pin needs Linux and {need + 1} or more CPUs ({os.cpu_count()} here)")
        os.sched_setaffinity(0, client_cpus(args.frontends))  # the clients inherit it
    if args.workers is None:
        args.workers = default_workers(args.streams, args.pin, args.frontends)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    loop_args(ap)
    ap.add_argument("--repeats", type=int, default=3, help="each measurement this many times, interleaved (engine "
                    "alone, HTTP, streaming, ...; the engine alone once more at the end): the table gives medians")
    args = ap.parse_args()
    loop_setup(ap, args)
    alone = Alone(args.target, args.backend, args.streams, args.max_tokens, args.prompt_tokens, args.serve_flag,
                  args.rounds)
    if args.pin:
        alone.cpu = 0  # the engine core's CPU: the two engines measured on the same one
    alone.warm()
    runs: dict[str, list] = {"engine alone": [], "HTTP": [], "HTTP streaming": []}
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(args.target, args.backend, args.streams, Path(tmp) / "serve.log", args.serve_flag,
                                 capacity(args.streams, args.max_tokens, args.prompt_tokens))
        try:
            if args.pin:
                pin(proc.pid, args.core_threads == "apart")
            http_load(url, min(4, args.streams), 1, 4, args.prompt_tokens, False, 10_000_000, 1, args.client)  # warm
            for rep in range(args.repeats):
                runs["engine alone"].append(alone.run())
                for k, stream in enumerate((False, True)):
                    before, counted = cpu_s(proc.pid), counters_of(url)
                    r = http_load(url, args.streams, args.workers, args.max_tokens, args.prompt_tokens, stream,
                                  (1 + 2 * rep + k) * 1_000_000, args.rounds, args.client)
                    after = cpu_s(proc.pid)
                    r["cpu"] = [(a - b) / r["tokens"] * 1e6 for a, b in zip(after, before)]
                    r["counters"] = (counted, counters_of(url))
                    runs["HTTP streaming" if stream else "HTTP"].append(r)
                print(f"repeat {rep + 1}/{args.repeats}: " + ", ".join(
                    f"{m} {(v[-1][0] if m == 'engine alone' else v[-1]['tok_s']):,.0f}" for m, v in runs.items()),
                    file=sys.stderr, flush=True)
            runs["engine alone"].append(alone.run())
        finally:
            launch.stop(proc, 30)
    print(table(runs, args))


def table(runs: dict[str, list], args) -> str:
    """The medians of the interleaved runs, each path's range beside it, as one table and its notes."""
    from tabulate import tabulate

    def pct(xs: list[float], q: float) -> str:
        xs = sorted(xs)
        return f"{xs[min(len(xs) - 1, int(q * len(xs)))] * 1000:.2f}" if xs else "-"

    alone = runs["engine alone"]
    ceiling = statistics.median(t for t, _, _ in alone)
    counted = totals(runs)
    rows = [("engine alone", ceiling, 1.0, f"{min(t for t, _, _ in alone):,.0f}-{max(t for t, _, _ in alone):,.0f}",
             "-", "-", "-", "-", f"{statistics.median(c for _, c, _ in alone):.0f}", shape(*counted["engine alone"]),
             "-", "-")]
    for path in ("HTTP", "HTTP streaming"):
        rs = runs[path]
        if not rs:
            continue
        tok = statistics.median(r["tok_s"] for r in rs)
        stream = path.endswith("streaming")
        ttfts = [t for r in rs for t in r["ttfts"]]
        gaps = [g for r in rs for g in r["gaps"]]
        cpu = "/".join(f"{statistics.median(r['cpu'][i] for r in rs):.0f}" for i in range(2))
        rows.append((path, tok, tok / ceiling, f"{min(r['tok_s'] for r in rs):,.0f}-{max(r['tok_s'] for r in rs):,.0f}",
                     pct(ttfts, 0.5) if stream else "-", pct(ttfts, 0.99) if stream else "-",
                     pct(gaps, 0.5) if stream else "-", pct(gaps, 0.99) if stream else "-", cpu, shape(*counted[path]), phases(*counted[path]),
                     f"{max(r['client_busy'] for r in rs):.0%}"))
    head = (f"{args.target}, backend {args.backend}, {args.streams} streams x {args.rounds} requests x "
            f"{args.max_tokens} tokens ({args.prompt_tokens}-token prompts), {args.workers} client processes, "
            f"medians of {args.repeats} interleaved runs ({len(alone)} of the engine alone)")
    body = tabulate([(m, f"{t:,.0f}", f"{x:.2f}", *rest) for m, t, x, *rest in rows],
                    headers=("path", "output tok/s", "x engine alone", "range", "TTFT p50 ms", "TTFT p99 ms",
                             "ITL p50 ms", "ITL p99 ms", "server CPU us/token", "forward steps x tokens + prefill calls, mean step",
                             "server TTFT / queue / prefill ms", "busiest client"), tablefmt="github")
    notes = ("server CPU us/token: the front end's CPU time (user + system) per output token over a run (with "
             "--frontends, every front end's together), then the engine core's (with --frontend-process); a process "
             "held by one interpreter lock serves at most about 1e6 / its figure tokens a second. Forward steps x tokens: every run's together, then the mean time inside the runtime's step (staging, kernels, copies) over every call "
             "(tokens a step below the streams: requests were out of the engine, between a finish and the next "
             "arrival). Server TTFT / queue / prefill: the server's own means (its /metrics histograms): arrival "
             "(the body parsed) to the first token, and its parts arrival to admission and admission to the first "
             "token. Busiest client: the busiest client process's CPU time over a run's wall time (near 100%: "
             "the clients, not the server, are the bound)")
    return f"{head}\n{body}\n{notes}\n\n{split(counted)}"


def totals(runs: dict[str, list]) -> dict[str, tuple[dict, dict]]:
    """Per path, every counter summed over its runs: (before, after), the engine alone's before empty
    (its counters are its run's own; the server's are read before and after each run)."""
    def summed(counts) -> dict:
        out: dict = {}
        for c in counts:
            for k, v in c.items():
                out[k] = out.get(k, 0) + v
        return out

    got = {"engine alone": ({}, summed(c for _, _, c in runs["engine alone"]))}
    for path in ("HTTP", "HTTP streaming"):
        if runs[path]:
            got[path] = (summed(r["counters"][0] for r in runs[path]), summed(r["counters"][1] for r in runs[path]))
    return got


SPLIT = ("stage", "upload", "launch", "kernel", "readback")


def split(counted: dict[str, tuple[dict, dict]]) -> str:
    """Where the runtime's step went, per path (`totals`): microseconds a step (every run's together)
    in host staging, uploads, issuing the launches, the kernels (device time) and the readback."""
    from tabulate import tabulate

    rows = []
    for path, (before, after) in counted.items():
        d = {k: after.get(k, 0) - before.get(k, 0) for k in ["rt_steps", *(f"rt_{x}" for x in SPLIT)]}
        n = max(d["rt_steps"], 1)
        rows.append((path, f"{d['rt_steps']:,.0f}", *(f"{d[f'rt_{x}'] / n * 1e6:.0f}" for x in SPLIT)))
    return tabulate(rows, headers=("runtime step, us each", "steps", *SPLIT), tablefmt="github")

if __name__ == "__main__":
    main()
