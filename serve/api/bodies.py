"""Request bodies parsed and checked off the event loop, in a worker process.

A body of a few MiB (a prompt of a million token ids) takes the JSON parser and the checks 0.1-0.2 s
of CPU, and tens of them at once held the loop for seconds: /health, and clients whose bodies had
arrived, waited (408s for bodies that were there). A thread is not enough: while it parses it holds
the interpreter lock, and every socket read the loop makes then waits up to the 5 ms switch interval
for it, so 48 connections streaming bodies still stalled /health for a second.

`check(kind, raw, *args)` runs `validate.parse(raw)` and the endpoint's checks (`run`): inline for a small body (the hop costs more than
the work), else in one worker process (`python -c`, importing serve.api.validate only) that the loop
reaches through one thread blocked on its pipes. Large bodies queue there one at a time while the loop
keeps answering, one queue per client (its peer address) taken in turn (`Fair`), so one client's
burst of large bodies delays another's by one body at most, not by the burst; the worker runs at a lower CPU priority (`NICE`), so on a machine short of cores the
loop and the scheduler are not slowed by a burst of parsing either. A worker that dies is started again; the call that found it dead runs on that thread
instead (the loop still never parses), so a large body never goes unanswered.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import os
import pickle
import struct
import subprocess
import sys
import threading
from typing import Any

__all__ = ["INLINE_BYTES", "Fair", "check", "run"]

INLINE_BYTES = 64 << 10  # bodies up to this size are parsed on the loop
NICE = 10  # the worker's CPU priority below the server's
_LEN = struct.Struct("!Q")


def run(kind: str, raw: bytes, *args) -> Any:
    """`validate.parse(raw)`, then what `kind` asks of the body:

    - "completion" / "chat" (model, sampling, rows, reach): `validate.<kind>(body, model, sampling)`, and
      the room rule's first test (one sequence's reach), so a prompt of millions of ids is refused
      here rather than shipped back;
    - "tokenize" (model, max_tokens): `validate.tokenize`, a 413 over `max_tokens` (--max-tokenize-tokens);
    - "detokenize" (model): `validate.detokenize`.
    """
    from serve.api import validate

    body = validate.parse(raw)
    if kind in ("completion", "chat"):
        model, sampling, rows, reach = args
        ask = getattr(validate, kind)(body, model, sampling)
        validate.room(ask, rows, reach, sys.maxsize, sys.maxsize)  # the rest of the rule: serve/api/app.py
        return ask
    if kind == "tokenize":
        model, most = args
        ids = validate.tokenize(body, model)
        if len(ids) > most:
            raise validate.ApiError(413, f"the input is {len(ids)} tokens; /tokenize takes at most {most} "
                                    "(--max-tokenize-tokens)", "prompt", "input_too_large")
        return ids
    if kind == "detokenize":
        return validate.detokenize(body, *args)
    raise ValueError(f"unknown body kind {kind!r}")


class Fair:
    """Calls run one at a time on one thread (started at the first), one queue per client, the clients
    taken in turn: a client's next call waits for every other waiting client's one."""

    def __init__(self) -> None:
        self.queues: dict[str, collections.deque] = {}  # client -> its calls; the dict's order is the turn
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None

    def submit(self, client: str, fn, *args) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self.cond:
            self.queues.setdefault(client, collections.deque()).append((fut, fn, args))
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="kern-bodies", daemon=True)
                self.thread.start()
            self.cond.notify()
        return fut

    def _next(self):
        with self.cond:
            while not self.queues:
                self.cond.wait()
            client = next(iter(self.queues))
            q = self.queues.pop(client)
            call = q.popleft()
            if q:
                self.queues[client] = q  # to the back of the turn
            return call

    def _run(self) -> None:
        from serve.common.threads import name_native

        name_native("kern-bodies")
        while True:
            fut, fn, args = self._next()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - the caller's to answer
                fut.set_exception(exc)


class _Worker:
    """One child process answering `run` calls over its stdin/stdout, started at first use."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.pool = Fair()

    def _start(self) -> subprocess.Popen:
        root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))  # the checkout (serve/api/..)
        code = f"import sys; sys.path.insert(0, {root!r}); from serve.api.bodies import _serve; _serve()"
        return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, close_fds=True)

    def call(self, kind: str, raw: bytes, args: tuple) -> Any:
        with self.lock:
            try:
                if self.proc is None or self.proc.poll() is not None:
                    self.proc = self._start()
                data = pickle.dumps((kind, raw, args), protocol=pickle.HIGHEST_PROTOCOL)
                self.proc.stdin.write(_LEN.pack(len(data)) + data)
                self.proc.stdin.flush()
                head = self.proc.stdout.read(_LEN.size)
                if len(head) < _LEN.size:
                    raise EOFError("the body worker exited")
                ok, value = pickle.loads(self.proc.stdout.read(_LEN.unpack(head)[0]))
            except (OSError, EOFError, pickle.UnpicklingError, ValueError):
                self._kill()
                return run(kind, raw, *args)  # here, on this thread: still off the loop
        if ok:
            return value
        raise value

    def _kill(self) -> None:
        if self.proc is not None:
            try:
                self.proc.kill()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self.proc = None


_worker = _Worker()


async def check(kind: str, raw: bytes, *args, client: str = "") -> Any:
    """`run(kind, raw, *args)`: inline for a body up to `INLINE_BYTES`, else in the worker process, in
    `client`'s turn (its peer address)."""
    if len(raw) <= INLINE_BYTES:
        return run(kind, raw, *args)
    return await asyncio.wrap_future(_worker.pool.submit(client, _worker.call, kind, raw, args))


def _serve() -> None:
    """The worker's loop: read a call, answer (True, value) or (False, the exception), until stdin ends."""
    from serve.api.validate import ApiError

    try:  # the loop and the scheduler come first when the CPU is short
        os.nice(NICE)
    except OSError:
        pass
    src, dst = sys.stdin.buffer, sys.stdout.buffer
    while True:
        head = src.read(_LEN.size)
        if len(head) < _LEN.size:
            return
        kind, raw, args = pickle.loads(src.read(_LEN.unpack(head)[0]))
        try:
            out = (True, run(kind, raw, *args))
        except ApiError as exc:
            out = (False, exc)
        except Exception as exc:  # noqa: BLE001 - the server answers it as any unexpected error
            out = (False, RuntimeError(f"{type(exc).__name__}: {exc}"))
        data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        dst.write(_LEN.pack(len(data)) + data)
        dst.flush()
