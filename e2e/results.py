"""What a gate step gives the steps that depend on it: one frozen result type per step that gives one.

A step function returns its result (or None); the lane hands a step the results of the steps it
depends on, directly or through them (`Step.deps`, `e2e/scenarios/__init__.py`), and the step
reads one by its type: ``r.got(Cold)``. Nothing else crosses from one step to another, and no lane
writes what another lane reads but these, each the result of its step's future (`e2e/lanes.py`'s
`_Plan`). A step reading a result it does not depend on is an error naming both.

| result | given by | read by |
|---|---|---|
| `Opened` | the target's first session's start | every session's flags (page, rows, slot and page bytes) |
| `Cold` | conc1 | repeat, turn2, concurrent, abort, rows1, slot_growth, park_wake, host and churn flags |
| `Repeated` | repeat | turn2 (each prompt's first-turn requests, whose snapshots turn 2 may hit) |
| `Turn2` | turn2 | host_cold, park_wake, slot_growth, wake_room, churn, evict_drops, ties, host_frag |
| `HostCold` | host_cold | park_wake |
| `Burst` | concurrent | spec_acceptance |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from e2e.client import Answer

__all__ = ["Burst", "Cold", "HostCold", "Opened", "Repeated", "Turn", "Turn2"]


@dataclass(frozen=True)
class Opened:
    """A session's server as it started: its ready facts, its /stats facts, and a pipeline's stages'
    host page bytes (empty for one process)."""
    session: str
    facts: dict[str, Any]
    server_facts: dict[str, Any]
    stage_page_bytes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Cold:
    """conc1: the cold answer to each of the 12 prompts (``prompt_ids`` set), in prompt order."""
    answers: tuple[Answer, ...]

    @property
    def requests(self) -> tuple[tuple[str, ...], ...]:
        """Each prompt's first-turn requests so far: its cold one."""
        return tuple((a.request,) for a in self.answers)


@dataclass(frozen=True)
class Repeated:
    """repeat: each prompt's first-turn requests, the cold one and the repeated one (prompts it did
    not repeat: the cold one alone)."""
    first_turns: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Turn:
    """One turn-2 request of the default session: its ids, its warm answer, its hit, the first prompt's length."""
    ids: tuple[int, ...]
    warm_ids: tuple[int, ...]
    cached: int
    prompt_len: int
    served: tuple[int | None, str | None] = (None, None)  # its cached_tokens and tier as told (None: untold)


@dataclass(frozen=True)
class Turn2:
    """turn2: the suffix's ids (as the server tokenizes it) and each prompt's turn 2."""
    suffix: tuple[int, ...]
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class HostCold:
    """host_cold: each turn 2 answered cold by a fresh server (the host session's)."""
    ids: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Burst:
    """concurrent: the speculative acceptance, serial (before the burst) and in the burst, and the
    burst's accepted tokens per round."""
    serial: Any = None
    burst: Any = None
    accepted: Any = None
