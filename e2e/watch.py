"""A request that makes no progress names itself within seconds instead of costing the client's timeout.

While the gate waits on a completion it watches the server from a second connection. ``GET /stats``
is answered on the scheduler's own thread between iterations, so an answer says the scheduler is free;
a scheduler in a long step (numba compiling on first use, a loaded box) simply answers late, and that
is never called a hang. The rule: the request is still unanswered, and two answers of ``/stats`` at
least `STILL_S` apart show the same step counter (so nothing ran in between: no request was running)
— the scheduler is idle while this request waits, or holds it nowhere. That is `Hung`, naming the
request, what ``/stats`` said of the queues, and the server's log.

A server without ``/stats`` (the Rust kern) is not watched: its requests keep the client's timeout.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Callable

import httpx

__all__ = ["Hung", "Watch", "WATCH_AFTER_S", "STILL_S"]

WATCH_AFTER_S = 2.0  # a request answered sooner is never watched (most are)
POLL_S = 0.5
STILL_S = 5.0  # the step counter unchanged this long while the scheduler answers: idle


class Hung(RuntimeError):
    """A request the server holds without progress: its scheduler is idle and the request unanswered."""


class Watch:
    """Waits on a request's future; `wait` raises `Hung` when the rule above holds."""

    def __init__(self, url: str, log_path: str, headers: dict[str, str] | None = None,
                 still_s: float = STILL_S, after_s: float = WATCH_AFTER_S) -> None:
        self.url = url
        self.log_path = log_path
        self.headers = headers or {}
        self.still_s = still_s
        self.after_s = after_s
        self.has_stats: bool | None = None

    def _stats(self) -> dict[str, Any] | None:
        try:
            r = httpx.get(self.url + "/stats", headers=self.headers, timeout=POLL_S * 4)
        except httpx.TimeoutException:
            return None  # busy in a step: not idle
        except httpx.TransportError:
            return None  # the caller's request fails on its own, with the exit code
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
        while True:
            if timeout is not None and time.monotonic() - t0 > timeout:
                raise httpx.ReadTimeout(f"{what}: no answer within {timeout:.0f}s")
            if self.has_stats is not False:
                stats = self._stats()
                if fut.done():
                    return fut.result()
                if stats is not None:
                    steps = int((stats.get("counters") or {}).get("steps", -1))
                    now = time.monotonic()
                    if seen is None or seen[1] != steps:
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
        g = stats.get("gauges") or {}
        q = stats.get("queue") or {}
        steps = (stats.get("counters") or {}).get("steps")
        queues = (f"running={g.get('running')} {q.get('running', [])}, waiting={g.get('waiting')} "
                  f"{q.get('waiting', [])}")
        return (f"{what} got no answer in {waited:.1f}s; the scheduler has been idle {still:.1f}s "
                f"(steps stayed at {steps}) with {queues}, leases={g.get('leases')}, "
                f"pages_used={g.get('pages_used')}; server log: {self.log_path}")
