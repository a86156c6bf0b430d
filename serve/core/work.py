"""What the core hands the runtime and gets back: a plan's works (prefill calls, a forward batch) and a
launched step awaiting its commit (`Flight`). Imported by serve/core/core.py and serve/core/overlap.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from serve.core.request import Request

__all__ = ["FORWARD", "PREFILL", "Flight", "Plan", "Work"]

PREFILL, FORWARD = "prefill", "forward"


@dataclass(slots=True)
class Work:
    """One runtime step: a prefill call feeding `ns[i]` tokens of each request `reqs[i]` (one request
    unpacked, several packed), or one batched forward step."""

    kind: str
    reqs: list[Request]
    ns: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Plan:
    prefill: list[list[tuple[Request, int]]] = field(default_factory=list)  # calls of (request, tokens)
    step: list[Request] = field(default_factory=list)

    @property
    def works(self) -> list[Work]:
        """The plan's steps in launch order: the prefill calls, then the forward batches."""
        calls = [Work(PREFILL, [r for r, _ in call], [n for _, n in call]) for call in self.prefill]
        return calls + ([Work(FORWARD, list(self.step))] if self.step else [])


@dataclass(slots=True)
class Flight:
    """A launched step awaiting its commit: the work and what the device's steps returned."""

    work: Work
    tokens: list[list[list[int]]]  # per program call (a prefill has one, a forward one per group-sized
    # part), each cell's emitted tokens
    launched: object = None  # an overlapped launch's handle: its tokens are collected at the commit
