"""A warm parent for `kern` processes: imported and compiled once, forked for each command.

    kern zygote [--config FILE] [--warm TARGET ...]     (what `e2e` starts: python -m kern.cli zygote ...)

The gate starts a dozen servers a target, and each fresh `kern serve` pays Python's imports (about
0.8 s) and numba's loading of its cached kernels on the first request (about 0.9 s) before it
answers. This process pays them once: it imports the CLI, the server and the runtime, runs a few
tokens through the runtime for each ``--warm`` target on the CPU, then forks a child for each command
it is sent. A child is the command's own process, as `python -m kern.cli ARGV` would be: its own
session (`setsid`: signals and `killpg` reach it and what it starts), its stdout and stderr the log
file named, its exit code the command's. What it inherits is only what import and compilation leave.

numba's OpenMP threading layer refuses to run in a child forked after it ran (GNU OpenMP is not fork
safe), so this process, and every child, uses numba's ``workqueue`` layer. The GPU is never touched
here (CUDA forbids a fork after it is initialised): a `--backend gpu` child initialises its own.

Protocol (JSON lines; stdin in, stdout out): first ``{"ready": true, "frozen": N, "warm_s": S}`` (N: the
objects of the warm heap frozen before any fork, `freeze`); then for each
request ``{"argv": [...], "log": PATH, "env": {...}}`` the reply ``{"pid": N}`` (or ``{"error": why}``),
and whenever a child ends ``{"exit": N, "code": C, "cpu_s": [USER, SYS], "maxrss_kib": K}`` (C < 0:
killed by signal -C, as `subprocess` says it; the CPU seconds and peak memory are the child's own).
When stdin closes every child still running is killed and this process exits.

The command a child runs is given from above (`main`'s `command`: `kern.cli.run_command`, for the
hidden verb `kern zygote`), so this module imports nothing of the `kern` command's face.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from typing import Callable

from kern.child import exit_with, fresh_signals

os.environ["NUMBA_THREADING_LAYER"] = "workqueue"  # before numba is imported: see the docstring


def _say(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


Command = Callable[[list[str]], int]
"""A `kern` command line (its arguments) -> its exit code, as its process would have had it."""


def warm(config: str | None, targets: list[str], command: Command) -> None:
    """Import what a server imports and run a few tokens of each target through the runtime (CPU)."""
    t0 = time.monotonic()
    _say({"warming": "importing the server (fastapi, uvicorn, numba)"})
    import serve.api.app  # noqa: F401  (the server's imports)
    import serve.cli  # noqa: F401

    base = ["--config", config] if config else []
    for i, t in enumerate(targets, 1):
        _say({"warming": f"running {t}'s kernels once, {i}/{len(targets)} (numba compiles them on a fresh clone; "
                         f"{time.monotonic() - t0:.0f}s so far)"})
        for rows in ("1", None):
            argv = [*base, "run", t, "--steps", "3", "--backend", "cpu", "--prompt", "warm"]
            if rows:
                argv += ["--rows", rows]
            saved = [os.dup(1), os.dup(2)]
            null = os.open(os.devnull, os.O_WRONLY)
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(null, 1)
            os.dup2(null, 2)
            try:
                command(argv)
            except BaseException:  # a target that cannot run warm is the child's to report, not ours
                pass
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                for fd in (*saved, null):
                    os.close(fd)


GPU_MODULES = ("toy.kernels.cuda", "toy.float_kernels.cuda", "toy.layers.cuda", "toy.attn.cuda")


def gpu_imports() -> str:
    """Import the GPU backend (cupy, numba.cuda) and the CUDA kernel modules without touching a
    device, so a GPU child pays only its own CUDA context; what was imported, or why not. A driver
    that this left initialised would make every forked child's CUDA fail: that is an error."""
    try:
        import runtime.gpu

        runtime.gpu.numba_cuda()
        import importlib

        for name in GPU_MODULES:
            importlib.import_module(name)
    except Exception as exc:  # no cupy or no CUDA toolkit here: the children import what they can
        return f"none ({type(exc).__name__}: {exc})"
    from numba.cuda.cudadrv.driver import driver

    if getattr(driver, "is_initialized", False):
        raise SystemExit("kern zygote: importing the GPU modules initialised CUDA; a forked child could not use it")
    return "cupy, numba.cuda, " + ", ".join(GPU_MODULES)


def child(argv: list[str], log: str, env: dict[str, str], command: Command, inherited: tuple[int, ...] = ()) -> None:
    """In the forked child: become the command's process, run it, exit with its code. `inherited`:
    the zygote's own descriptors (its signal pipe), closed here."""

    def become() -> int | None:
        for fd in inherited:
            os.close(fd)
        os.setsid()
        fresh_signals()
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ.update(env)
        sys.argv = ["kern", *argv]
        return command(argv)

    exit_with(become)


def serve_requests(command: Command) -> None:
    rd, wr = os.pipe()
    os.set_blocking(wr, False)
    signal.set_wakeup_fd(wr)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the gate's Ctrl-C is the gate's to handle; stdin's end is ours
    live: set[int] = set()
    buf = b""
    stdin = sys.stdin.buffer.raw if hasattr(sys.stdin.buffer, "raw") else sys.stdin.buffer
    while True:
        try:
            ready, _, _ = select.select([stdin, rd], [], [])
        except InterruptedError:
            ready = [rd]
        if rd in ready:
            try:
                os.read(rd, 4096)
            except BlockingIOError:
                pass
        _reap(live)
        if stdin in ready:
            data = os.read(stdin.fileno(), 65536)
            if not data:
                break
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.strip():
                    _spawn(line, live, command, (rd, wr))
    for pid in live:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + 10
    while live and time.monotonic() < deadline:
        _reap(live)
        time.sleep(0.01)


def _spawn(line: bytes, live: set[int], command: Command, inherited: tuple[int, ...]) -> None:
    try:
        req = json.loads(line)
        argv, log, env = list(map(str, req["argv"])), str(req["log"]), dict(req.get("env") or {})
    except (ValueError, KeyError, TypeError) as exc:
        _say({"error": f"bad request {line[:200]!r}: {exc}"})
        return
    pid = os.fork()
    if pid == 0:
        child(argv, log, env, command, inherited)
    live.add(pid)
    _say({"pid": pid})


def _reap(live: set[int]) -> None:
    while live:
        try:
            pid, status, use = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        live.discard(pid)
        _say({"exit": pid, "code": os.waitstatus_to_exitcode(status),
              "cpu_s": [round(use.ru_utime, 3), round(use.ru_stime, 3)], "maxrss_kib": use.ru_maxrss})


def main(argv: list[str] | None, command: Command) -> None:
    """`kern zygote ARGV`: warm, say ready, then fork a child running `command` for each request."""
    import argparse

    ap = argparse.ArgumentParser(prog="kern zygote", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=None, help="the config the --warm targets are named in")
    ap.add_argument("--warm", nargs="*", default=[], help="targets whose CPU kernels are run once before serving")
    ap.add_argument("--gpu-imports", action="store_true",
                    help="also import the GPU backend and the CUDA kernel modules (no device is touched)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    warm(args.config, args.warm, command)
    ready = {"ready": True}
    if args.gpu_imports:
        ready["gpu_imports"] = gpu_imports()
    ready["frozen"] = freeze()
    _say({**ready, "warm_s": round(time.monotonic() - t0, 2)})
    serve_requests(command)


def freeze() -> int:
    """The warm heap moved to the collector's permanent generation before any fork (`gc.freeze`, as
    Python's documentation advises for a parent that forks without exec); how many objects. A child's
    collections then never traverse what it inherited: a server's first full one (its own
    `freeze_heap` once warm) walked every object of the zygote's, which cost its CPU and wrote to each
    one's header, so the kernel copied those pages into the child. A forked `kern serve toy-paged`
    answering 20 requests spent 0.30 s user and 0.18 s system without this, 0.20 and 0.12 with it."""
    import gc

    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
