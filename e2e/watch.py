"""A request that makes no progress names itself within seconds instead of costing the client's timeout.

While the gate waits on a completion it watches the server from a second connection. ``GET /stats``
is answered on the scheduler's own thread between iterations, so an answer says the scheduler is free;
a scheduler in a long step (numba compiling on first use, a loaded box) simply answers late, and that
is never called a hang. The rule: the request is still unanswered, and two answers of ``/stats`` at
least `STILL_S` apart show the same step counter (so nothing ran in between: no request was running)
— the scheduler is idle while this request waits, or holds it nowhere. That is `Hung`, naming the
request, what ``/stats`` said of the queues, and the server's log.

The one other hang: the server stops answering ``/stats`` at all (a wedged scheduler thread, an
endless step, a stopped process) for `STALL_S`, far longer than any step takes (numba compiling on
a fresh clone takes about a minute) and still well inside the client's 300 s; the note then says how
long ``/stats`` has been silent, what it said last, and what ``/stats/live`` (answered off the
scheduler's thread) says: how long the scheduler has been busy in one iteration and in a runtime
step, or that the process answers nothing.

A server without ``/stats`` (the Rust kern) is not watched: its requests keep the client's timeout.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Callable

import httpx

from e2e.tls import tls
from kern.errors import KernError

__all__ = ["Hung", "Watch", "WATCH_AFTER_S", "STALL_S", "STILL_S"]

WATCH_AFTER_S = 2.0  # a request answered sooner is never watched (most are)
POLL_S = 0.5
STILL_S = 5.0  # the step counter unchanged this long while the scheduler answers: idle
STALL_S = 180.0  # /stats unanswered this long while the request waits: the server stopped answering


class Hung(KernError, RuntimeError):
    """A request the server holds without progress: its scheduler is idle and the request unanswered."""


class Watch:
    """Waits on a request's future; `wait` raises `Hung` when the rule above holds."""

    def __init__(self, url: str, log_path: str, headers: dict[str, str] | None = None,
                 still_s: float = STILL_S, after_s: float = WATCH_AFTER_S, stall_s: float | None = None) -> None:
        self.url = url
        self.log_path = log_path
        self.headers = headers or {}
        self.still_s = still_s
        self.after_s = after_s
        self.stall_s = STALL_S if stall_s is None else stall_s
        self.has_stats: bool | None = None
        self.live: dict[str, Any] | None = None  # what /stats/live said when /stats last did not answer

    def _stats(self) -> dict[str, Any] | None:
        try:
            r = httpx.get(self.url + "/stats", headers=self.headers, timeout=POLL_S * 4, verify=tls())
        except httpx.TimeoutException:
            self.live = self._live()  # busy (in a step?): not idle; /stats/live says what it is doing
            return None
        except httpx.TransportError:
            return None  # the caller's request fails on its own, with the exit code
        if r.status_code == 503:  # a front end that answers for a core that does not (kern serve): silent
            self.live = self._live()
            return None
        if r.status_code != 200:
            self.has_stats = False
            return None
        try:
            data = r.json()
        except ValueError:
            self.has_stats = False
            return None
        self.has_stats = True
        return data

    def _live(self, timeout: float = POLL_S * 2) -> dict[str, Any] | None:
        """``GET /stats/live`` (answered off the scheduler's thread), or None: no answer within
        `timeout`, or no such endpoint (an older server, the Rust kern)."""
        try:
            r = httpx.get(self.url + "/stats/live", headers=self.headers, timeout=timeout, verify=tls())
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def wait(self, fut: concurrent.futures.Future, what: str, timeout: float | None,
             alive: Callable[[], None] = lambda: None) -> Any:
        """The future's result; `Hung` when the server idles with it unanswered; TimeoutError past
        `timeout` (None: no bound) as the client's own timeout would."""
        t0 = time.monotonic()
        try:
            return fut.result(timeout=self.after_s)
        except concurrent.futures.TimeoutError:
            pass
        seen: tuple[float, int] | None = None  # (when, steps) of the first idle-looking answer
        heard: tuple[float, dict[str, Any] | None] = (time.monotonic(), None)  # the last /stats answer
        restarting: float | None = None  # since when /stats has said a pipeline stage is starting again
        while True:
            if timeout is not None and time.monotonic() - t0 > timeout:
                raise httpx.ReadTimeout(f"{what}: no answer within {timeout:.0f}s")
            if self.has_stats is not False:
                stats = self._stats()
                if fut.done():
                    return fut.result()
                now = time.monotonic()
                if stats is None and self.has_stats is not False and now - heard[0] >= self.stall_s:
                    alive()  # a server that died says so with its exit code first
                    if fut.done():
                        return fut.result()
                    raise Hung(self._silent(what, heard[1], now - heard[0], now - t0))
                if stats is not None:
                    heard = (now, stats)
                    steps = int((stats.get("counters") or {}).get("steps", -1))
                    if (stats.get("pipeline") or {}).get("restarting"):
                        restarting = now if restarting is None else restarting
                    else:
                        restarting = None
                    if restarting is not None and now - restarting < self.stall_s:
                        seen = None  # a stage starting again (seconds under load): at work, not idle
                    elif seen is None or seen[1] != steps:
                        seen = (now, steps)
                    elif now - seen[0] >= self.still_s:
                        alive()  # a server that died says so with its exit code first
                        if fut.done():
                            return fut.result()
                        raise Hung(self._note(what, stats, now - seen[0], now - t0))
            try:
                return fut.result(timeout=POLL_S)
            except concurrent.futures.TimeoutError:
                continue

    def _note(self, what: str, stats: dict[str, Any], still: float, waited: float) -> str:
        steps = (stats.get("counters") or {}).get("steps")
        return (f"{what} got no answer in {waited:.1f}s; the scheduler has been idle {still:.1f}s "
                f"(steps stayed at {steps}) with {_state(stats)}; server log: {self.log_path}")

    def _silent(self, what: str, last: dict[str, Any] | None, silent: float, waited: float) -> str:
        said = "/stats never answered while this request waited" if last is None else (
            f"/stats last said steps={(last.get('counters') or {}).get('steps')} with {_state(last)}")
        live = self.live
        if live is None:
            now = "/stats/live did not answer either (a process that stopped answering, or a server without it)"
        else:
            step = live.get("step_s")
            now = (f"/stats/live says the scheduler has been busy {live.get('busy_s')}s in one iteration, "
                   + (f"in a runtime step for {step}s" if step is not None else "not in a runtime step")
                   + f" (steps={live.get('steps')}, running={live.get('running')}, waiting={live.get('waiting')})")
        return (f"{what} got no answer in {waited:.1f}s; the server has not answered /stats for {silent:.1f}s; "
                f"{now}; {said}; server log: {self.log_path}")


def _state(stats: dict[str, Any]) -> str:
    """What /stats says of the queues (the requests' names) and the pool."""
    g = stats.get("gauges") or {}
    q = stats.get("queue") or {}
    restarting = ", a pipeline stage restarting" if (stats.get("pipeline") or {}).get("restarting") else ""
    return (f"running={g.get('running')} {q.get('running', [])}, waiting={g.get('waiting')} "
            f"{q.get('waiting', [])}, leases={g.get('leases')}, pages_used={g.get('pages_used')}{restarting}")
