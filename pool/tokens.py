"""Token sequences as packed bytes, so the prefix index compares runs of tokens by slices in C.

A token is stored big-endian in 4 bytes: byte order then equals token order, so two keys sort as
their token tuples do, and a common prefix of n tokens is a common prefix of 4n bytes. A `Tokens`
is a view of the first `n` tokens of a buffer: `prefix()` copies nothing, so the keys of a growing
sequence's snapshots all share its one buffer.
"""

from __future__ import annotations

from array import array

__all__ = ["Tokens", "WIDTH"]

WIDTH = 4
_new = object.__new__
_SWAP = array("I", [1]).tobytes()[0] == 1  # a little-endian machine stores 'I' byte-swapped


class Tokens:
    """An immutable run of token ids (0 <= id < 2**32): the first `n` of those packed in `data`,
    4 big-endian bytes each."""

    __slots__ = ("data", "n")

    def __init__(self, data: bytes, n: int | None = None) -> None:
        if n is None:
            if len(data) % WIDTH:
                raise ValueError(f"{len(data)} bytes is not a whole number of {WIDTH}-byte tokens")
            n = len(data) // WIDTH
        assert 0 <= n * WIDTH <= len(data), f"{n=} tokens of {len(data)} bytes"
        self.data = data
        self.n = n

    @classmethod
    def of(cls, tokens) -> Tokens:
        """`tokens` as Tokens: itself when it already is, else packed from ints."""
        if isinstance(tokens, Tokens):
            return tokens
        try:
            a = array("I", tokens)
        except (OverflowError, TypeError) as exc:
            raise ValueError(f"token ids must be integers in 0..{2**32 - 1}: {exc}") from None
        if _SWAP:
            a.byteswap()
        return cls(a.tobytes())

    @classmethod
    def from_numpy(cls, ids) -> Tokens:
        """From an integer numpy array (any width), without a Python loop."""
        return cls(ids.astype(">u4", copy=False).tobytes())

    def __len__(self) -> int:
        return self.n

    def packed(self) -> bytes:
        """The packed bytes of exactly these tokens."""
        data = self.data
        return data if len(data) == self.n * WIDTH else data[: self.n * WIDTH]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokens) and self.n == other.n and self.packed() == other.packed()

    def __hash__(self) -> int:
        return hash(self.packed())

    def __repr__(self) -> str:
        head = self.prefix(min(self.n, 8)).tolist()
        return f"Tokens({head}{'...' if self.n > 8 else ''}, len={self.n})"

    def __getitem__(self, i: int) -> int:
        """The token at index `i` (negative counts from the end)."""
        n = self.n
        if not isinstance(i, int):
            raise TypeError("Tokens index must be an int (use prefix() for a run)")
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("token index out of range")
        return int.from_bytes(self.data[i * WIDTH:(i + 1) * WIDTH], "big")

    def prefix(self, n: int) -> Tokens:
        """The first `n` tokens, sharing this buffer."""
        assert 0 <= n <= self.n, f"prefix of {n} tokens of {self.n}"
        t = _new(Tokens)  # Tokens(self.data, n), its checks done
        t.data = self.data
        t.n = n
        return t

    def tolist(self) -> list[int]:
        a = array("I")
        a.frombytes(self.packed())
        if _SWAP:
            a.byteswap()
        return a.tolist()

    def totuple(self) -> tuple[int, ...]:
        return tuple(self.tolist())
