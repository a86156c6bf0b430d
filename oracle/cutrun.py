"""A manifest cut at given points, its stages chained in one process: what `kern run --stages` runs.

`cut_points(manifest)` lists the single call indices at which the manifest can be cut (each gives
verified stages); `run_cut` generates greedily through the chain of a cut's stages, so the gate
can hold any cut to the whole manifest's answers (`e2e/scenarios/cuts.py`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from manifests import load
from manifests.cut import CutError, cut
from runtime.sequence import generate, single

__all__ = ["boundaries", "cut_points", "run_cut", "run_with_state"]


@lru_cache(maxsize=16)
def boundaries(manifest: str | Path) -> tuple[int, bool]:
    """(calls of the driven programs, whether every state is declared per layer: `name.<int>`). A
    manifest whose state is all per layer promises a cut at every call boundary (docs/cut.md)."""
    import re

    m = load(manifest)
    n = max((len(p.calls) for p in m.programs.values() if p.batched), default=0)
    return n, bool(m.states) and all(re.fullmatch(r".+\.\d+", s) for s in m.states)


@lru_cache(maxsize=16)
def cut_points(manifest: str | Path) -> tuple[int, ...]:
    """The call indices one cut may be made at (every driven program cut there verifies)."""
    m = load(manifest)
    n = max((len(p.calls) for p in m.programs.values() if p.batched), default=0)
    ok = []
    for k in range(1, n):
        try:
            cut(m, [k])
        except CutError:
            continue
        ok.append(k)
    return tuple(ok)


def run_cut(manifest: str | Path, weights: list[str], at: list[int], ids: list[int], steps: int, rows: int,
            backend: str = "cpu") -> list[int]:
    """The greedy answer to `ids` through the stages of `manifest` cut at `at`, chained in order."""
    stages = [s.manifest for s in cut(load(manifest), list(at))]
    rt, cell = single(None, [str(w) for w in weights], len(ids), steps, rows, backend, stages=stages)
    return list(generate(rt, cell, list(ids), steps, rows).ids)


def run_with_state(manifest: str | Path, weights: list[str], at: list[int], ids: list[int], steps: int, rows: int,
                   backend: str = "cpu") -> tuple[list[int], bytes]:
    """The greedy answer to `ids` and the sequence's state bytes after it (every state, in the whole
    manifest's layout: `Runtime.read_state`), through the stages of `manifest` cut at `at`, or
    through the whole manifest when `at` is empty."""
    m = load(manifest)
    stages = [s.manifest for s in cut(m, list(at))] if at else None
    rt, cell = single(None if stages else m, [str(w) for w in weights], len(ids), steps, rows, backend, stages=stages)
    g = generate(rt, cell, list(ids), steps, rows)
    return list(g.ids), rt.read_state(cell.pages, cell.slot, g.length)
