"""A host tier that takes its memory as it is first used: `ChunkedArena`.

The GPU backend's host tier is pinned memory. Pinning and zeroing 2 GiB up front (the gate's
`--host-gib 2` sessions) cost a server 1.1-2.6 s of its start on an H200 when eight processes did
it at once, for a tier whose pages come from the low end and whose slots from the high end
(`pool/host.py`), a few MiB of it touched in a session. The arena is `nbytes` long but made of
`chunk`-byte pieces, each allocated (and zeroed) by `alloc` when a write first reaches it; reading a
piece never written reads zeros without allocating it.

`pieces` splits a byte range into the runs that fall in one piece each, so a copy, an upload or a
zeroing that straddles a boundary becomes one call per piece. Nothing here knows of CUDA: `alloc`
is the backend's (pinned memory on a GPU), and `tests/test_host_arena.py` holds the arena to one
flat array under random copies.
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

__all__ = ["CHUNK", "ChunkedArena", "spans"]

CHUNK = 32 << 20  # bytes a piece: a gate session's parked pages fit in one or two


class ChunkedArena:
    """`nbytes` of host memory in `chunk`-byte pieces, each from `alloc(n)` (a u8 array of n
    zeroed bytes) at its first write."""

    dtype = np.dtype(np.uint8)

    def __init__(self, nbytes: int, alloc: Callable[[int], np.ndarray], chunk: int = CHUNK):
        if nbytes < 0 or chunk < 1:
            raise ValueError(f"ChunkedArena: nbytes={nbytes} and chunk={chunk}")
        self.nbytes = nbytes
        self.chunk = chunk
        self._alloc = alloc
        self._pieces: dict[int, np.ndarray] = {}

    @property
    def size(self) -> int:
        return self.nbytes

    def __len__(self) -> int:
        return self.nbytes

    def allocated(self) -> int:
        """Bytes taken so far."""
        return sum(p.size for p in self._pieces.values())

    def piece(self, off: int, make: bool) -> tuple[np.ndarray | None, int, int]:
        """(piece, offset in it, bytes to its end) for byte `off`; the piece is None when it was
        never written and `make` is False."""
        if not 0 <= off < self.nbytes:
            raise IndexError(f"offset {off} outside the host arena's {self.nbytes} bytes")
        i, inner = divmod(off, self.chunk)
        p = self._pieces.get(i)
        if p is None and make:
            n = min(self.chunk, self.nbytes - i * self.chunk)
            p = self._pieces[i] = self._alloc(n)
            assert p.size == n and p.dtype == np.uint8, (p.size, p.dtype)
        return p, inner, min(self.chunk, self.nbytes - i * self.chunk) - inner

    def pieces(self, off: int, nbytes: int, make: bool) -> Iterator[tuple[np.ndarray | None, int, int]]:
        """(piece, offset in it, bytes) runs covering [off, off + nbytes), in order."""
        if off < 0 or off + nbytes > self.nbytes:
            raise IndexError(f"bytes {off}..{off + nbytes} outside the host arena's {self.nbytes}")
        while nbytes > 0:
            p, inner, room = self.piece(off, make)
            n = min(room, nbytes)
            yield p, inner, n
            off += n
            nbytes -= n

    def read(self, off: int, nbytes: int) -> np.ndarray:
        """A copy of bytes [off, off + nbytes) (zeros where never written)."""
        out = np.zeros(nbytes, np.uint8)
        at = 0
        for p, inner, n in self.pieces(off, nbytes, make=False):
            if p is not None:
                out[at : at + n] = p[inner : inner + n]
            at += n
        return out

    def write(self, off: int, data: np.ndarray) -> None:
        data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        at = 0
        for p, inner, n in self.pieces(off, data.size, make=True):
            p[inner : inner + n] = data[at : at + n]
            at += n

    def fill_zero(self, off: int, nbytes: int) -> None:
        for p, inner, n in self.pieces(off, nbytes, make=False):
            if p is not None:
                p[inner : inner + n] = 0

    def __bytes__(self) -> bytes:
        return self.read(0, self.nbytes).tobytes()


def spans(dst, dst_off: int, src, src_off: int, nbytes: int) -> Iterator[tuple[object, int, object, int, int]]:
    """A byte copy from `src` to `dst` split so that no run crosses a piece of either side that is a
    `ChunkedArena`: (dst array, its offset, src array, its offset, bytes) per run, plain arrays
    passed through. A destination piece is made as the copy reaches it; a source piece never
    written is made too (it reads as zeros), so every run has two real arrays."""
    for arena, off in ((dst, dst_off), (src, src_off)):
        if isinstance(arena, ChunkedArena) and (off < 0 or off + nbytes > arena.nbytes):
            raise IndexError(f"bytes {off}..{off + nbytes} outside the host arena's {arena.nbytes}")
    while nbytes > 0:
        d, do, dn = (dst.piece(dst_off, True) if isinstance(dst, ChunkedArena) else (dst, dst_off, nbytes))
        s, so, sn = (src.piece(src_off, True) if isinstance(src, ChunkedArena) else (src, src_off, nbytes))
        n = min(nbytes, dn, sn)
        yield d, do, s, so, n
        dst_off += n
        src_off += n
        nbytes -= n
