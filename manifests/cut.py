"""`kern cut`: split a verified manifest at call indices into pipeline stages.

A forward is a pure function of its inputs and states, so cutting every driven program (those with
a batch) at the same call indices changes no arithmetic: stage s runs calls bounds[s]..bounds[s+1]
of each, on the same values. What has to be worked out is each stage's signature:

- **Liveness.** A buffer written before a cut and read after it (before being overwritten at
  offset 0) crosses the cut. Only a workspace may cross; it becomes an `output` of the stage before
  and an `input` of the stage after (`inout` if that stage also writes it). A crossing buffer a
  stage does not touch is refused: a stage forwards nothing it does not use.
- **Ownership.** Each state region (state, call offset) belongs to one stage; a region touched by
  two stages is refused. States are kept whole by every stage that touches them (`state_use` says
  how many of the whole manifest's regions each stage uses), which is why KV is declared per layer.
- **Outputs.** Only the last stage writes outputs and carries.
- **Load programs.** `once` and `derive` programs are sliced backwards per stage: a call is kept
  when it writes something the stage (or a call kept so far) reads.

Every stage verifies; the cut's id is FNV-1a 64 over the whole manifest's canonical JSON followed
by the cut points as u64 little-endian.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from kern.errors import KernError
from manifests import expr
from manifests.load import parse
from manifests.schema import Call, Manifest, ManifestError

FNV_BASIS = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
M64 = (1 << 64) - 1

# the refusals a well-formed manifest can meet, by cut point (the property test allows only these)
REFUSALS = ("only a workspace travels", "passes through", "touched by stages", "before the last stage")


class CutError(KernError, ValueError):
    """A cut that cannot be made, and why."""


@dataclass
class Stage:
    """One stage: its manifest (a JSON-ready dict), the calls it runs and what crosses its edges."""

    index: int
    raw: dict
    manifest: Manifest | None  # raw, parsed and verified
    calls: tuple[int, int | None]  # [start, end) of every driven program; None: to the end
    arriving: dict[str, str] = field(default_factory=dict)  # buffer -> its kind here (input/inout)
    leaving: list[str] = field(default_factory=list)  # buffers this stage outputs to the next
    state_use: dict[str, tuple[int, int]] = field(default_factory=dict)  # state -> (regions used, regions in all)


def fnv1a64(data: bytes) -> int:
    h = FNV_BASIS
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & M64
    return h


def cut_id(m: Manifest, at: list[int]) -> str:
    text = json.dumps(m.raw, sort_keys=True, separators=(",", ":")).encode()
    return f"{fnv1a64(text + b''.join(a.to_bytes(8, 'little') for a in at)):016x}"


# --- accesses --------------------------------------------------------------------------------------

def _bufs(m: Manifest, call: Call, want) -> list[tuple[str, int]]:
    """(buffer, offset) of each buffer arg whose param direction satisfies `want`."""
    return [(a.value, a.offset) for a, p in zip(call.args, m.ops[call.op].params)
            if a.kind == "buf" and want(p.direction)]


def reads(m: Manifest, call: Call) -> set[str]:
    return {b for b, _ in _bufs(m, call, lambda d: d in ("in", "inout"))}


def writes(m: Manifest, call: Call) -> set[str]:
    return {b for b, _ in _bufs(m, call, lambda d: d in ("out", "inout"))}


def touched(m: Manifest, call: Call) -> set[str]:
    return {a.value for a in call.args if a.kind == "buf"}


def regions(m: Manifest, call: Call) -> set[tuple[str, int]]:
    return {(a.value, a.offset) for a in call.args if a.kind == "state"}


def state_writes(m: Manifest, call: Call) -> set[str]:
    return {a.value for a, p in zip(call.args, m.ops[call.op].params) if a.kind == "state" and p.writes}


def live_in(m: Manifest, calls: tuple[Call, ...]) -> set[str]:
    """Buffers these calls read before overwriting them whole (an `out` at offset 0 kills)."""
    live: set[str] = set()
    killed: set[str] = set()
    for call in calls:
        live |= {b for b, _ in _bufs(m, call, lambda d: d != "out")} - killed
        killed |= {b for b, off in _bufs(m, call, lambda d: d == "out") if off == 0}
    return live


# --- the cut ---------------------------------------------------------------------------------------

def _check_points(m: Manifest, at: list[int]) -> list:
    if m.cut is not None:
        raise CutError(f"{m.source} is already stage {m.cut.stage} of cut {m.cut.id}: cut the whole manifest")
    if not at:
        raise CutError("no cut points: give at least one call index")
    if any(isinstance(a, bool) or not isinstance(a, int) for a in at):
        raise CutError(f"cut points are call indices, got {at}")
    if at[0] <= 0:
        raise CutError(f"cut point {at[0]} is not after any call: cut points start at 1")
    if any(b <= a for a, b in zip(at, at[1:])):
        raise CutError(f"cut points must increase strictly, got {', '.join(map(str, at))}")
    driven = m.driven()
    if not driven:
        raise CutError("no program has a batch: there is nothing driven to cut")
    for p in driven:
        if len(p.calls) <= at[-1]:
            raise CutError(f"programs.{p.name} has {len(p.calls)} calls: cut point {at[-1]} leaves its last stage empty")
    return driven


def cut(m: Manifest, at: list[int]) -> list[Stage]:
    """Split `m` at call indices `at` into len(at) + 1 verified stages, or raise CutError."""
    driven = _check_points(m, at)
    bounds = [0, *at]
    n = len(bounds)
    span = [(bounds[s], bounds[s + 1] if s + 1 < n else None) for s in range(n)]

    def calls_of(s: int) -> list[Call]:
        lo, hi = span[s]
        return [c for p in driven for c in p.calls[lo:hi]]

    crossing = _crossing(m, driven, at)

    for s in range(n - 1):
        for c in calls_of(s):
            for b in sorted(writes(m, c)):
                if m.buffers[b].kind in ("output", "carry"):
                    raise CutError(f"op {c.op} (stage {s}) writes {m.buffers[b].kind} {b} before the last stage: only the last stage writes outputs and carries")

    owner = _owners(m, n, calls_of)

    all_regions: dict[str, set[int]] = {}
    for (st, off) in owner:
        all_regions.setdefault(st, set()).add(off)

    ident = cut_id(m, at)
    stages = []
    for s in range(n):
        arriving = crossing[s - 1] if s > 0 else set()
        leaving = crossing[s] if s < n - 1 else set()
        mine = calls_of(s)
        used = set().union(*(touched(m, c) for c in mine))
        written = set().union(*(writes(m, c) for c in mine))
        for b in sorted(arriving | leaving):
            if b not in used:
                raise CutError(f"buffer {b} passes through stage {s} untouched: a stage forwards only what it uses (cut where {b} is not live)")
        kinds = {b: ("inout" if b in written else "input") for b in arriving}
        kinds.update({b: "output" for b in leaving - arriving})
        stage = Stage(s, {}, None, span[s], {b: kinds[b] for b in sorted(arriving)}, sorted(leaving))
        stage.raw = _stage_manifest(m, span[s], kinds, {"id": ident, "stage": s, "stages": n})
        stage.state_use = {st: (len({off for c in mine for (x, off) in regions(m, c) if x == st}), len(all_regions.get(st, ())))
                           for st in stage.raw["states"]}
        try:
            stage.manifest = parse(stage.raw, f"stage {s}")
        except ManifestError as exc:
            raise CutError(f"stage {s} does not verify: {exc}") from exc
        stages.append(stage)
    return stages


def _crossing(m: Manifest, driven: list, at: list[int]) -> list[set[str]]:
    """The buffers live across each cut (written before it, read after it); CutError for any that is
    not a workspace."""
    crossing: list[set[str]] = []
    for a in at:
        x: set[str] = set()
        for p in driven:
            x |= live_in(m, p.calls[a:]) & set().union(*(writes(m, c) for c in p.calls[:a]))
        for b in sorted(x):
            if m.buffers[b].kind != "workspace":
                raise CutError(f"buffer {b} ({m.buffers[b].kind}) is live across the cut at call {a}: only a workspace travels between stages")
        crossing.append(x)
    return crossing


def _owners(m: Manifest, n: int, calls_of) -> dict[tuple[str, int], set[int]]:
    """(state, offset) -> the stages whose calls touch it; CutError where two stages share one."""
    owner: dict[tuple[str, int], set[int]] = {}
    for s in range(n):
        for c in calls_of(s):
            for r in regions(m, c):
                owner.setdefault(r, set()).add(s)
    for (st, off), stages in sorted(owner.items()):
        if len(stages) > 1:
            raise CutError(f"state {st} at offset {off} is touched by stages {', '.join(map(str, sorted(stages)))}: each state region belongs to one stage")
    return owner


def _slice_at_load(m: Manifest, kept_driven: list[Call]) -> dict[str, list[int]]:
    """The once/derive calls each kept: walking backwards, a call stays if it writes something needed."""
    needed = set().union(*(reads(m, c) for c in kept_driven)) | {f"state:{st}" for c in kept_driven for st, _ in regions(m, c)}
    load = [p for p in m.programs.values() if p.once or p.derive]
    keep: dict[str, list[int]] = {}
    while True:
        before = len(needed)
        for p in load:
            got = []
            for i in reversed(range(len(p.calls))):
                c = p.calls[i]
                outs = writes(m, c) | {f"state:{st}" for st in state_writes(m, c)}
                if outs & needed:
                    got.append(i)
                    needed |= reads(m, c) | {f"state:{st}" for st, _ in regions(m, c)}
            keep[p.name] = sorted(got)
        if len(needed) == before:
            return {k: v for k, v in keep.items() if v}


def _var_names(obj) -> set[str]:
    """Var names mentioned in shapes, grids, args and batches of a JSON-ready stage."""
    out: set[str] = set()
    for b in obj["buffers"].values():
        out |= {d for d in b["shape"] if isinstance(d, str)}
    for op in obj["ops"].values():
        for launch in op["impl"]["launches"]:
            for g in launch["grid"]:
                out |= expr.names(g) if expr.check(g) is None else set()
    for p in obj["programs"].values():
        if "batch" in p:
            out |= {v for v in (p["batch"]["rows"], p["batch"].get("context")) if isinstance(v, str)}
        for c in p["calls"]:
            for a in c["args"]:
                if "var" in a:
                    out.add(a["var"])
                if "expr" in a and expr.check(a["expr"]) is None:
                    out |= expr.names(a["expr"])
    return out


def _stage_manifest(m: Manifest, span: tuple[int, int | None], kinds: dict[str, str], cut_field: dict) -> dict:
    raw = m.raw
    lo, hi = span
    programs: dict[str, dict] = {}
    kept_calls: list[Call] = []
    for p in m.driven():
        d = dict(raw["programs"][p.name])
        d["calls"] = d["calls"][lo:hi]
        programs[p.name] = d
        kept_calls += p.calls[lo:hi]
    for name, idx in _slice_at_load(m, list(kept_calls)).items():
        d = dict(raw["programs"][name])
        d["calls"] = [d["calls"][i] for i in idx]
        programs[name] = d
        kept_calls += [m.programs[name].calls[i] for i in idx]
    programs = {k: programs[k] for k in raw["programs"] if k in programs}  # the whole's order

    bufs = set().union(*(touched(m, c) for c in kept_calls))
    states = {st for c in kept_calls for st, _ in regions(m, c)}
    buffers = {}
    for name, d in raw["buffers"].items():
        if name not in bufs:
            continue
        d = dict(d)
        if name in kinds:
            d["kind"] = kinds[name]
        target = d.get("domain", {}).get("index_into")
        if target is not None and target not in states and target not in bufs:
            d["domain"] = _retarget(m, target, states, d["domain"])
            if d["domain"] is None:
                del d["domain"]
        buffers[name] = d
    ops = {c.op for c in kept_calls}
    modules = {l.module for o in ops for l in m.ops[o].launches}
    stage = {
        "schema_version": raw["schema_version"],
        "model": raw["model"],
        "cut": cut_field,
        "vars": {},
        "states": {k: v for k, v in raw["states"].items() if k in states},
        "buffers": buffers,
        "modules": {k: v for k, v in raw["modules"].items() if k in modules},
        "ops": {k: v for k, v in raw["ops"].items() if k in ops},
        "programs": programs,
    }
    if "weights" in raw:  # the whole's pinned weights files: a stage loads (a subset of) the same files
        stage["weights"] = raw["weights"]
    names = _var_names(stage)
    if any("batch" in p for p in programs.values()):
        names |= {v.name for v in m.vars.values() if v.axis}
    stage["vars"] = {k: v for k, v in raw["vars"].items() if k in names}
    return json.loads(json.dumps(stage))  # a copy sharing nothing with the whole


def _retarget(m: Manifest, target: str, kept: set[str], domain: dict) -> dict | None:
    """A table indexing a dropped state indexes a kept state of the same kind instead, or loses its domain."""
    if target not in m.states:
        return None
    want = m.states[target]
    same = [s for s in m.states if s in kept and (m.states[s].paged, m.states[s].lined) == (want.paged, want.lined)]
    if not same:
        return None
    return {**domain, "index_into": same[0]}


def report(stages: list[Stage]) -> str:
    """One block per stage: its calls, what arrives and leaves, and how much of each state it uses."""
    lines = [f"cut {stages[0].raw['cut']['id']}: {len(stages)} stages"]
    for st in stages:
        lo, hi = st.calls
        lines.append(f"stage {st.index}: calls {lo}..{'end' if hi is None else hi - 1}")
        if st.arriving:
            lines.append("  arriving: " + ", ".join(f"{b} ({k})" for b, k in st.arriving.items()))
        if st.leaving:
            lines.append("  leaving:  " + ", ".join(f"{b} (output)" for b in st.leaving))
        for name, (used, whole) in st.state_use.items():
            share = "" if used == whole else " (held whole for other stages' regions)"
            lines.append(f"  state {name}: {used} of {whole} regions{share}")
    return "\n".join(lines)


def write(stages: list[Stage], out: str | Path, weights: list[str] | tuple[str, ...]) -> Path:
    """`kern cut --out`: each stage as stage-N.json in `out` (made if missing), beside a link to each
    weights file (one already there replaced, unless it is that very file); the directory."""
    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    for st in stages:
        (dest / f"stage-{st.index}.json").write_text(json.dumps(st.raw, indent=1) + "\n")
    for w in weights:
        link = dest / Path(w).name
        if link.resolve() != Path(w).resolve():
            link.unlink(missing_ok=True)
            link.symlink_to(Path(w).resolve())
    return dest
