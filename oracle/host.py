"""A warm process that runs several `kern` commands at once, each in a thread of its own.

    kern host [--backend cpu|gpu] [--config FILE] [--warm TARGET ...] [--gpu-wait MODE]
                                                    (what `e2e` starts: python -m kern.cli host ...)

On a GPU every process pays its own CUDA context, and the driver makes contexts one at a time
(about 0.2 s each on an H200, `bench/cuda_contexts.py`): a gate that starts sixty GPU processes
waits 11 s or more for the driver alone. A host makes its context once, before it says it is
ready, and then runs each command it is sent (`kern serve`, `kern test`, `kern run`) in a thread,
all of them on that context. Its threads wait on the GPU by blocking, not by spinning as CUDA
would for a process with one context (`--gpu-wait`): a host runs many threads that wait at once.
What a command needs of "its process" it gets from `serve.common.hosted`:

- its output: this process's `sys.stdout` and `sys.stderr` write to the command's log, chosen by
  the thread's context (every thread a command starts runs in its context: `inherit_context`);
- its environment (`RUST_LOG`): `serve.common.hosted.getenv` reads the command's first;
- its signals: the message ``{"signal": ID, "sig": N}`` stops a server as SIGTERM would (drain);
  SIGKILL (or SIGINT twice) forces it. A command that cannot be stopped (a `kern run`) is reported
  killed at once and left to finish with its output dropped;
- its exit code: `sys.exit` ends the thread, not the process; a scheduler that crashes ends its
  command with 101 and stops its server (`serve.common.hosted.crashed`).

Protocol (JSON lines; stdin in, stdout out), as `oracle/zygote.py`'s: first ``{"ready": true,
"warm_s": S, "split": {"imports_s": A, "device_s": B, "targets_s": C}, "host_pid": P, "backend":
D}`` (or ``{"ready": false, "error": why}`` and exit 1); for each ``{"argv": [...], "log": PATH,
"env": {...}}`` the reply ``{"pid": ID}`` (ID names the command: it is no process) or ``{"error":
why}``; ``{"signal": ID, "sig": N}`` is answered by nothing; and whenever a command ends ``{"exit":
ID, "code": C}`` (C < 0: killed by signal -C). When stdin closes every command still running is
told SIGKILL, and the host says ``{"bye": true, "cpu_s": [USER, SYS], "maxrss_kib": K}`` (its own,
all its commands together) and exits.

The command a thread runs is given from above (`main`'s `command`: `kern.cli.run_command`, for the
hidden verb `kern host`), so this module imports nothing of the `kern` command's face.
"""

from __future__ import annotations

import contextvars
import io
import json
import os
import resource
import signal
import sys
import threading
import time
import traceback
from typing import Callable

# CPU commands launch parallel kernels from several threads at once: only the omp and tbb layers
# allow that (numba's workqueue layer aborts the process)
os.environ.setdefault("NUMBA_THREADING_LAYER", "threadsafe")

from serve.common import hosted  # noqa: E402  (after the threading layer is chosen)

Command = Callable[[list[str]], int]
"""A `kern` command line (its arguments) -> its exit code, as its process would have had it."""

_OUT = threading.Lock()  # one protocol line at a time
_real_stdout = sys.stdout


def _say(obj: dict) -> None:
    with _OUT:
        _real_stdout.write(json.dumps(obj) + "\n")
        _real_stdout.flush()


_SINK: contextvars.ContextVar["Running | None"] = contextvars.ContextVar("kern_host_sink", default=None)


class Routed(io.TextIOBase):
    """This process's stdout or stderr: each write goes to the log of the command whose thread wrote
    it, or (outside any command) to `fallback`, the host's own stream."""

    def __init__(self, fallback):
        self.fallback = fallback

    def _target(self):
        r = _SINK.get()
        return self.fallback if r is None else r.stream

    def write(self, s: str) -> int:
        return self._target().write(s)

    def flush(self) -> None:
        self._target().flush()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._target().fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._target(), "encoding", "utf-8")

    @property
    def errors(self) -> str:
        return getattr(self._target(), "errors", "strict")


class _Null(io.TextIOBase):
    def write(self, s: str) -> int:
        return len(s)

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a killed command's output goes nowhere")


class Running:
    """One command in its thread: its id, its `serve.common.hosted.Command`, whether its exit was reported."""

    def __init__(self, cid: int, argv: list[str], log: str, env: dict[str, str], run: Command):
        self.cid, self.argv, self.log, self.run = cid, argv, log, run
        self.command = hosted.Command(env=dict(env), ended=self.report)
        self.reported = False
        self.lock = threading.Lock()
        self.sink: io.TextIOBase | None = None
        self.null = _Null()
        self.thread = threading.Thread(target=self._run, name=f"command-{cid}", daemon=True)

    def report(self, code: int) -> None:
        """Say the command ended with `code`, once; what it writes after that is dropped."""
        with self.lock:
            if self.reported:
                return
            self.reported = True
        if self.sink is not None:
            try:
                self.sink.flush()
            except (OSError, ValueError):
                pass
        _say({"exit": self.cid, "code": code})
        _LIVE.pop(self.cid, None)

    @property
    def stream(self):
        """Where the command's output goes: its log, until its exit was reported (then nowhere)."""
        return self.null if self.reported or self.sink is None else self.sink

    def signal(self, sig: int) -> None:
        stoppable = self.command.signal(sig)
        if sig == signal.SIGKILL or not stoppable:
            self.report(-sig)  # killed: reported now, whatever the thread still does

    def _run(self) -> None:
        code = 1
        try:
            self.sink = open(self.log, "a", buffering=1, encoding="utf-8", errors="replace")
        except OSError as exc:
            _say({"exit": self.cid, "code": 1, "error": f"cannot open the log {self.log}: {exc}"})
            _LIVE.pop(self.cid, None)
            return
        _SINK.set(self)
        hosted.COMMAND.set(self.command)
        try:
            code = self.run(self.argv)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            self.report(code)
            _SINK.set(None)
            try:
                self.sink.close()
            except OSError:
                pass


_LIVE: dict[int, Running] = {}


def warm(backend: str, config: str | None, targets: list[str], split: dict[str, float], command: Command,
         gpu_wait: str = "blocking") -> str:
    """Make this process's device (a GPU: its one CUDA context) and run a few tokens of each target
    through the runtime, so the first command pays neither; what the device is. `split` gets the
    seconds of each part: imports_s, device_s, targets_s."""
    began = time.monotonic()
    import serve.api.app  # noqa: F401  (what a server imports: fastapi, uvicorn; a second in the first server's start)
    import serve.cli  # noqa: F401

    split["imports_s"] = round(time.monotonic() - began, 2)
    began = time.monotonic()
    if backend == "gpu":
        from runtime.backends import make_backend
        from runtime.gpu import set_wait

        try:
            set_wait(gpu_wait)  # before the context is made
        except RuntimeError as exc:  # the driver's default wait, then: slower under load, not wrong
            print(f"host: could not set the GPU wait to {gpu_wait}: {exc}", file=sys.__stderr__, flush=True)
        make_backend("gpu").synchronize()
    else:
        _threadsafe_layer()
    split["device_s"] = round(time.monotonic() - began, 2)
    began = time.monotonic()
    base = ["--config", config] if config else []
    quiet = Running(0, [], os.devnull, {}, command)
    quiet.sink = open(os.devnull, "w")
    token = _SINK.set(quiet)
    try:
        for t in targets:
            try:
                command([*base, "run", t, "--steps", "3", "--backend", backend, "--prompt", "warm"])
            except BaseException:  # a target that cannot run warm is its command's to report, not ours
                pass
    finally:
        _SINK.reset(token)
        quiet.sink.close()
    split["targets_s"] = round(time.monotonic() - began, 2)
    return backend


def _threadsafe_layer() -> None:
    """Start numba's threading layer now and make sure it allows parallel kernels from several
    threads at once (omp or tbb): with none of those, CPU servers in one process would abort it."""
    from oracle.cache import THREADSAFE_LAYERS, threading_layer

    layer = threading_layer()
    if layer not in THREADSAFE_LAYERS:
        raise RuntimeError(f"numba's {layer or 'unloadable'} threading layer cannot run kernels from several "
                           "threads at once; install tbb, or give each server its own process (e2e --hosts 0)")


def serve_requests(command: Command) -> None:
    ids = iter(range(1, 1 << 62))
    for raw in sys.stdin.buffer:
        line = raw.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            if "signal" in req:
                r = _LIVE.get(int(req["signal"]))
                if r is not None:
                    r.signal(int(req["sig"]))
                continue
            argv, log, env = list(map(str, req["argv"])), str(req["log"]), dict(req.get("env") or {})
        except (ValueError, KeyError, TypeError) as exc:
            _say({"error": f"bad request {line[:200]!r}: {exc}"})
            continue
        r = Running(next(ids), argv, log, {str(k): str(v) for k, v in env.items()}, command)
        _LIVE[r.cid] = r
        _say({"pid": r.cid})
        r.thread.start()
    left = list(_LIVE.values())
    for r in left:  # stdin closed: the gate is gone, so is every command
        r.signal(signal.SIGKILL)
    deadline = time.monotonic() + 5
    for r in left:
        r.thread.join(max(deadline - time.monotonic(), 0))


def main(argv: list[str] | None, command: Command) -> None:
    """`kern host ARGV`: make the device, warm, say ready, then run `command` in a thread for each request."""
    import argparse

    ap = argparse.ArgumentParser(prog="kern host", description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("cpu", "gpu"), default="gpu", help="the device made before ready")
    ap.add_argument("--config", default=None, help="the config the --warm targets are named in")
    ap.add_argument("--warm", nargs="*", default=[], help="targets run for a few tokens before ready")
    ap.add_argument("--gpu-wait", choices=("spin", "yield", "blocking"),
                    default=os.environ.get("KERN_HOST_GPU_WAIT", "blocking"),
                    help="how its threads wait on the GPU (default blocking, or $KERN_HOST_GPU_WAIT): a "
                         "spinning wait takes a core for each waiting thread, and a host runs many")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the gate's Ctrl-C is the gate's; stdin's end is ours
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a client's hang-up is an error on its socket
    sys.stdout = Routed(sys.stdout)
    sys.stderr = Routed(sys.stderr)
    hosted.inherit_context()
    split: dict[str, float] = {}
    try:
        device = warm(args.backend, args.config, args.warm, split, command, args.gpu_wait)
    except Exception as exc:
        _say({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        sys.exit(1)
    _say({"ready": True, "warm_s": round(time.monotonic() - t0, 2), "split": split, "host_pid": os.getpid(),
          "backend": device})
    serve_requests(command)
    use = resource.getrusage(resource.RUSAGE_SELF)
    _say({"bye": True, "cpu_s": [round(use.ru_utime, 2), round(use.ru_stime, 2)], "maxrss_kib": use.ru_maxrss})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # daemon command threads (killed servers finishing) do not hold the exit
