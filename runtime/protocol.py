"""The serving protocol: a pure projection of a manifest onto the programs a serving loop drives.

Each batched program is a `Forward` (groups, rows, what it emits); `forward(b, rows)` picks the
program for b sequences of `rows` rows, `chunk()` the prefill program.
"""

from __future__ import annotations

from dataclasses import dataclass

from kern.errors import KernError
from manifests.schema import Manifest


class ProtocolError(KernError, ValueError):
    """The manifest's programs cannot be driven as asked (a missing forward, a bad --rows)."""


@dataclass(frozen=True, slots=True)
class Forward:
    program: str
    groups: int
    rows: int | None  # None: a chunk (rows is the rows var's value per call)
    emits: str | None  # the `tokens` output it writes
    count: str | None  # the `count` output it writes
    width: int  # tokens per group in the emits buffer
    context: str | None = None  # the var bounding the call's summed sequence lengths


def _writes(m: Manifest, program: str) -> set[str]:
    out = set()
    for call in m.programs[program].calls:
        op = m.ops[call.op]
        for arg, prm in zip(call.args, op.params):
            if arg.kind == "buf" and prm.writes:
                out.add(arg.value)
    return out


class Protocol:
    def __init__(self, m: Manifest):
        self.manifest = m
        self.rows_var = m.axis("rows").name
        self.groups_var = m.axis("groups").name
        self.forwards: list[Forward] = []
        for p in m.programs.values():
            if not p.batched:
                continue
            written = _writes(m, p.name)
            emits = next((b for b in written if m.buffers[b].fill == "tokens"), None)
            count = next((b for b in written if m.buffers[b].fill == "count"), None)
            width = 1
            if emits and len(m.buffers[emits].shape) > 1:
                width = m.buffers[emits].shape[-1]
            rows = None if p.chunked else p.rows
            self.forwards.append(Forward(p.name, p.groups, rows, emits, count, width, p.context))
        shapes = [(f.rows, f.groups) for f in self.forwards]
        if len(set(shapes)) != len(shapes):
            raise ProtocolError("two programs accept the same shape")

    def forward(self, b: int, rows: int) -> Forward:
        fits = [f for f in self.forwards if f.rows == rows and f.groups >= b]
        if not fits:
            raise ProtocolError(f"no program takes {b} sequence(s) of {rows} row(s)")
        return min(fits, key=lambda f: f.groups)

    def chunk(self) -> Forward | None:
        return next((f for f in self.forwards if f.rows is None), None)

    @property
    def row_choices(self) -> list[int]:
        """The declared constant rows values (1 = plain decode)."""
        return sorted({f.rows for f in self.forwards if f.rows is not None})

    @property
    def widest(self) -> int:
        return max(self.row_choices)

    @property
    def max_groups(self) -> int:
        return max(f.groups for f in self.forwards if f.rows is not None)

    @property
    def prefill_emits(self) -> bool:
        c = self.chunk()
        return bool(c and c.emits)

    @property
    def context_bound(self) -> int | None:
        """The chunk program's context bound (its `batch.context` var's max), or None if it declares none."""
        c = self.chunk()
        return self.manifest.vars[c.context].max if c and c.context else None

    @property
    def packs(self) -> bool:
        """Whether the chunk program takes several sequences per call: split by a cu_seqlens input, or
        rows laid one after another that read nothing of their sequence (`independent_rows`)."""
        c = self.chunk()
        if c and c.groups > 1 and self.manifest.programs[c.program].independent_rows:
            return True
        return bool(c and self.manifest.filled("cu_seqlens") and any(
            a.kind == "buf" and self.manifest.buffers[a.value].fill == "cu_seqlens"
            for call in self.manifest.programs[c.program].calls for a in call.args))

    @property
    def chunk_max(self) -> int:
        return self.manifest.vars[self.rows_var].max

    def check_rows(self, rows: int, page: int) -> None:
        if rows not in self.row_choices:
            raise ProtocolError(f"--rows {rows}: the manifest declares rows {', '.join(map(str, self.row_choices))}")
        if rows > page:
            raise ProtocolError(f"--rows {rows} is over the page of {page} tokens (the pad page holds one group)")
        if rows > 1 and self.chunk() is None:
            raise ProtocolError(f"--rows {rows} needs a chunk (prefill) program")
