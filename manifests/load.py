"""Parse a manifest strictly into `manifests.schema` dataclasses, then verify it.

Every problem is collected, named by its field path (`buffers.salt.dtype: unknown dtype 'i63'`),
and raised at once as one `ManifestError`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from manifests.schema import (
    AXES,
    DTYPES,
    KINDS,
    SCALARS,
    Arg,
    Buffer,
    Call,
    Cut,
    Domain,
    Launch,
    Manifest,
    ManifestError,
    Module,
    Op,
    Param,
    Program,
    State,
    Var,
)

SCHEMA_VERSION = 5
_PARAM = re.compile(r"^(in|out|inout) buffer<(\w+)>$|^(in|inout) state$|^(i32|i64|f32|u8)$")


class _Errors:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, path: str, msg: str) -> None:
        self.problems.append(f"{path}: {msg}")

    def fields(self, path: str, obj: Any, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> bool:
        if not isinstance(obj, dict):
            self.add(path, f"expected an object, got {type(obj).__name__}")
            return False
        for k in obj:
            if k not in required and k not in optional:
                self.add(f"{path}.{k}", "unknown field")
        ok = True
        for k in required:
            if k not in obj:
                self.add(f"{path}.{k}", "missing")
                ok = False
        return ok

    def int_(self, path: str, v: Any, lo: int = 0) -> int | None:
        if isinstance(v, bool) or not isinstance(v, int):
            self.add(path, f"expected an integer, got {json.dumps(v)}")
            return None
        if v < lo:
            self.add(path, f"must be >= {lo}, got {v}")
            return None
        return v


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate name {k!r}")
        out[k] = v
    return out


def load(path: str | Path) -> Manifest:
    """Read, parse and verify the manifest at `path`."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ManifestError(str(path), [f"cannot read: {exc.strerror or exc}"]) from exc
    return parse(text, str(path))


def parse(text: str | dict, source: str = "<manifest>") -> Manifest:
    """Parse JSON text (or an already-decoded dict) and verify it."""
    if isinstance(text, dict):
        raw = text
    else:
        try:
            raw = json.loads(text, object_pairs_hook=_no_duplicates)
        except ValueError as exc:
            raise ManifestError(source, [f"not valid JSON: {exc}"]) from exc
    err = _Errors()
    m = _parse(raw, err, source)
    if m is not None:
        from manifests.verify import verify

        # declarations that failed to parse are left out; references to them are not re-reported
        broken = {n for sec in ("vars", "states", "buffers", "modules", "ops", "programs") for n in raw[sec]} - {
            *m.vars, *m.states, *m.buffers, *m.modules, *m.ops, *m.programs}
        verify(m, err, broken)
    if err.problems or m is None:
        raise ManifestError(source, err.problems or ["unreadable"])
    return m


def _parse(raw: Any, err: _Errors, source: str) -> Manifest | None:
    top = ("schema_version", "model", "vars", "states", "buffers", "modules", "ops", "programs")
    if not err.fields("manifest", raw, top, ("cut", "weights")):
        return None
    if raw["schema_version"] != SCHEMA_VERSION:
        err.add("schema_version", f"expected {SCHEMA_VERSION}, got {json.dumps(raw['schema_version'])}")
    if not isinstance(raw["model"], str) or not raw["model"]:
        err.add("model", "expected a non-empty string")
    for section in top[2:]:
        if not isinstance(raw[section], dict):
            err.add(section, "expected an object of named declarations")
            return None
    vars_ = {n: v for n, d in raw["vars"].items() if (v := _var(f"vars.{n}", n, d, err))}
    states = {n: s for n, d in raw["states"].items() if (s := _state(f"states.{n}", n, d, err))}
    buffers = {n: b for n, d in raw["buffers"].items() if (b := _buffer(f"buffers.{n}", n, d, err))}
    modules = {n: m for n, d in raw["modules"].items() if (m := _module(f"modules.{n}", n, d, err))}
    ops = {n: o for n, d in raw["ops"].items() if (o := _op(f"ops.{n}", n, d, err))}
    programs = {n: p for n, d in raw["programs"].items() if (p := _program(f"programs.{n}", n, d, err))}
    cut = _cut(raw["cut"], err) if "cut" in raw else None
    weights = _weights(raw["weights"], err) if "weights" in raw else {}
    return Manifest(
        schema_version=raw["schema_version"],
        model=raw["model"] if isinstance(raw["model"], str) else "",
        vars=vars_,
        states=states,
        buffers=buffers,
        modules=modules,
        ops=ops,
        programs=programs,
        raw=raw,
        source=source,
        cut=cut,
        weights=weights,
    )


def _weights(d: Any, err: _Errors) -> dict[str, str]:
    """`{"salt.safetensors": {"sha256": "<hex>"}}`: the weights files by name, each pinned by its sha256
    (checked when the weights load, as a module's sha256 is checked against its kernels)."""
    if not isinstance(d, dict):
        err.add("weights", "expected an object of weights file names")
        return {}
    out = {}
    for name, pin in d.items():
        path = f"weights.{name}"
        if not name or "/" in name or "\\" in name:
            err.add(path, "expected a file name (no directory)")
            continue
        if not err.fields(path, pin, ("sha256",)):
            continue
        if not isinstance(pin["sha256"], str) or not re.fullmatch(r"[0-9a-f]{64}", pin["sha256"]):
            err.add(f"{path}.sha256", "expected 64 lowercase hex digits")
            continue
        out[name] = pin["sha256"]
    return out


def _cut(d: Any, err: _Errors) -> Cut | None:
    if not err.fields("cut", d, ("id", "stage", "stages")):
        return None
    if not isinstance(d["id"], str) or not re.fullmatch(r"[0-9a-f]{16}", d["id"]):
        err.add("cut.id", f"expected 16 lowercase hex digits, got {json.dumps(d['id'])}")
        return None
    stage, stages = err.int_("cut.stage", d["stage"]), err.int_("cut.stages", d["stages"], 2)
    if stage is None or stages is None:
        return None
    if stage >= stages:
        err.add("cut.stage", f"stage {stage} of {stages} stages (stages count from 0)")
        return None
    return Cut(d["id"], stage, stages)


def _var(path: str, name: str, d: Any, err: _Errors) -> Var | None:
    if not err.fields(path, d, ("max",), ("axis",)):
        return None
    mx = err.int_(f"{path}.max", d["max"], 1)
    axis = d.get("axis")
    if axis is not None and axis not in AXES:
        err.add(f"{path}.axis", f"expected one of {', '.join(AXES)}, got {json.dumps(axis)}")
    return Var(name, mx, axis) if mx else None


def _state(path: str, name: str, d: Any, err: _Errors) -> State | None:
    sizes = ("bytes_per_token", "bytes_per_seq", "bytes")
    if not err.fields(path, d, (), sizes):
        return None
    vals = {k: err.int_(f"{path}.{k}", d[k], 1) for k in sizes if k in d}
    if len(vals) != 1:
        err.add(path, "needs exactly one of bytes_per_token, bytes_per_seq, bytes")
        return None
    (k, v), = vals.items()
    if v is None:
        return None
    if v % 8:
        err.add(f"{path}.{k}", f"must be a multiple of 8 bytes, got {v}")
    return State(name, **{k: v})


def _domain(path: str, d: Any, err: _Errors) -> Domain | None:
    if not isinstance(d, dict):
        err.add(path, "expected an object")
        return None
    if "index_into" in d:
        if not err.fields(path, d, ("index_into",), ("stride",)):
            return None
        stride = err.int_(f"{path}.stride", d.get("stride", 1), 1) or 1
        if not isinstance(d["index_into"], str):
            err.add(f"{path}.index_into", "expected a state or buffer name")
            return None
        return Domain(index_into=d["index_into"], stride=stride)
    if not err.fields(path, d, ("min", "max"), ("monotone",)):
        return None
    lo, hi = err.int_(f"{path}.min", d["min"], -(1 << 63)), err.int_(f"{path}.max", d["max"], -(1 << 63))
    if lo is not None and hi is not None and lo > hi:
        err.add(path, f"min {lo} > max {hi}")
    return Domain(min=lo, max=hi)


def _buffer(path: str, name: str, d: Any, err: _Errors) -> Buffer | None:
    if not err.fields(path, d, ("dtype", "shape", "kind"), ("fill", "domain", "bind")):
        return None
    ok = True
    if d["dtype"] not in DTYPES:
        err.add(f"{path}.dtype", f"unknown dtype {json.dumps(d['dtype'])} (one of {', '.join(DTYPES)})")
        ok = False
    if d["kind"] not in KINDS:
        err.add(f"{path}.kind", f"unknown kind {json.dumps(d['kind'])} (one of {', '.join(KINDS)})")
        ok = False
    shape = d["shape"]
    if not isinstance(shape, list) or not shape:
        err.add(f"{path}.shape", "expected a non-empty list of sizes and var names")
        ok = False
    else:
        for i, dim in enumerate(shape):
            if isinstance(dim, str):
                continue
            if err.int_(f"{path}.shape[{i}]", dim, 1) is None:
                ok = False
    fill = d.get("fill")
    if fill is not None and not isinstance(fill, str):
        err.add(f"{path}.fill", "expected a string")
        ok = False
    domain = _domain(f"{path}.domain", d["domain"], err) if "domain" in d else None
    bind: tuple[str, ...] = ()
    if "bind" in d:
        segs = d["bind"]
        if not isinstance(segs, list) or not segs:
            err.add(f"{path}.bind", "expected a list of {tensor} segments")
            ok = False
        else:
            names = []
            for i, seg in enumerate(segs):
                if err.fields(f"{path}.bind[{i}]", seg, ("tensor",)) and isinstance(seg["tensor"], str):
                    names.append(seg["tensor"])
                else:
                    ok = False
            bind = tuple(names)
    if not ok:
        return None
    return Buffer(name, d["dtype"], tuple(shape), d["kind"], fill, domain, bind)


def _module(path: str, name: str, d: Any, err: _Errors) -> Module | None:
    if not err.fields(path, d, ("impl", "block", "sha256")):
        return None
    block = err.int_(f"{path}.block", d["block"], 1)
    if not isinstance(d["impl"], str):
        err.add(f"{path}.impl", "expected a module path like toy.kernels")
        return None
    if not isinstance(d["sha256"], str) or not re.fullmatch(r"[0-9a-f]{64}", d["sha256"]):
        err.add(f"{path}.sha256", "expected 64 lowercase hex digits")
        return None
    return Module(name, d["impl"], block, d["sha256"]) if block else None


def _param(path: str, s: Any, err: _Errors) -> Param | None:
    m = _PARAM.match(s) if isinstance(s, str) else None
    if not m:
        err.add(path, f"bad parameter type {json.dumps(s)} (in|out|inout buffer<dtype>, in|inout state, i32, i64, f32, u8)")
        return None
    if m.group(1):
        if m.group(2) not in DTYPES:
            err.add(path, f"unknown dtype {m.group(2)!r}")
            return None
        return Param(m.group(1), "buffer", m.group(2))
    if m.group(3):
        return Param(m.group(3), "state")
    return Param(None, m.group(4))


def _launch(path: str, d: Any, params: tuple[Param, ...], err: _Errors) -> Launch | None:
    if not err.fields(path, d, ("module", "entry", "block", "grid"), ("params", "args")):
        return None
    lp = params
    if "params" in d:
        got = [_param(f"{path}.params[{i}]", s, err) for i, s in enumerate(d["params"])]
        if any(p is None for p in got):
            return None
        lp = tuple(got)
    args: list[Any] = []
    raw_args = d.get("args", [{"param": i} for i in range(len(params))])
    for i, a in enumerate(raw_args):
        ap = f"{path}.args[{i}]"
        if isinstance(a, dict) and len(a) == 1:
            (k, v), = a.items()
            if k == "param" and err.int_(ap, v) is not None:
                args.append(("param", v))
                continue
            if k in ("i32", "i64") and err.int_(ap, v, -(1 << 63)) is not None:
                args.append((k, v))
                continue
        err.add(ap, f"expected {{\"param\": i}} or a literal {{\"i32\"|\"i64\": v}}, got {json.dumps(a)}")
    block = d["block"]
    if not (isinstance(block, list) and block and all(isinstance(x, int) and x > 0 for x in block)):
        err.add(f"{path}.block", "expected a list of positive integers")
        return None
    grid = d["grid"]
    if not isinstance(grid, list) or not grid:
        err.add(f"{path}.grid", "expected a list of expressions")
        return None
    return Launch(d["module"], d["entry"], tuple(block), tuple(grid), lp, tuple(args))


def _op(path: str, name: str, d: Any, err: _Errors) -> Op | None:
    if not err.fields(path, d, ("params", "impl")):
        return None
    if not isinstance(d["params"], list):
        err.add(f"{path}.params", "expected a list")
        return None
    params = [_param(f"{path}.params[{i}]", s, err) for i, s in enumerate(d["params"])]
    if any(p is None for p in params):
        return None
    impl = d["impl"]
    if not err.fields(f"{path}.impl", impl, ("launches",)):
        return None
    launches = [_launch(f"{path}.impl.launches[{i}]", l, tuple(params), err) for i, l in enumerate(impl["launches"])]
    if any(l is None for l in launches):
        return None
    return Op(name, tuple(params), tuple(launches))


def _arg(path: str, a: Any, err: _Errors) -> Arg | None:
    if not isinstance(a, dict):
        err.add(path, "expected an object")
        return None
    for k in ("buf", "state"):
        if k in a:
            if not err.fields(path, a, (k,), ("offset",)):
                return None
            off = err.int_(f"{path}.offset", a.get("offset", 0))
            return Arg(k, a[k], off or 0)
    if len(a) == 1:
        (k, v), = a.items()
        if k == "var" and isinstance(v, str):
            return Arg("var", v)
        if k in ("i32", "i64") and err.int_(path, v, -(1 << 63)) is not None:
            return Arg(k, v)
        if k == "expr":
            return Arg("expr", v)
    err.add(path, f"expected buf, state, var, a literal or expr, got {json.dumps(a)}")
    return None


def _program(path: str, name: str, d: Any, err: _Errors) -> Program | None:
    if not err.fields(path, d, ("calls",), ("batch", "graph", "once", "derive")):
        return None
    flags = {}
    for k in ("graph", "once", "derive"):
        flags[k] = d.get(k, False)
        if not isinstance(flags[k], bool):
            err.add(f"{path}.{k}", f"expected true or false, got {json.dumps(flags[k])}")
            flags[k] = False
    groups = rows = context = None
    independent = False
    if "batch" in d:
        b = d["batch"]
        if not err.fields(f"{path}.batch", b, ("groups", "rows"), ("context", "independent_rows")):
            return None
        independent = b.get("independent_rows", False)
        if not isinstance(independent, bool):
            err.add(f"{path}.batch.independent_rows", f"expected true or false, got {json.dumps(independent)}")
            independent = False
        groups = err.int_(f"{path}.batch.groups", b["groups"], 1)
        rows = b["rows"]
        if not isinstance(rows, str) and err.int_(f"{path}.batch.rows", rows, 1) is None:
            return None
        context = b.get("context")
        if context is not None and not isinstance(context, str):
            err.add(f"{path}.batch.context", f"expected a var name, got {json.dumps(context)}")
            return None
        if groups is None:
            return None
    calls = []
    for i, c in enumerate(d["calls"] if isinstance(d["calls"], list) else []):
        cp = f"{path}.calls[{i}]"
        if not err.fields(cp, c, ("op", "args"), ("label",)):
            continue
        args = [_arg(f"{cp}.args[{j}]", a, err) for j, a in enumerate(c["args"])]
        if all(a is not None for a in args):
            calls.append(Call(c["op"], tuple(args), c.get("label")))
    if not isinstance(d["calls"], list):
        err.add(f"{path}.calls", "expected a list")
    return Program(name, groups, rows, tuple(calls), flags["graph"], flags["once"], flags["derive"], context,
                   independent)
