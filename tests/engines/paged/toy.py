"""The toy families' arithmetic, from docs/toy.md, vectorized with numpy over a step's tokens.

A family says what one cached entry is (a row of `width` unsigned 64-bit words per position), how a
step's new tokens make their entries, and how the next token is read from a sequence's entries
(and, when lined, its line). The engine stores the rows in its block pool and never looks inside.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

MASK = (1 << 64) - 1
EOS = 256
POISON = 0xBAD0BAD0BAD0BAD0
U = np.uint64


def splitmix(x: np.ndarray) -> np.ndarray:
    """splitmix over an array of uint64 (wrapping, as docs/toy.md's words do)."""
    x = x + U(0x9E3779B97F4A7C15)
    x = (x ^ (x >> U(30))) * U(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> U(27))) * U(0x94D049BB133111EB)
    return x ^ (x >> U(31))


WORDS = np.arange(64, dtype=U)
SALT = splitmix(U(0x7071) + WORDS) >> U(1)
WORD_MIX = WORDS * U(0xC2B2AE35) ^ SALT


def marks(tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """mark(t, p, w) for every (t, p) pair and w < 64: shape (n, 64)."""
    tp = tokens.astype(U) * U(0x100000001B3) ^ positions.astype(U) * U(0x9E3779B1)
    return splitmix(tp[:, None] ^ WORD_MIX[None, :])


def rotl(x: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Rotate each row of `x` left by its own k (mod 64)."""
    k = (k.astype(U) & U(63))[:, None]
    return np.where(k == 0, x, (x << k) | (x >> ((U(64) - k) & U(63))))


def slot_sums(tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """What each slot (t, p) adds to the sequence sum: its 64 head words rotated by p, summed."""
    return rotl(marks(tokens, positions), positions).sum(axis=1, dtype=U)


def next_of(s: int) -> int:
    return EOS if (s >> 56) % 96 == 0 else s % 256


def rotl1(x: int, k: int) -> int:
    k &= 63
    return ((x << k) | (x >> (64 - k))) & MASK if k else x


class Paged:
    """toy-paged: one word per position, the slot's sum; next_of(S)."""
    name = "paged"
    width = 1
    lined = False
    reads_context = False  # an entry is a function of (token, position) alone

    def entries(self, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return slot_sums(tokens, positions)[:, None]

    def predict(self, rows: np.ndarray, last: int, carry: int) -> int:
        return next_of((int(rows[:, 0].sum(dtype=U)) + carry) & MASK)


class Lined(Paged):
    """toy-stateful: the paged sum plus a line per sequence (carry C, the position it continues at)."""
    name = "lined"
    lined = True

    @staticmethod
    def fold(line: tuple[int, int], tokens: np.ndarray, positions: np.ndarray) -> tuple[int, int]:
        """The line after folding rows that start at positions[0] (docs/toy.md, 'Lined state')."""
        p0 = int(positions[0])
        c, at = line
        c = 0 if p0 == 0 else c if at == p0 else c ^ POISON
        for m in marks(tokens, positions)[:, 0].tolist():
            c = rotl1(c, 7) ^ m
        return c, p0 + len(tokens)


class Attn:
    """toy-attn: an entry is K (8 words) and V (8 words), each written from a read over every earlier
    entry, so it depends on the whole prefix (docs/toy.md, 'Context-dependent entries')."""
    name = "attn"
    width = 16
    lined = False
    reads_context = True

    @staticmethod
    def sums(rows: np.ndarray) -> list[int]:
        """The read's running sums over cached rows: the K sum, then the V sum of each bucket."""
        q = np.arange(len(rows))
        ks = int(rotl(rows[:, :8], q).sum(dtype=U))
        vs = rotl(rows[:, 8:16], q + 32).sum(axis=1, dtype=U)
        bucket = (rows[:, 0] >> U(62)).astype(np.int64) if len(rows) else np.zeros(0, np.int64)
        return [ks] + [int(vs[bucket == b].sum(dtype=U)) for b in range(4)]

    @staticmethod
    def read(sums: list[int], query: int) -> int:
        return (sums[0] + sum(sums[1:]) + 2 * sums[1 + (query >> 62)]) & MASK

    def compute(self, cached: np.ndarray, tokens: np.ndarray, positions: np.ndarray,
                k_positions: np.ndarray | None = None) -> np.ndarray:
        """The chunk's entries, row by row, after reading the cached part once. `k_positions` stands in
        the positions K's marks are taken at (only the k-only bug passes it)."""
        sums = self.sums(cached)
        m = marks(tokens, positions)
        km = m if k_positions is None else marks(tokens, k_positions)
        out = np.empty((len(tokens), 16), dtype=U)
        for i, p in enumerate(positions.tolist()):
            r = self.read(sums, int(m[i, 16]))
            rot = np.array([rotl1(r, w) for w in range(16)], dtype=U)
            out[i] = splitmix(np.concatenate([km[i, :8], m[i, 8:16]]) ^ rot)
            row = out[i:i + 1]
            sums[0] = (sums[0] + int(rotl(row[:, :8], np.array([p])).sum(dtype=U))) & MASK
            b = 1 + int(row[0, 0] >> U(62))
            sums[b] = (sums[b] + int(rotl(row[:, 8:16], np.array([p + 32])).sum(dtype=U))) & MASK
        return out

    def predict(self, rows: np.ndarray, last: int, carry: int) -> int:
        """next_of(splitmix(O)): O reads every entry with the last position's query."""
        query = int(marks(np.array([last]), np.array([len(rows) - 1]))[0, 16])
        o = self.read(self.sums(rows), query)
        return next_of(int(splitmix(np.array([o], dtype=U))[0]))


def family_of(manifest: dict):
    """The family a manifest names (docs/toy.md, 'Telling the toy families apart'), or ValueError."""
    if "logits" in manifest.get("buffers", {}):
        raise ValueError("the float toy is not served by this engine")
    states = manifest.get("states", {})
    if "attn" in states:
        return Attn()
    if any(k.startswith("kv.") for k in states):
        raise ValueError("the layered toy is not served by this engine")
    if any((s or {}).get("bytes_per_seq", 0) for s in states.values()):
        return Lined()
    return Paged()


def find_manifest(model: str, given: str | None) -> Path:
    """`given`, or manifests/toy/<model>.json under the working directory or this repository."""
    if given:
        return Path(given)
    here = Path(__file__).resolve().parents[3]
    for root in (Path.cwd(), here):
        p = root / "manifests" / "toy" / f"{model}.json"
        if p.is_file():
            return p
    raise FileNotFoundError(f"no manifest for model {model!r} (looked for manifests/toy/{model}.json "
                            "under the working directory and this repository); pass --manifest PATH")


def load_family(model: str, given: str | None):
    return family_of(json.loads(find_manifest(model, given).read_text()))
