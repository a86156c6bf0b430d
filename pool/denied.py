"""Refusals for room: values the caller acts on, never exceptions; and the caller-bug error.

    PoolError        a caller bug: an unknown table, a position the lease may not write, ...
    Denied           no room now (or ever) for what was asked:
      ExceedsRow(limit)  longer than one sequence may be (the pad page excluded); never fits
      ExceedsPool        no layout of the budget holds it
      Busy               everything is held; evict something and ask again
      Remapping          a remap is planned or in flight; land it and ask again
      HostFull           no room in the host tier
"""

from __future__ import annotations

from typing import ClassVar

from kern.errors import KernError

__all__ = ["Denied", "PoolError"]


class PoolError(KernError):
    """A caller bug: the pool was asked something its handles forbid."""


class Denied:
    """A refusal: `Denied.Busy`, `Denied.ExceedsRow(48)`, ... compared by value."""

    __slots__ = ("kind", "limit")

    ExceedsPool: ClassVar[Denied]
    Busy: ClassVar[Denied]
    Remapping: ClassVar[Denied]
    HostFull: ClassVar[Denied]

    def __init__(self, kind: str, limit: int | None = None) -> None:
        self.kind = kind
        self.limit = limit

    @classmethod
    def ExceedsRow(cls, limit: int) -> Denied:  # noqa: N802 (a variant, named like one)
        """Longer than a row: `limit` tokens is the most one sequence may hold."""
        return cls("ExceedsRow", limit)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Denied) and (self.kind, self.limit) == (other.kind, other.limit)

    def __hash__(self) -> int:
        return hash((self.kind, self.limit))

    def __repr__(self) -> str:
        return f"Denied.ExceedsRow({self.limit})" if self.kind == "ExceedsRow" else f"Denied.{self.kind}"


Denied.ExceedsPool = Denied("ExceedsPool")
Denied.Busy = Denied("Busy")
Denied.Remapping = Denied("Remapping")
Denied.HostFull = Denied("HostFull")
