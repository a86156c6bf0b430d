"""One request as the scheduler sees it, and the events it sends back to its HTTP handler.

The scheduler thread alone writes a request's state; the handler only reads the events it is sent.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable

from kern.tokens import EOS  # the one definition of where an answer ends
from pool import Tokens
from serve.core.answer import Done, Stops, Update  # re-exported: their importers read them here
from serve.core.messages import Asked

__all__ = ["EOS", "Delivery", "Done", "Request", "Status", "Stops", "Tickets", "Update"]


class Delivery(enum.Enum):
    """How a request's updates reach its handler (`serve.client.seam.EngineClient.delivery`: the scheduler
    declares `STEPS`, the remote client `HELD`)."""

    STEPS = "steps"
    """In process: on the scheduler thread, each as the steps make it (the handler's `send` must be
    thread-safe: the routes hand it to the event loop through their outbox)."""
    HELD = "held"
    """From another process: on the event loop (`send` may be a queue's put), a whole (not streamed)
    answer's tokens after its first held in the core and sent with its finish."""

    @property
    def on_loop(self) -> bool:
        """Updates arrive on the event loop (else on another thread)."""
        return self is Delivery.HELD

    @property
    def holds_whole(self) -> bool:
        """A whole answer's tokens after its first come with its finish (timed by the core)."""
        return self is Delivery.HELD


class Status(enum.Enum):
    WAITING = "waiting"
    """Queued: no lease yet (it waits at the head of the queue for room)."""
    RUNNING = "running"
    """Holds its lease: prefilling, then stepping."""
    FINISHED = "finished"
    """Ended by stop or length; its lease is released or retired into a snapshot."""
    ABORTED = "aborted"
    """The client hung up or the server stopped; its lease is released and nothing is kept."""


_MOVES = {
    Status.WAITING: {Status.RUNNING, Status.ABORTED, Status.FINISHED},
    Status.RUNNING: {Status.FINISHED, Status.ABORTED, Status.WAITING},  # WAITING: requeued (a lost pipeline stage)
    Status.FINISHED: set(),
    Status.ABORTED: set(),
}


@dataclass(eq=False, slots=True)
class Request(Asked):
    """One request as the core runs it. What the routes ask beyond its id, prompt ids and max_tokens
    (its arrival time, ignore_eos, stops, whole, client) is `serve.core.messages.Asked`, inherited as
    keyword-only fields: a field added there crosses the process split with no other edit."""

    id: str
    ids: list[int]
    max_tokens: int
    rows: int
    send: Callable[[Update], Any]  # thread-safe: hands an update to the handler's loop
    status: Status = Status.WAITING
    lease: Any = None
    cached: int = 0
    tier: str | None = None
    woken: bool = False
    pos: int = 0  # tokens the state holds (written and, when lined, folded)
    fed_end: int = 0  # prefill runs the prompt up to here
    emitted: list[int] = field(default_factory=list)  # every token the steps emitted
    out: list[int] = field(default_factory=list)  # what the client receives (stop token included)
    anchor: int = 0
    reason: str | None = None
    page_mark: int = 0  # whole pages already checkpointed (paged manifests)
    key: Tokens | None = None  # the packed tokens of its last checkpoint: the next one's key extends it
    t_admit: float = 0.0
    order: int = 0  # the core's admission count when it was admitted (its running list is not in that order)
    ticket: Any = None  # its `pool.fair.Ticket` while the core holds it

    def move(self, to: Status) -> None:
        if to not in _MOVES[self.status]:
            raise RuntimeError(f"request {self.id}: cannot move from {self.status.value} to {to.value}")
        self.status = to

    @property
    def room(self) -> int:
        return len(self.ids) + self.max_tokens + self.rows - 1

    @property
    def prefilling(self) -> bool:
        return self.status is Status.RUNNING and self.pos < self.fed_end

    @property
    def stepping(self) -> bool:
        return self.status is Status.RUNNING and self.pos >= self.fed_end and self.reason is None

    def fed(self, start: int, stop: int) -> list[int]:
        """Tokens at positions start..stop: the prompt, then what the steps emitted."""
        seq = self.ids + self.emitted if stop > len(self.ids) else self.ids
        return seq[start:stop]

    def key_to(self, n: int) -> Tokens:
        """Its first `n` tokens packed as an index key (a checkpoint's): the last key extended, only the
        new pages' tokens packed (a request's tokens at fed positions never change, a lost state and
        its resumption included)."""
        key = self.key
        if key is None or key.n > n:
            key = Tokens.of(self.fed(0, n))
        elif key.n < n:
            key = Tokens(key.packed() + Tokens.of(self.fed(key.n, n)).data)
        self.key = key
        return key

    def take(self, tokens: list[int]) -> list[int]:
        """Commit what a step emitted; return what the client gets now (ends by stop or length)."""
        if tokens and self.stops is None and self.reason is None and (self.ignore_eos or EOS not in tokens):
            return self._take_plain(tokens)
        self.emitted.extend(tokens)
        new: list[int] = []
        for t in tokens:
            if len(self.out) >= self.max_tokens:
                self.reason = "length"
                break
            self.out.append(t)
            new.append(t)
            if t == EOS and not self.ignore_eos:
                self.reason = "stop"
                break
            if self.stops is not None and self.stops.sees(t):
                self.reason = "stop"  # a stop token id, or the token that completed a stop string
                break
        if self.reason is None:
            if len(self.out) >= self.max_tokens:
                self.reason = "length"
            else:
                self.anchor = tokens[-1]
        if self.reason is not None and self.stops is not None and self.stops.end():
            self.reason = "stop"  # the decoder's flushed tail completed a stop string
        return new

    def _take_plain(self, tokens: list[int]) -> list[int]:
        """`take` where nothing can stop the answer but its length (no stop strings or ids, no EOS
        that ends it): the tokens that fit taken at once, not one at a time (several decode steps a
        launch commit 16 tokens a request: 2.02 us through the loop, 0.85 at once)."""
        self.emitted.extend(tokens)
        room = max(self.max_tokens - len(self.out), 0)
        new = tokens[:room] if room < len(tokens) else list(tokens)
        self.out.extend(new)
        if len(self.out) >= self.max_tokens:
            self.reason = "length"
        else:
            self.anchor = tokens[-1]
        return new

    def take_run(self, tokens: list[int]) -> tuple[list[int], int]:
        """`take` over several steps' tokens (one each): what the client gets now, and how many of the
        steps count (up to the one that ended the request); the tokens of steps past it are dropped."""
        new = self.take(tokens)
        used = len(new) if self.reason is not None else len(tokens)
        if used < len(tokens):
            del self.emitted[used - len(tokens) :]
        return new, used


class Tickets:
    """The waiting queue's tickets, read lazily (each round reads only as far as the policy looks)."""

    __slots__ = ("waiting",)

    def __init__(self, waiting) -> None:
        self.waiting = waiting

    def __iter__(self):
        return (r.ticket for r in self.waiting)
