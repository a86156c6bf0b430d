"""Geometry derived from a verified manifest: page unit, a sequence's reach, the tables."""

from __future__ import annotations

import math

from manifests.schema import Buffer, Manifest


def is_lined(m: Manifest) -> bool:
    """A manifest is lined when some state holds one line per sequence."""
    return any(s.lined for s in m.states.values())


def page_tables(m: Manifest) -> list[Buffer]:
    """Inputs whose domain indexes a paged state, whose last dim is a constant width."""
    return [
        b
        for b in m.buffers.values()
        if b.domain is not None
        and b.domain.index_into in m.states
        and m.states[b.domain.index_into].paged
        and b.fill is None
        and len(b.shape) >= 2
    ]


def line_tables(m: Manifest) -> list[Buffer]:
    return [
        b
        for b in m.buffers.values()
        if b.domain is not None and b.domain.index_into in m.states and m.states[b.domain.index_into].lined
    ]


def page_unit(m: Manifest) -> int:
    """The page size in tokens: the lcm of the strides of the tables that index paged states."""
    strides = [b.domain.stride for b in page_tables(m)]
    return math.lcm(*strides) if strides else 1


def reach(m: Manifest) -> int:
    """A sequence's reach in tokens: the narrowest page table's width times its stride, in whole pages."""
    unit = page_unit(m)
    widths = [(b.shape[-1] * b.domain.stride) // unit * unit for b in page_tables(m)]
    return min(widths) if widths else m.axis("rows").max


def geometry(m: Manifest) -> dict:
    """The pool's geometry as plain values: `pool.Geometry(**geometry(m))`."""
    return {
        "paged": tuple((s.name, s.bytes_per_token) for s in sorted(m.states.values(), key=lambda s: s.name) if s.paged),
        "lined": tuple((s.name, s.bytes_per_seq) for s in sorted(m.states.values(), key=lambda s: s.name) if s.lined),
        "page_tables": tuple(
            (b.name, b.domain.index_into, b.shape[-1], b.domain.stride) for b in sorted(page_tables(m), key=lambda b: b.name)
        ),
        "line_tables": tuple(
            (b.name, b.domain.index_into, b.shape[0], b.domain.stride) for b in sorted(line_tables(m), key=lambda b: b.name)
        ),
    }
