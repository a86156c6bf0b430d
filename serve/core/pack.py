"""pack(): plan the next packed prefill call, a pure function of the waiting prompts and the bounds.

A packed call feeds several sequences' next chunks at once, split by a `cu_seqlens` input. The plan
takes the waiting sequences oldest first and gives each as many rows as fit; a partial chunk is
fine. It stops at the first sequence that gets nothing (no rows left in the call, no context left,
or the call's sequences used up) rather than skipping it, so no sequence ever overtakes an older
one. Sequences with nothing left to prefill are passed over.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Waiting:
    """A sequence with prompt rows to prefill: `pos` rows are in its state, `left` still to feed."""

    pos: int
    left: int


@dataclass(frozen=True, slots=True)
class Bounds:
    """One call's bounds: its rows (the chunk), its sequences (the chunk program's groups) and
    its context (the summed length the call's sequences reach, `batch.context`'s max)."""

    rows: int
    seqs: int
    context: int


def pack(waiting: list[Waiting], b: Bounds) -> list[tuple[int, int]]:
    """[(index into `waiting`, rows to feed it)], indices increasing; empty when nothing fits."""
    out: list[tuple[int, int]] = []
    rows = ctx = 0
    for i, w in enumerate(waiting):
        if w.left <= 0:
            continue
        room = max(b.context - (ctx + w.pos), 0)
        n = min(w.left, b.rows - rows, room)
        if n <= 0 or len(out) == b.seqs:
            break
        out.append((i, n))
        rows += n
        ctx += w.pos + n
    return out
