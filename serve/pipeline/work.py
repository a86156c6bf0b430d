"""What one stage does with an item, on its own runtime: the pool's plans first, then the calls.

Plans travel as plain lists (msgpack-able), in the order the head's pool made them:

    ["copy", pages, slot]   device page (src, dst) pairs and a slot pair or None
    ["park", pages, slot]   (device page, host page) pairs; a host page is an index, each stage
                            maps it to its own bytes (its host page is every paged state's page)
    ["wake", pages, slot]   (host page, device page) pairs
    ["land", made]          a remap's (kind, id) objects made, which the runtime zeroes
    ["zero", slot]          a fresh sequence's slot

An item's arrays are the buffers crossing into this stage (`arriving`); the stage answers the
buffers crossing out (`leaving`), or, the last stage, each cell's tokens.
"""

from __future__ import annotations

import numpy as np

from pool import Copies
from runtime.step import Cell

__all__ = ["StageWork", "arriving", "encode_copies", "cells_of", "cells_to"]


def encode_copies(copies) -> tuple[list, list | None]:
    pages = [[int(a), int(b)] for a, b in copies.pages]
    slot = [int(copies.slot[0]), int(copies.slot[1])] if copies.slot is not None else None
    return pages, slot


def cells_to(cells: list[Cell]) -> list:
    return [[list(map(int, c.pages)), c.slot, list(map(int, c.ids)), int(c.pos)] for c in cells]


def cells_of(raw: list) -> list[Cell]:
    return [Cell(list(p), s, list(ids), pos) for p, s, ids, pos in raw]


def arriving(manifest) -> list[str]:
    """The buffers crossing into a stage: unfilled inputs and inouts that are not page or line
    tables. The stage before sends exactly these (the head tells it their names in the Table)."""
    from manifests import derive

    tables = {b.name for b in derive.page_tables(manifest) + derive.line_tables(manifest)}
    return sorted(b.name for b in manifest.buffers.values()
                  if b.kind in ("input", "inout") and not b.fill and b.name not in tables)


class StageWork:
    """A stage's runtime driven by items: `apply(plans)`, then `run(program, cells, arrays)`, which
    answers the buffers named in `send` (the next stage's arriving ones; none on the last stage)."""

    def __init__(self, runtime, send: list[str]) -> None:
        self.runtime = runtime
        self.arriving = arriving(runtime.manifest)
        missing = [n for n in send if n not in runtime.manifest.buffers]
        if missing:
            raise ValueError(f"the next stage takes {', '.join(missing)}, which this stage does not have")
        self.send = list(send)
        self.host_page_bytes = runtime.host_page_bytes

    def apply(self, plans: list) -> None:
        rt = self.runtime
        hp = self.host_page_bytes
        for plan in plans:
            kind = plan[0]
            if kind == "copy":
                rt.copy(Copies([tuple(p) for p in plan[1]], tuple(plan[2]) if plan[2] else None))
            elif kind == "park":
                rt.park(Copies([(d, h * hp) for d, h in plan[1]], None))
            elif kind == "wake":
                rt.wake(Copies([(h * hp, d) for h, d in plan[1]], None))
            elif kind == "land":
                rt.land(_Made([tuple(x) for x in plan[1]]))
            elif kind == "zero":
                rt.zero_slot(plan[1])
            else:
                raise ValueError(f"unknown plan {kind!r}")

    def run(self, program: str, cells: list[Cell], arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [n for n in self.arriving if n in _reads(self.runtime.manifest, program) and n not in arrays]
        if missing:
            raise ValueError(f"item for {program} lacks the arriving buffer(s) {', '.join(missing)}")
        unknown = [n for n in arrays if n not in self.arriving]
        if unknown:
            raise ValueError(f"item for {program} carries {', '.join(unknown)}, which this stage does not take")
        leave: dict[str, np.ndarray] = dict.fromkeys(self.send)
        self.runtime.step(program, cells, arrive=arrays, leave=leave)
        return leave


class _Made:
    __slots__ = ("made",)

    def __init__(self, made) -> None:
        self.made = made


def _reads(manifest, program: str) -> set[str]:
    return {a.value for call in manifest.programs[program].calls for a in call.args if a.kind == "buf"}
