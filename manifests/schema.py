"""The manifest schema (docs/manifest.md) as frozen, slotted dataclasses.

The runtime never touches raw dicts after load: `manifests.load.parse` builds these, and every
check that needs more than one field at a time lives in `manifests.verify`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kern.errors import KernError

DTYPES = {"i32": 4, "i64": 8, "u8": 1, "f32": 4, "bf16": 2, "u64": 8}
KINDS = ("input", "output", "inout", "weight", "source", "workspace", "carry")
INPUT_FILLS = ("token", "position", "slot", "seq_len", "cu_seqlens")
OUTPUT_FILLS = ("tokens", "count")
AXES = ("rows", "groups")
SCALARS = ("i32", "i64", "f32", "u8")


class ManifestError(KernError, ValueError):
    """A manifest that does not parse or verify; `problems` names every field that is wrong."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = list(problems)
        n = len(self.problems)
        super().__init__(f"{source}: {n} problem{'s' if n != 1 else ''}: " + "; ".join(self.problems))


@dataclass(frozen=True, slots=True)
class Var:
    name: str
    max: int
    axis: str | None = None


@dataclass(frozen=True, slots=True)
class State:
    name: str
    bytes_per_token: int = 0
    bytes_per_seq: int = 0
    bytes: int = 0

    @property
    def paged(self) -> bool:
        return self.bytes_per_token > 0

    @property
    def lined(self) -> bool:
        return self.bytes_per_seq > 0


@dataclass(frozen=True, slots=True)
class Domain:
    min: int | None = None
    max: int | None = None
    index_into: str | None = None
    stride: int = 1


@dataclass(frozen=True, slots=True)
class Buffer:
    name: str
    dtype: str
    shape: tuple[int | str, ...]
    kind: str
    fill: str | None = None
    domain: Domain | None = None
    bind: tuple[str, ...] = ()

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    def dims(self, env: dict[str, int]) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else env[d] for d in self.shape)

    def nbytes(self, env: dict[str, int]) -> int:
        n = self.itemsize
        for d in self.dims(env):
            n *= d
        return n


@dataclass(frozen=True, slots=True)
class Module:
    name: str
    impl: str
    block: int
    sha256: str


@dataclass(frozen=True, slots=True)
class Param:
    """One interface parameter: `in|out|inout buffer<dtype>`, `in|inout state`, or a scalar."""

    direction: str | None  # None for scalars
    what: str  # "buffer", "state" or the scalar type
    dtype: str | None = None

    @property
    def is_scalar(self) -> bool:
        return self.direction is None

    @property
    def writes(self) -> bool:
        return self.direction in ("out", "inout")

    @property
    def reads(self) -> bool:
        return self.direction in ("in", "inout")


@dataclass(frozen=True, slots=True)
class Launch:
    module: str
    entry: str
    block: tuple[int, ...]
    grid: tuple[Any, ...]
    params: tuple[Param, ...]
    args: tuple[Any, ...]  # ("param", i) or ("i32"|"i64", value)


@dataclass(frozen=True, slots=True)
class Op:
    name: str
    params: tuple[Param, ...]
    launches: tuple[Launch, ...]


@dataclass(frozen=True, slots=True)
class Arg:
    """A call argument: buf/state (with byte offset), var, literal or expression."""

    kind: str  # "buf", "state", "var", "i32", "i64", "expr"
    value: Any
    offset: int = 0


@dataclass(frozen=True, slots=True)
class Call:
    op: str
    args: tuple[Arg, ...]
    label: str | None = None


@dataclass(frozen=True, slots=True)
class Program:
    """A list of calls. With a batch it is driven by the serving loop; `once` runs after load,
    `derive` inside load (turning `source` buffers into weights).

    `context` names the var bounding the call's context: the sum over the call's sequences of
    the length each reaches (pos + rows). Its max is the bound `pack()` and admission use.

    `independent_rows` (a chunk only): every row's calls read that row's token, position and slot,
    the states and the weights, and nothing of its sequence (no length, table or `cu_seqlens`), and
    the program emits nothing; so the rows of several sequences may share one call, laid one after
    another (a prefill that only writes each token's state)."""

    name: str
    groups: int | None  # None: not driven by the serving loop
    rows: int | str | None  # a constant, or a var name (a chunk: rows set per call)
    calls: tuple[Call, ...]
    graph: bool = False
    once: bool = False
    derive: bool = False
    context: str | None = None
    independent_rows: bool = False

    @property
    def batched(self) -> bool:
        return self.groups is not None

    @property
    def chunked(self) -> bool:
        return isinstance(self.rows, str)


@dataclass(frozen=True, slots=True)
class Cut:
    """Written by `kern cut` on each stage: the cut's id, this stage's index, how many stages."""

    id: str
    stage: int
    stages: int


@dataclass(frozen=True, slots=True)
class Manifest:
    schema_version: int
    model: str
    vars: dict[str, Var]
    states: dict[str, State]
    buffers: dict[str, Buffer]
    modules: dict[str, Module]
    ops: dict[str, Op]
    programs: dict[str, Program]
    raw: dict = field(compare=False, repr=False)
    source: str = ""
    cut: Cut | None = None
    weights: dict[str, str] = field(default_factory=dict)  # weights file name -> its pinned sha256

    def var_max(self) -> dict[str, int]:
        return {v.name: v.max for v in self.vars.values()}

    def axis(self, axis: str) -> Var:
        for v in self.vars.values():
            if v.axis == axis:
                return v
        raise KeyError(f"no var with axis {axis!r}")

    def driven(self) -> list[Program]:
        """The programs the serving loop drives (those with a batch)."""
        return [p for p in self.programs.values() if p.batched]

    def filled(self, fill: str) -> list[Buffer]:
        return [b for b in self.buffers.values() if b.fill == fill]
