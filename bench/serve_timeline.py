"""Where a served closed loop loses to the engine alone, iteration by iteration: the scheduler's
iterations traced (when each began and ended, its prefill calls, its forward batch, the requests
running and waiting) for the engine alone and for one `kern serve` under HTTP load, summed per run.

    python bench/serve_timeline.py [--target toy-paged] [--backend cpu|gpu] [--streams 64]
                                   [--max-tokens 256] [--prompt-tokens 32] [--rounds 4] [--workers N]
                                   [--[no-]pin] [--serve-flag=...] [--out DIR] [--null-kernels]
                                   [--profile-core PATH] [--profile-frontend PATH]
                                   [--profile-clock wall|cpu]

The same closed loop as bench/serve_load.py (its `Alone`, its clients, its pinning): `--streams`
requests in flight, each replaced by the next as it ends, `--rounds` each. The server is this
checkout's `kern serve` started through this file, which wraps `serve.core.core.Core.run` to note each
iteration (the engine core process inherits the wrap when it is forked) and appends the notes to a
file per process under `--out`. Printed per run:

- wall time and output tok/s; iterations; the mean forward batch (rows a forward step);
- time inside `Core.run` (launch and commit of the iteration's steps) and between iterations (the
  scheduler's drain, admission, the front end's messages), with the gaps over 1 ms;
- the rounds' boundaries: time with fewer than half the streams running, and the prefill calls and
  the largest number in one iteration.

Each run's timeline (ms from its first iteration, ms long, prefill calls, rows, running, waiting) is
written under `--out` for a closer look. On one machine the clock is one (`time.perf_counter` is
CLOCK_MONOTONIC on Linux), so the server's notes fall in the client's windows. Never gates CI.

`--null-kernels` (CPU backend) runs no kernel, here or in the server: a step then costs the host's
own work alone, as beside a GPU's kernels, so where the engine core's Python bounds a GPU server
shows on any machine (on two cores, toy-paged 64 x 256, `--decode-steps=16 --overlap
--frontend-process`: the engine alone 470-500k tok/s, HTTP 210-233k, as on an H100). `--profile-core
PATH` runs the server's scheduler thread under cProfile (and the engine alone's runs, into PATH.alone,
to set beside it); `--profile-clock cpu` times it by the thread's
own CPU time (`time.thread_time`) instead of the wall clock, so time the thread spent switched out
(the clients and the front end share the two cores here) is not counted against the calls it
interrupted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
NOTES: list[tuple] = []
PROFILE: list = []  # with --profile-core: the scheduler thread's cProfile.Profile, in the server


def _flush() -> None:
    for prof in PROFILE:  # on the scheduler thread (Core.run's wrap): dumping stops it, so it starts again
        prof.dump_stats(f"{os.environ['KERN_PROFILE_CORE']}.{os.getpid()}")
        prof.enable()
    if NOTES:
        with open(f"{os.environ['KERN_TIMELINE']}.{os.getpid()}", "a") as f:
            f.write("".join("%.6f %.6f %d %d %d %d\n" % n for n in NOTES))
        NOTES.clear()


def trace() -> None:
    """Wrap `Core.run` to note each iteration (appended to KERN_TIMELINE.<pid> every 256, and whenever
    the core is left with nothing to run: the engine core process ends with `os._exit`, which runs no
    exit handler)."""
    import atexit

    import serve.core.core as core

    run = core.Core.run

    def traced(self, plan):
        t0 = time.perf_counter()
        run(self, plan)
        # the rows launched: with --overlap the launch this iteration left pending (`plan` may be replaced)
        rows = len(self.pending.work.reqs) if self.pending is not None else len(plan.step)
        NOTES.append((t0, time.perf_counter(), len(plan.prefill), rows, len(self.running), len(self.waiting)))
        if len(NOTES) >= 256 or not self.running and not self.waiting:
            _flush()

    core.Core.run = traced
    atexit.register(_flush)
    if os.environ.get("KERN_NULL_KERNELS") == "1":
        null_kernels()
    if os.environ.get("KERN_PROFILE_CORE"):
        profile_core()
    if os.environ.get("KERN_PROFILE_FRONTEND"):
        profile_frontend()


def profiler(clock: str):
    """A cProfile.Profile timed by the wall clock, or by the calling thread's own CPU time ("cpu")."""
    import cProfile

    return cProfile.Profile(time.thread_time) if clock == "cpu" else cProfile.Profile()


def profile_core() -> None:
    """The scheduler thread's every call under cProfile (`--profile-core PATH`), its stats written to
    PATH.<pid> with the notes. cProfile counts every call where a sampler may not: a non-blocking
    py-spy of a served load on an H100 caught the busy threads too rarely to use (why is not known;
    torn samples of running threads, dropped, would explain it)."""
    import serve.core.scheduler as scheduler

    run = scheduler.Scheduler.run  # the thread's body (its warm-up, then its loop)

    def profiled(self) -> None:
        prof = profiler(os.environ.get("KERN_PROFILE_CLOCK", "wall"))
        PROFILE.append(prof)
        prof.enable()
        run(self)

    scheduler.Scheduler.run = profiled


def profile_frontend() -> None:
    """The front end's event loop under cProfile while it serves (`--profile-frontend PATH`: uvicorn's
    main loop, from its start to its shutdown, the engine core already forked), its stats written to
    PATH.<pid> when the loop ends (SIGTERM drains it). With --frontends N, each front end its own file."""
    import uvicorn

    main_loop = uvicorn.Server.main_loop

    async def profiled(self) -> None:
        prof = profiler(os.environ.get("KERN_PROFILE_CLOCK", "wall"))
        prof.enable()
        try:
            await main_loop(self)
        finally:
            prof.disable()
            prof.dump_stats(f"{os.environ['KERN_PROFILE_FRONTEND']}.{os.getpid()}")

    uvicorn.Server.main_loop = profiled


def profiled_alone(alone, path: Path | None, clock: str):
    """One run of the engine alone, under cProfile with `--profile-core` (its stats added to
    PATH.alone, the same clock as the server's): the same calls, to set beside the server's."""
    if path is None:
        return alone.run()
    import pstats

    prof = profiler(clock)
    got = prof.runcall(alone.run)
    out = Path(f"{path}.alone")
    stats = pstats.Stats(prof)
    if out.exists():
        stats.add(str(out))
    stats.dump_stats(out)
    return got


def null_kernels() -> None:
    """Every kernel launch on the CPU backend a no-op (`--null-kernels`, here and in the server started
    through this file): what a step costs is then the host's own work alone (the scheduler's Python,
    staging, the commit, the front end and the core's messages), as it is beside a GPU's kernels. The
    tokens are whatever the emitted buffer held (zeros): meaningless answers of the asked length
    (`ignore_eos`)."""
    from runtime.backend import CpuBackend

    CpuBackend.launch = lambda self, fn, grid, block, args: None


def notes(out: Path) -> list[tuple]:
    rows = []
    for path in out.glob("notes.*"):
        for line in path.read_text().splitlines():
            a = line.split()
            rows.append((float(a[0]), float(a[1]), *map(int, a[2:])))
    return sorted(rows)


def summary(name: str, rows: list[tuple], t0: float, t1: float, tokens: int, streams: int, out: Path) -> str:
    rows = [r for r in rows if t0 <= r[0] <= t1]
    wall = t1 - t0
    if not rows:
        return f"{name}: no iterations noted"
    inside = sum(r[1] - r[0] for r in rows)
    gaps = [b[0] - a[1] for a, b in zip(rows, rows[1:])]
    fwd = [r[3] for r in rows if r[3]]
    thin = sum(b[0] - a[0] for a, b in zip(rows, rows[1:]) if a[4] < streams / 2)
    calls = [r[2] for r in rows if r[2]]
    with open(out / f"timeline-{name}.txt", "w") as f:
        f.write("# ms from the first iteration, ms long, prefill calls, forward rows, running, waiting\n")
        f.writelines("%.3f %.3f %d %d %d %d\n" % ((r[0] - rows[0][0]) * 1e3, (r[1] - r[0]) * 1e3, *r[2:])
                     for r in rows)
    return (f"{name:14} {wall * 1e3:8.1f} ms {tokens / wall:9,.0f} tok/s | {len(rows):5} iterations, "
            f"{statistics.mean(fwd) if fwd else 0:5.1f} rows a forward step | in Core.run {inside * 1e3:7.1f} ms, "
            f"between {sum(gaps) * 1e3:6.1f} ms ({statistics.mean(gaps) * 1e6 if gaps else 0:4.0f} us each, "
            f"{sum(g for g in gaps if g > 1e-3) * 1e3:5.1f} ms in gaps over 1 ms) | under half running "
            f"{thin * 1e3:6.1f} ms | {sum(calls)} prefill calls, at most {max(calls, default=0)} in one")


def _modes(ap: argparse.ArgumentParser, args) -> None:
    """--profile-core, --profile-frontend and --null-kernels, told to the server started through this file by its environment."""
    if args.profile_core:
        os.environ["KERN_PROFILE_CORE"] = str(args.profile_core.resolve())
    if args.profile_frontend:
        os.environ["KERN_PROFILE_FRONTEND"] = str(args.profile_frontend.resolve())
    if args.profile_core or args.profile_frontend:
        os.environ["KERN_PROFILE_CLOCK"] = args.profile_clock
    if args.null_kernels:
        if args.backend != "cpu":
            ap.error("--null-kernels is for --backend cpu")
        os.environ["KERN_NULL_KERNELS"] = "1"


def served(args, out: Path) -> list[tuple]:
    """The HTTP runs (`--runs` of plain, then streamed) against this checkout's `kern serve`, traced: each
    run's span (name, start, end, tokens); each run's tok/s, CPU a request and busiest threads to stderr."""
    import launch
    import serve_load as sl
    from server_threads import busiest, cpu_s, thread_cpu

    spans = []
    launch.own_kern = lambda: [sys.executable, str(Path(__file__).resolve()), "--as-kern"]
    proc, url = sl.start_server(args.target, args.backend, args.streams, out / "serve.log", args.serve_flag,
                                sl.capacity(args.streams, args.max_tokens, args.prompt_tokens))
    try:
        if args.pin:
            sl.pin(proc.pid, args.core_threads == "apart")
        sl.http_load(url, min(4, args.streams), 1, 4, args.prompt_tokens, False, 10_000_000, 1, args.client)
        for k in range(args.runs):
            for stream in (False, True):
                before, threads = cpu_s(proc.pid), thread_cpu(proc.pid)
                r = sl.http_load(url, args.streams, args.workers, args.max_tokens, args.prompt_tokens, stream,
                                 (1 + 2 * k + stream) * 1_000_000, args.rounds, args.client)
                cpu = [(a - b) / (args.streams * args.rounds) * 1e6 for a, b in zip(cpu_s(proc.pid), before)]
                spans.append((f"{'stream' if stream else 'http'}-{k + 1}", r["t0"], r["t0"] + r["wall"], r["tokens"]))
                print(f"{spans[-1][0]}: {r['tok_s']:,.0f} tok/s; CPU a request: front ends {cpu[0]:,.0f} us, "
                      f"engine core {cpu[1]:,.0f} us; busiest threads: "
                      f"{busiest(threads, thread_cpu(proc.pid), r['wall'])}", file=sys.stderr, flush=True)
        time.sleep(0.5)
    finally:
        launch.stop(proc, 30)
    return spans


def main() -> None:
    sys.path.insert(0, str(HERE))
    import serve_load as sl

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sl.loop_args(ap)
    ap.add_argument("--runs", type=int, default=2, help="runs of each path (engine alone, HTTP, HTTP streaming)")
    ap.add_argument("--out", type=Path, default=None, help="where the notes and timelines go (default: a temporary "
                    "folder, named at the end)")
    ap.add_argument("--null-kernels", action="store_true", help="the CPU backend's kernels not run, here and in the "
                    "server (the answers meaningless): the host's own cost a step, as beside a GPU's kernels")
    ap.add_argument("--profile-core", type=Path, default=None, help="the server's scheduler thread under cProfile, "
                    "its stats written to PATH.<pid> (`python -m pstats`); times inflated by the profiler")
    ap.add_argument("--profile-frontend", type=Path, default=None, help="the server's front end (its event loop "
                    "while it serves) under cProfile, its stats written to PATH.<pid> when it stops")
    ap.add_argument("--profile-clock", choices=("wall", "cpu"), default="wall", help="--profile-core's and "
                    "--profile-frontend's clock: the wall "
                    "(default) or the profiled thread's own CPU time (time.thread_time: its time switched out not counted)")
    args = ap.parse_args()
    _modes(ap, args)
    sl.loop_setup(ap, args)
    pin, workers = args.pin, args.workers
    out = args.out or Path(tempfile.mkdtemp(prefix="kern-timeline-"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ["KERN_TIMELINE"] = str(out / "notes")
    trace()
    alone = sl.Alone(args.target, args.backend, args.streams, args.max_tokens, args.prompt_tokens, args.serve_flag,
                     args.rounds)
    if pin:
        alone.cpu = 0
    alone.warm()
    spans = []
    for k in range(args.runs):
        t0 = time.perf_counter()
        tok, _, _ = profiled_alone(alone, args.profile_core, args.profile_clock)
        t1 = time.perf_counter()
        spans.append((f"alone-{k + 1}", t0, t1, round(tok * (t1 - t0))))
    _flush()
    spans += served(args, out)
    rows = notes(out)
    print(f"{args.target}, backend {args.backend}, {args.streams} streams x {args.rounds} requests x {args.max_tokens} "
          f"tokens, {workers} client processes{', pinned' if pin else ''}")
    for name, t0, t1, tokens in spans:
        print(summary(name, rows, t0, t1, tokens, args.streams, out))
    print(f"timelines under {out}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--as-kern":  # the server, traced (started by main above)
        sys.argv = [sys.argv[0], *sys.argv[2:]]
        sys.path.insert(0, str(REPO))
        trace()
        from kern.cli import main as kern

        kern()
    else:
        main()
