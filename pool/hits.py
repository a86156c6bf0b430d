"""What the prefix index answers: a `Hit` (a usable prefix and a held clone of its store, on a
`Tier`) and `Evicted` (which entry an eviction took)."""

from __future__ import annotations

import enum
from typing import Any

from pool.tokens import Tokens

__all__ = ["Evicted", "Hit", "Tier"]


class Tier(str, enum.Enum):
    """Where a hit's store lives."""

    DEVICE = "device"
    """Resident: a device checkpoint."""
    HOST = "host"
    """Parked: a host copy."""

    def __repr__(self) -> str:
        return f"Tier.{self.name}"


_DEVICE, _HOST = Tier.DEVICE, Tier.HOST


class Hit:
    """A usable prefix of `len` tokens and a held clone of the store it comes from.

    It stays valid whatever the index does later; `release()` lets go of the store. `key` (a tuple)
    names the entry the store comes from.
    """

    __slots__ = ("len", "tier", "store", "_key")

    def __init__(self, len: int, tier: Tier, store: Any, key) -> None:
        self.len = len
        self.tier = tier
        self.store = store
        self._key = key

    @property
    def key(self) -> tuple[int, ...]:
        k = self._key
        return k.totuple() if isinstance(k, Tokens) else tuple(k)

    def __repr__(self) -> str:
        return f"Hit(len={self.len}, tier={self.tier!r}, key={self.key!r})"

    def release(self) -> None:
        self.store.release()


class Evicted:
    """Which entry `evict` took (parked, or dropped) and how many parked entries went for room.

    `key` is the entry's key as a tuple (made on first use); `tokens` its length."""

    __slots__ = ("_key", "parked", "dropped")

    def __init__(self, key, parked: bool, dropped: int) -> None:
        self._key = key
        self.parked = parked
        self.dropped = dropped

    @property
    def key(self) -> tuple[int, ...]:
        k = self._key
        return k.totuple() if isinstance(k, Tokens) else tuple(k)

    @property
    def tokens(self) -> int:
        return len(self._key)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Evicted) and (self.parked, self.dropped) == (other.parked, other.dropped)
                and self.key == other.key)

    def __hash__(self) -> int:
        return hash((self.key, self.parked, self.dropped))

    def __repr__(self) -> str:
        return f"Evicted(key={self.key!r}, parked={self.parked}, dropped={self.dropped})"
