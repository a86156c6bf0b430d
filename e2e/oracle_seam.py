"""`Oracle`: what the gate asks of the oracle it judges answers against (`Run.oracle`, `PolicyGate`).

A target's oracle is its reference (`oracle.reference.Reference`, exact: `model.py`'s arithmetic) or,
without one, `kern run` (`oracle.cache.KernRun` in process, `oracle.cache.CommandRun` for ``--kern``).
They differ in what they can do beyond running a prompt: only the reference works ahead (`prefetch`),
holds a worker process (`close`), knows its model's EOS and gives logits and a request's path.
`e2e.oracles.Adapted` makes any of them an `Oracle`: what one cannot do is given as its neutral
(nothing to prefetch or close) or as None (no EOS, no prober, no logits, no path), read as such.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from oracle.probe import Prober

__all__ = ["Oracle"]


class Oracle(Protocol):
    """The gate's oracle: a prompt's greedy answer, and what the gate may ask besides."""

    kind: str  # what it is, for a check's note ("reference", "kern run", ...)
    exact: bool  # exact arithmetic: every divergence from it is a real one (the reference)
    available: bool
    accept_pct: tuple[float, float] | None  # a speculative target's acceptance bounds (its model's ACCEPT_PCT)
    eos: int | None  # its model's EOS token (None: it does not say)
    prober: Prober | None  # the runtime's logits at a step, for a float target's near-ties
    logits: Callable[[list[int]], list[float]] | None  # its logits after a context (None: it has none)
    path_of: Callable[[list[int], int, int, bool], dict | None] | None  # what each step of a request emits,
    # for the policy oracle (None: it cannot say)
    eos_masked: Callable[[list[int]], int] | None  # the token its model emits with EOS masked (an engine's
    # min_tokens; None: it cannot say)

    def run(self, ids: list[int], steps: int, rows: int) -> list[int]:
        """The greedy continuation of `ids`, at most `steps` tokens."""
        ...

    def near_tie(self, context: list[int], a: int, b: int, rows: int) -> str | None:
        """Evidence on `a` (the server's token) against `b` (its own) after `context`."""
        ...

    def prefetch(self, ids: list[int], steps: int, rows: int, path: tuple[int, bool] | None = None) -> None:
        """Start on `run(ids, steps)` (and, given ``path=(rows, emits)``, its path) while the caller
        does other things; nothing when it cannot work ahead."""
        ...

    def close(self) -> None:
        """Let go of what it holds (a worker process); nothing when it holds none."""
        ...
