"""One request as the scheduler sees it, and the events it sends back to its HTTP handler.

The scheduler thread alone writes a request's state; the handler only reads the events it is sent.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["EOS", "Done", "Request", "Status", "Update"]

EOS = 256


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
    Status.RUNNING: {Status.FINISHED, Status.ABORTED},
    Status.FINISHED: set(),
    Status.ABORTED: set(),
}


@dataclass(slots=True)
class Done:
    """How a request ended: what the last response chunk carries."""

    reason: str | None  # "stop" | "length" | None (aborted or rejected)
    cached: int = 0
    tier: str | None = None  # "device" | "host" | None
    snapshot: str = "none"  # "kept" | "not kept" | "none"
    error: tuple[int, str, str, str | None] | None = None  # (status, message, code, param)


@dataclass(slots=True)
class Update:
    """New answer tokens for the client, and `done` on the last one."""

    tokens: list[int]
    done: Done | None = None


@dataclass(eq=False, slots=True)
class Request:
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
    t_arrive: float = 0.0
    t_admit: float = 0.0
    spoiled: bool = False  # the wrong-token fault spoiled one of its tokens
    ignore_eos: bool = False  # EOS does not end the answer (only max_tokens does)

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

    def take(self, tokens: list[int]) -> list[int]:
        """Commit what a step emitted; return what the client gets now (ends by stop or length)."""
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
        if self.reason is None:
            if len(self.out) >= self.max_tokens:
                self.reason = "length"
            else:
                self.anchor = tokens[-1]
        return new
