"""The stages of a cut manifest run in order in one process: `kern run --stages DIR`.

    load_stages(dir)    the stage manifests `kern cut` wrote (every *.json with a `cut` field), in order
    Chain               one Runtime per stage behind the Runtime's own face (step, set_pad, read_state)

A step runs each stage's calls over the same cells, then copies every buffer the stage hands on
(its `output`s and `inout`s that the next stage takes as `input` or `inout`) into the next stage,
at the size the step used. Only the last stage emits. Every stage holds the same page and slot
ids, each for the states it owns, so `read_state` gathers the whole manifest's bytes from them.
"""

from __future__ import annotations

import json
from pathlib import Path

from kern.errors import KernError
from manifests import load
from manifests.schema import Manifest
from runtime.backend import Backend
from runtime.backends import make_backend
from runtime.runtime import Runtime
from runtime.step import Cell
from runtime.weights import bound_tensors, read_tensors


class StagesError(KernError, ValueError):
    """A stage directory that is not one whole cut: no stages, a missing stage, mixed cuts."""


def load_stages(directory: str | Path) -> list[Manifest]:
    """The stage manifests in `directory`, ordered by `cut.stage`; all of one cut, none missing."""
    d = Path(directory)
    if not d.is_dir():
        raise StagesError(f"--stages {d}: not a directory")
    stages = []
    for path in sorted(d.glob("*.json")):
        try:
            raw = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(raw, dict) and "cut" in raw:
            stages.append(load(path))
    if not stages:
        raise StagesError(f"--stages {d}: no stage manifests (*.json with a cut field) in it")
    ids = {m.cut.id for m in stages}
    if len(ids) > 1:
        raise StagesError(f"--stages {d}: stages of {len(ids)} different cuts ({', '.join(sorted(ids))})")
    stages.sort(key=lambda m: m.cut.stage)
    want = list(range(stages[0].cut.stages))
    got = [m.cut.stage for m in stages]
    if got != want:
        raise StagesError(f"--stages {d}: cut {stages[0].cut.id} has stages {want}, the directory holds {got}")
    return stages


def handoffs(a: Manifest, b: Manifest) -> list[str]:
    """The buffers stage `a` hands to stage `b`: written out of `a` and taken in by `b`."""
    out = []
    for name, buf in a.buffers.items():
        nxt = b.buffers.get(name)
        if buf.kind in ("output", "inout") and nxt is not None and nxt.kind in ("input", "inout") and not nxt.fill:
            out.append(name)
    return out


class Chain:
    """The stages of one cut, each a Runtime over the same pages and slots, run one after another."""

    def __init__(self, stages: list[Manifest], weights: list | dict, pages: int, slots: int = 0,
                 backend: str | Backend = "cpu", max_seqs: int | None = None):
        be = make_backend(backend) if isinstance(backend, str) else backend
        pins = {k: v for m in stages for k, v in m.weights.items()}
        tensors = weights if isinstance(weights, dict) else read_tensors(
            weights, pins, set().union(*(bound_tensors(m) for m in stages)))
        self.stages = [Runtime(m, tensors, pages, slots, be, max_seqs) for m in stages]
        self.backend = be
        last = self.stages[-1]
        self.manifest = last.manifest
        self.protocol = last.protocol
        self.unit, self.reach, self.lined = last.unit, min(r.reach for r in self.stages), any(r.lined for r in self.stages)
        self.pages, self.slots, self.max_seqs = pages, last.slots, last.max_seqs
        self.handoffs = [handoffs(a, b) for a, b in zip(stages, stages[1:])]
        owners: dict[str, int] = {}
        for i, m in enumerate(stages):
            for s in m.states:
                if s in owners:
                    raise StagesError(f"state {s} is held by stages {owners[s]} and {i}; read_state needs one owner a state")
                owners[s] = i
        self.load_report = {k: sum(r.load_report[k] for r in self.stages) for k in last.load_report}

    def set_pad(self, page: int, slot: int | None) -> None:
        for rt in self.stages:
            rt.set_pad(page, slot if rt.lined else None)

    def zero_slot(self, slot: int) -> None:
        for rt in self.stages:
            if rt.lined:
                rt.zero_slot(slot)

    def step(self, program: str, cells: list[Cell]) -> list[Cell]:
        be = self.backend
        for i, rt in enumerate(self.stages):
            rt.step(program, cells)
            if i + 1 < len(self.stages):
                nxt = self.stages[i + 1]
                for name in self.handoffs[i]:
                    n = rt.manifest.buffers[name].nbytes(rt.last_env)
                    be.copy(be.view(nxt.buffers[name], "u8"), 0, be.view(rt.buffers[name], "u8"), 0, n)
        return cells

    def read_state(self, pages: list[int], slot: int | None, tokens: int) -> bytes:
        """The whole manifest's state bytes (`Runtime.read_state`'s layout) gathered from the stages."""
        parts: dict[tuple[int, str], bytes] = {}
        for rt in self.stages:
            for s in rt.paged:
                parts[(0, s.name)] = rt.read_state_of(s.name, pages, slot, tokens)
            if slot is not None:
                for s in rt.lined_states:
                    parts[(1, s.name)] = rt.read_state_of(s.name, pages, slot, tokens)
        return b"".join(parts[k] for k in sorted(parts))
