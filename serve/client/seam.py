"""The seam between the HTTP front end and the engine core, named: what the routes and the server's
life (start, drain, stop) use of the core, whether it runs in this process or another.

Two implementations, chosen once when the server starts (`serve.cli._start`: the engine core in a
process of its own with ``--frontend-process`` / ``--frontends N``, else in this one), as vLLM's
`EngineCoreClient.make_client` chooses between its in-process and multiprocess clients:

- `serve.core.scheduler.Scheduler`: the scheduler thread of this process (`Delivery.STEPS`);
- `serve.client.frontend.RemoteScheduler`: the engine core in another process, over ZeroMQ (`Delivery.HELD`).

Both are held to `EngineClient` by `tests/test_serve_client.py`. What the routes read of the engine
itself (its sizes and facts) is `EngineView`: `serve.core.engine.Engine` in process, the facts the core
sent (`serve.client.frontend.RemoteEngine`) otherwise.

What crosses the seam is defined beside the core, which makes it (`serve.core.request`: a `Request`, its
`Update`s and `Done`, `Delivery`; `serve.core.stats`: the counters' and gauges' names), as vLLM keeps
`EngineCoreRequest` beside its engine core; the HTTP side reads them here, never from the core.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, runtime_checkable

from serve.core.request import EOS, Delivery, Done, Request, Stops, Update  # re-exported: they cross the seam
from serve.core.stats import COUNTERS, GAUGES  # re-exported: the counters and gauges `ask` answers with

if TYPE_CHECKING:
    from serve.core.faults import Faults

__all__ = ["COUNTERS", "EOS", "GAUGES", "Delivery", "Done", "EngineClient", "EngineView", "Request", "Stops",
           "Update"]


@runtime_checkable
class EngineClient(Protocol):
    """The engine core as the front end uses it."""

    delivery: Delivery
    index: int  # this front end's index of `count` (0: the leader, or the only one)
    count: int  # front ends on the port (--frontends)
    shared: str | None  # with --frontends: the directory their /metrics values are summed in

    def name(self) -> str:
        """A new request's id (unique across front ends)."""

    def submit(self, req) -> None:
        """Queue a `serve.core.request.Request`; its updates go to its `send`."""

    def abort(self, req) -> None:
        """The client hung up (or the route gave up): end it, nothing more sent."""

    async def ask(self, what: str) -> dict:
        """A question of `serve.client.frontend_wire.QUESTIONS` (stats, snapshot, live, health), answered."""

    def measure(self, meter) -> None:
        """The app's metrics: where a core in another process counts the tokens it held."""

    def watch(self, on_death: Callable[[], None]) -> None:
        """Call `on_death()` if the core ends without being told to (in process: never)."""

    def drain(self, seconds: float) -> None:
        """Refuse new requests; cut off what is unfinished `seconds` from now."""

    def stop(self) -> None:
        """Stop admitting; what runs runs to its end."""

    def join(self, timeout: float | None = None) -> None:
        """Wait for the core to end."""

    def release(self) -> None:
        """Give back what the core's process left (its directories); in process: nothing."""

    @property
    def died(self) -> int | None:
        """The exit code to end with when the core ended on its own, else None."""

    @property
    def cut_off(self) -> int:
        """Requests cut off by the drain's deadline."""

    @property
    def peers_cut(self) -> int:
        """With --frontends: requests the other front ends cut off at their own ends."""


@runtime_checkable
class EngineView(Protocol):
    """What the routes read of the engine: its model, sizes and facts."""

    model: str
    rows: int
    reach: int
    pages: int
    unit: int
    max_request_tokens: int
    lined: bool
    backend: str
    max_seqs: int
    chunk: int
    faults: Faults

    def facts(self) -> dict:
        """The engine's facts (/stats' and /v1/models' `kern` object)."""
