"""One kind of the device tier's objects (pages or slots): each id's status in a byte array, and the
tallies `pool.pages.Pool` takes and gives back by."""

from __future__ import annotations

from array import array

import numpy as np

__all__ = ["ABSENT", "ARRIVING", "FREE", "HELD", "LEAVING", "Objects"]

ABSENT, FREE, HELD, ARRIVING, LEAVING = range(5)
_FREE_BYTE, _HELD_BYTE = bytes([FREE]), bytes([HELD])
# up to this many ids, taking and giving back go id by id (a byte find or store each), past it by
# numpy (whose per-call cost is a few microseconds)
_FEW = 24


class Objects:
    """Statuses of one kind (pages or slots) in a byte array and its tallies. Taking is lowest free
    ids first, found from `_low` (no free id lies below it) by a byte search for a few ids and a
    vectorised scan for many; giving back many ids is one fancy-indexed store. `status` is a numpy
    view of the bytes `_raw`, which a single id reads and writes without numpy's per-call cost."""

    __slots__ = ("status", "_raw", "live", "held", "_low", "_absent")

    def __init__(self, n: int) -> None:
        self._raw = bytearray(n)
        self.status = np.frombuffer(self._raw, dtype=np.uint8)
        # Free + Held
        self.live = 0
        self.held = 0
        self._low = n
        self._absent = n

    def set(self, i: int, to: int) -> None:
        was = self._raw[i]
        self.live += (to in (FREE, HELD)) - (was in (FREE, HELD))
        self.held += (to == HELD) - (was == HELD)
        self._absent += (to == ABSENT) - (was == ABSENT)
        self._raw[i] = to
        if to == FREE and i < self._low:
            self._low = i

    def make_free(self, a: int, b: int) -> None:
        """Absent ids a..b-1 become free at once (the first layout)."""
        assert not np.count_nonzero(self.status[a:b] != ABSENT), "laying out ids that exist"
        self.status[a:b] = FREE
        self.live += b - a
        self._absent -= b - a
        self._low = min(self._low, a)

    @property
    def idle(self) -> int:
        return self.live - self.held

    def pop(self, n: int) -> list[int]:
        """The `n` lowest free ids, now held (the caller checked `idle`)."""
        if n == 0:
            return []
        if n <= _FEW:
            raw, out, at = self._raw, [], self._low
            for _ in range(n):
                at = raw.find(_FREE_BYTE, at)
                assert at >= 0, "popping more ids than are free"
                out.append(at)
                at += 1
            for i in out:
                raw[i] = HELD
            self.held += n
            self._low = at
            return out
        status, total = self.status, len(self.status)
        # from the first free id (a byte search), in windows that double while ids are short
        parts, need, at = [], n, self._raw.find(_FREE_BYTE, self._low)
        assert at >= 0, "popping more ids than are free"
        size = max(4 * need, 4096)
        while need:
            end = min(total, at + size)
            assert at < end, "popping more ids than are free"
            idx = np.flatnonzero(status[at:end] == FREE)[:need]
            if idx.size:
                parts.append(idx + at)
                need -= idx.size
            at = end
            size *= 2
        ids = parts[0] if len(parts) == 1 else np.concatenate(parts)
        status[ids] = HELD
        self.held += n
        self._low = int(ids[-1]) + 1
        return ids.tolist()

    def give(self, i: int) -> None:
        """A held id is free again."""
        assert self._raw[i] == HELD, f"{i=} given back but not held"
        self._raw[i] = FREE
        self.held -= 1
        if i < self._low:
            self._low = i

    def give_many(self, ids) -> None:
        """Held ids (a list, or an `array('q')`: a run's pages) are free again, at once."""
        n = len(ids)
        if n <= _FEW:
            raw, low = self._raw, self._low
            for i in ids:
                assert raw[i] == HELD, f"{i=} given back but not held"
                raw[i] = FREE
                self.held -= 1
                if i < low:
                    low = self._low = i
            return
        arr = np.frombuffer(ids, dtype=np.int64) if type(ids) is array else np.asarray(ids, dtype=np.int64)
        status = self.status
        assert status[arr].tobytes().count(_HELD_BYTE) == n, "ids given back but not all held"
        status[arr] = FREE
        self.held -= n
        lo = int(arr.min())
        if lo < self._low:
            self._low = lo

    def absent(self, n: int, first: int) -> list[int]:
        if not self._absent or not n:
            return []
        return (np.flatnonzero(self.status[first:] == ABSENT)[:n] + first).tolist()

    def idle_desc(self) -> list[int]:
        return np.flatnonzero(self.status == FREE)[::-1].tolist()
