"""What one stage does with an item, on its own runtime: the pool's plans first, then the calls.

A plan travels as the name of the `serve.core.device.Device` method that carries it out and that method's
argument as plain lists (msgpack-able), in the order the head's pool made them. The head runs each
plan on stage 0 through the same `apply_plans` every other stage runs on its item (nano-vllm's model
runner replays its own method names across ranks the same way):

    ["copy", pages, slot]   device page (src, dst) pairs and a slot pair or None
    ["park", pages, slot]   (device page, host page) pairs; a host page is an index, each stage
                            maps it to its own bytes (its host page is every paged state's page)
    ["wake", pages, slot]   (host page, device page) pairs
    ["land", made]          a remap's (kind, id) objects made, which the runtime zeroes
    ["zero_slot", slot]     a fresh sequence's slot

An item's arrays are the buffers crossing into this stage (`arriving`); the stage answers the
buffers crossing out (`leaving`), or, the last stage, each cell's tokens.
"""

from __future__ import annotations

import numpy as np

from pool import Copies
from runtime.step import Cell

__all__ = ["PLANS", "StageWork", "apply_plans", "arriving", "encode_plan", "cells_of", "cells_to"]


def encode_copies(copies) -> tuple[list, list | None]:
    pages = [[int(a), int(b)] for a, b in copies.pages]
    slot = [int(copies.slot[0]), int(copies.slot[1])] if copies.slot is not None else None
    return pages, slot


class _Made:
    __slots__ = ("made",)

    def __init__(self, made) -> None:
        self.made = made


def _copies(hp: int, pages, slot) -> Copies:
    return Copies([tuple(p) for p in pages], tuple(slot) if slot else None)


def _to_host(hp: int, pages, slot) -> Copies:
    return Copies([(d, h * hp) for d, h in pages], None)


def _from_host(hp: int, pages, slot) -> Copies:
    return Copies([(h * hp, d) for h, d in pages], None)


def _made(hp: int, made) -> _Made:
    return _Made([tuple(x) for x in made])


PLANS = {  # a Device plan method: (its argument as it travels, that argument again on a stage of host page hp bytes)
    "copy": (encode_copies, _copies),
    "park": (encode_copies, _to_host),
    "wake": (encode_copies, _from_host),
    "land": (lambda remap: ([[str(getattr(k, "value", k)), int(i)] for k, i in remap.made],), _made),
    "zero_slot": (lambda slot: (int(slot),), lambda hp, slot: int(slot)),
}


def encode_plan(method: str, arg) -> list:
    """The call `device.<method>(arg)` of one of the pool's plans, as it travels."""
    return [method, *PLANS[method][0](arg)]


def apply_plans(device, host_page_bytes: int, plans: list) -> None:
    """Carry out `plans` on `device`, each by the Device method it names (a host page being
    `host_page_bytes` bytes of this stage's host tier)."""
    for method, *args in plans:
        if method not in PLANS:
            raise ValueError(f"unknown plan {method!r}")
        getattr(device, method)(PLANS[method][1](host_page_bytes, *args))


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
        apply_plans(self.runtime, self.host_page_bytes, plans)

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


def _reads(manifest, program: str) -> set[str]:
    return {a.value for call in manifest.programs[program].calls for a in call.args if a.kind == "buf"}
