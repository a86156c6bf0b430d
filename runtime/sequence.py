"""One sequence through the runtime, no scheduler: what `kern run` and `kern test` drive.

Chunked prefill (emitting or not), then decode steps or speculative rounds until EOS or `steps`
tokens. The sequence leases only prompt + steps + rows - 1 tokens from a trivial allocator:
page 0 and slot 1 are the pad's, the sequence takes pages 1.. and slot 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from kern.errors import KernError
from kern.tokens import EOS
from manifests.derive import page_tables, page_unit, reach
from manifests.schema import Manifest
from runtime.chain import Chain
from runtime.protocol import ProtocolError
from runtime.runtime import Runtime
from runtime.step import Cell


class RequestError(KernError, ValueError):
    """A request the target cannot run: ids outside the vocabulary, over the reach, a bad chunk."""


@dataclass
class Generation:
    ids: list[int]
    rounds: int = 0
    drafted: int = 0  # rows past row 0, over all rounds
    accepted: int = 0  # count - 1, over all rounds
    pages: list[int] = field(default_factory=list)
    slot: int | None = None
    length: int = 0  # tokens the state holds at the end
    steps: int = 0  # decode steps or rounds run


def room(prompt: int, steps: int, rows: int) -> int:
    return prompt + steps + rows - 1


def single(manifest: Manifest | None, weights, prompt: int, steps: int, rows: int, backend="cpu", capacity: int | None = None,
           stages: list[Manifest] | None = None) -> tuple[Runtime | Chain, Cell]:
    """A runtime holding one sequence's room (plus the pad), and that sequence's empty cell: of the
    manifest, or a Chain of a cut's `stages` (each stage holding the same pages for its states)."""

    parts = stages or [manifest]
    paged = [m for m in parts if page_tables(m)] or parts
    unit = math.lcm(*(page_unit(m) for m in paged))
    top = min(reach(m) for m in paged)
    need = room(prompt, steps, rows)
    if need > top:
        raise RequestError(f"prompt of {prompt} + {steps} steps + {rows - 1} draft rows = {need} tokens is over the reach of {top}")
    pages = -(-need // unit)
    if capacity is not None and (pages + 1) * unit > capacity:
        raise RequestError(f"{need} tokens need {pages + 1} pages of {unit} (with the pad), over --capacity {capacity}")
    if stages:
        rt = Chain(stages, weights, pages=pages + 1, slots=3, backend=backend, max_seqs=1)
    else:
        rt = Runtime(manifest, weights, pages=pages + 1, slots=3, backend=backend, max_seqs=1)
    rt.set_pad(0, 1 if rt.lined else None)
    cell = Cell(list(range(1, pages + 1)), 2 if rt.lined else None, [], 0)
    if rt.lined:
        rt.zero_slot(2)
    return rt, cell


def check_ids(ids: list[int], vocab_max: int = EOS) -> None:
    if not ids:
        raise RequestError("the prompt is empty")
    bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t <= vocab_max]
    if bad:
        raise RequestError(f"token ids must be integers in 0..{vocab_max}; got {bad[:5]}")


def _prefill(rt: Runtime, program: str, cell: Cell, fed: list[int], chunk: int, emits: bool,
             on_step: Callable[[str, list[int]], None] | None) -> tuple[int, int | None]:
    """Prefill `fed` in chunks of `chunk`; (the position after it, the last chunk's first emitted token
    where the program `emits`, else None). `on_step`: called after the first chunk of an emitting one."""
    pos = 0
    first = None
    while pos < len(fed):
        n = min(chunk, len(fed) - pos)
        c = Cell(cell.pages, cell.slot, fed[pos : pos + n], pos)
        rt.step(program, [c])
        if emits and on_step is not None and pos == 0:
            on_step("chunk", list(c.tokens))
        pos += n
        if emits:
            first = c.tokens[0]
    return pos, first


def generate(rt: Runtime, cell: Cell, ids: list[int], steps: int, rows: int, chunk: int | None = None,
             on_step: Callable[[str, list[int]], None] | None = None) -> Generation:
    """Greedy continuation of `ids` in `cell` (which holds room for it), stopping before EOS.

    `on_step(tag, tokens)`, when given, is called after the first prefill chunk of an emitting
    target (tag ``chunk``) and after each decode step or round (``decode0``, ``decode1``, ...),
    with what the step emitted, while the runtime still holds the step's outputs (its logits)."""
    check_ids(ids)
    if steps < 1:
        raise RequestError(f"steps must be >= 1, got {steps}")
    proto = rt.protocol
    proto.check_rows(rows, rt.unit)
    chunk = chunk or proto.chunk_max
    if not 1 <= chunk <= proto.chunk_max:
        raise RequestError(f"--chunk {chunk} must be in 1..{proto.chunk_max} (it may only be lowered)")
    pre = proto.chunk()
    if pre is None:
        raise ProtocolError("the manifest has no prefill (chunk) program")
    gen = Generation([], pages=cell.pages, slot=cell.slot)
    emits = proto.prefill_emits
    pos, first = _prefill(rt, pre.program, cell, ids if emits else ids[:-1], chunk, emits, on_step)
    out = gen.ids
    if emits:
        if first == EOS:
            gen.length = pos
            return gen
        out.append(first)
        anchor = first
    else:
        anchor = ids[-1]
    decode = proto.forward(1, rows)
    while len(out) < steps:
        c = Cell(cell.pages, cell.slot, [anchor] * rows, pos)
        rt.step(decode.program, [c])
        toks = c.tokens
        if on_step is not None:
            on_step(f"decode{gen.steps}", list(toks))
        gen.steps += 1
        if rows > 1:
            gen.rounds += 1
            gen.drafted += rows - 1
            gen.accepted += len(toks) - 1
        pos += len(toks)
        stop = False
        for t in toks:
            if t == EOS or len(out) >= steps:
                stop = True
                break
            out.append(t)
        if stop:
            break
        anchor = toks[-1]
    gen.length = pos
    return gen
