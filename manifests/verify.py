"""Cross-field checks of a parsed manifest (docs/manifest.md): every problem is reported, none stops the rest.

References resolve; kernel modules import and hash to their `sha256`; launch args agree with
launch params; an op's impl honours its interface; programs pass buffers of the right kind and
dtype, read nothing before it is written and write no input or weight (but a derive program, which
turns sources into weights at load); only derive programs read sources; every output and carry is
written somewhere; every declaration is used; shapes and batches fit their var bounds; program
flags combine as the format allows (derive with nothing, once without a batch, a graph only with
one); a chunk of several sequences is split by a cu_seqlens input.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from manifests import derive, expr
from manifests.schema import INPUT_FILLS, OUTPUT_FILLS, Manifest



class _Errors(Protocol):
    """Where problems go (manifests/load.py's collector, which imports this module: named here, not
    imported back)."""

    def add(self, path: str, msg: str) -> None: ...

MAX_BUFFER_BYTES = 1 << 40
MAX_GRID = (1 << 31) - 1


def verify(m: Manifest, err: "_Errors", broken: set[str] = frozenset()) -> None:
    """Add every cross-field problem to `err`; references to `broken` names (already reported) are skipped."""
    err = _Quiet(err, broken)
    used: set[tuple[str, str]] = set()
    _vars(m, err)
    _buffers(m, err, used)
    _modules(m, err)
    _ops(m, err, used)
    _programs(m, err, used)
    _unused(m, err, used)


class _Quiet:
    """Drops the problems that only repeat a parse error: a reference to a declaration that did not parse."""

    def __init__(self, err, broken: set[str]):
        self.err, self.broken = err, broken

    def add(self, path: str, msg: str) -> None:
        if any(f"'{n}'" in msg for n in self.broken) or any(f" {n} " in f" {msg} " for n in self.broken):
            return
        self.err.add(path, msg)


def _vars(m: Manifest, err: "_Errors") -> None:
    seen: dict[str, str] = {}
    for v in m.vars.values():
        if v.axis:
            if v.axis in seen:
                err.add(f"vars.{v.name}.axis", f"axis {v.axis!r} is already vars.{seen[v.axis]}'s")
            seen[v.axis] = v.name
    if any(p.batched for p in m.programs.values()):
        for axis in ("rows", "groups"):
            if axis not in seen:
                err.add("vars", f"a manifest with a batch needs a var with axis {axis!r}")


def _buffers(m: Manifest, err: "_Errors", used: set) -> None:
    env = m.var_max()
    for b in m.buffers.values():
        p = f"buffers.{b.name}"
        for i, d in enumerate(b.shape):
            if isinstance(d, str):
                if d not in m.vars:
                    err.add(f"{p}.shape[{i}]", f"unknown var {d!r}")
                else:
                    used.add(("var", d))
        if all(isinstance(d, int) or d in m.vars for d in b.shape):
            nbytes = b.nbytes(env)
            if nbytes > MAX_BUFFER_BYTES:
                err.add(f"{p}.shape", f"{nbytes} bytes at the var maxima, over the bound of {MAX_BUFFER_BYTES}")
        if b.fill is not None:
            allowed = INPUT_FILLS if b.kind == "input" else OUTPUT_FILLS if b.kind == "output" else ()
            if b.fill not in allowed:
                err.add(f"{p}.fill", f"fill {b.fill!r} is not allowed on a {b.kind} buffer (allowed: {', '.join(allowed) or 'none'})")
            if b.dtype not in ("i32", "i64"):
                err.add(f"{p}.fill", f"fills need an i32 or i64 buffer, not {b.dtype}")
        if b.kind == "source" and not b.bind:
            err.add(f"{p}.bind", "a source needs a bind naming its checkpoint tensor")
        if b.bind and b.kind not in ("weight", "source"):
            err.add(f"{p}.bind", f"only weights and sources bind tensors, this is a {b.kind}")
        if b.domain and b.domain.index_into is not None:
            target = b.domain.index_into
            if target in m.states:
                s = m.states[target]
                if s.lined and s.bytes_per_seq % b.domain.stride:
                    err.add(f"{p}.domain.stride", f"{b.domain.stride} does not divide states.{target}.bytes_per_seq")
                if s.paged and b.fill is None and not isinstance(b.shape[-1], int):
                    err.add(f"{p}.shape", "a page table's last dim must be a constant width")
            elif target not in m.buffers:
                err.add(f"{p}.domain.index_into", f"unknown state or buffer {target!r}")


def _modules(m: Manifest, err: "_Errors") -> None:
    for mod in m.modules.values():
        p = f"modules.{mod.name}"
        try:
            impl = importlib.import_module(mod.impl)
        except ImportError as exc:
            err.add(f"{p}.impl", f"cannot import {mod.impl!r}: {exc}")
            continue
        build_hash = getattr(impl, "build_hash", None)
        if build_hash is None:
            err.add(f"{p}.impl", f"{mod.impl!r} is not a kernel module (no build_hash)")
            continue
        want = build_hash({"block": mod.block})
        if want != mod.sha256:
            err.add(f"{p}.sha256", f"does not match the kernels' sources and build (they hash to {want[:16]}...)")


def _ops(m: Manifest, err: "_Errors", used: set) -> None:
    env = m.var_max()
    for op in m.ops.values():
        p = f"ops.{op.name}"
        forwarded_writes: set[int] = set()
        for li, l in enumerate(op.launches):
            lp = f"{p}.impl.launches[{li}]"
            mod = m.modules.get(l.module)
            if mod is None:
                err.add(f"{lp}.module", f"unknown module {l.module!r}")
            else:
                used.add(("module", l.module))
                if l.block[0] != mod.block:
                    err.add(f"{lp}.block", f"block {l.block[0]} differs from modules.{l.module}.block {mod.block}")
            for gi, g in enumerate(l.grid):
                problem = expr.check(g)
                if problem:
                    err.add(f"{lp}.grid[{gi}]", problem)
                    continue
                for n in expr.names(g):
                    if n not in m.vars:
                        err.add(f"{lp}.grid[{gi}]", f"unknown var {n!r}")
                    else:
                        used.add(("var", n))
                if not expr.names(g) - set(m.vars) and expr.evaluate(g, env) > MAX_GRID:
                    err.add(f"{lp}.grid[{gi}]", f"{expr.evaluate(g, env)} blocks at the var maxima, over {MAX_GRID}")
            if len(l.args) != len(l.params):
                err.add(f"{lp}.args", f"{len(l.args)} args for {len(l.params)} launch params")
            for ai, (a, lparam) in enumerate(zip(l.args, l.params)):
                kind, v = a
                if kind == "param":
                    if v >= len(op.params):
                        err.add(f"{lp}.args[{ai}]", f"param {v} is past the interface's {len(op.params)}")
                        continue
                    iparam = op.params[v]
                    if (iparam.what, iparam.dtype) != (lparam.what, lparam.dtype):
                        err.add(f"{lp}.args[{ai}]", f"forwards {_fmt(iparam)} to a {_fmt(lparam)} launch param")
                    if lparam.writes and not iparam.writes:
                        err.add(f"{lp}.args[{ai}]", f"writes through interface param {v}, declared {_fmt(iparam)}")
                    if lparam.writes:
                        forwarded_writes.add(v)
                elif not lparam.is_scalar or lparam.what != kind:
                    err.add(f"{lp}.args[{ai}]", f"literal {kind} for a {_fmt(lparam)} launch param")
        for i, ip in enumerate(op.params):
            if ip.direction == "out" and i not in forwarded_writes:
                err.add(f"{p}.params[{i}]", "declared out but no launch writes it")


def _fmt(p) -> str:
    if p.is_scalar:
        return p.what
    return f"{p.direction} {p.what}" + (f"<{p.dtype}>" if p.dtype else "")


def _flags(prog, p: str, err: "_Errors") -> None:
    """derive combines with nothing else; once not with a batch; a graph needs a batch."""
    if prog.derive:
        others = [k for k, on in (("batch", prog.batched), ("once", prog.once), ("graph", prog.graph)) if on]
        if others:
            err.add(f"{p}.derive", f"a derive program runs inside load and takes no {', '.join(others)}")
    elif prog.once and prog.batched:
        err.add(f"{p}.once", "a once program runs after load, not in the serving loop: it takes no batch")
    elif prog.graph and not prog.batched:
        err.add(f"{p}.graph", "a graph is captured per call of a driven program: it needs a batch")


def _batch(m: Manifest, prog, p: str, err: "_Errors", used: set, rows_var, groups_var) -> None:
    if isinstance(prog.rows, str):
        if prog.rows not in m.vars:
            err.add(f"{p}.batch.rows", f"unknown var {prog.rows!r}")
        else:
            used.add(("var", prog.rows))
    elif rows_var and prog.groups * prog.rows > rows_var.max:
        err.add(f"{p}.batch", f"groups {prog.groups} x rows {prog.rows} is over vars.{rows_var.name}.max {rows_var.max}")
    if groups_var and prog.groups > groups_var.max:
        err.add(f"{p}.batch.groups", f"{prog.groups} is over vars.{groups_var.name}.max {groups_var.max}")
    if prog.context is not None:
        if prog.context not in m.vars:
            err.add(f"{p}.batch.context", f"unknown var {prog.context!r}")
        elif prog.context in (rows_var and rows_var.name, groups_var and groups_var.name):
            err.add(f"{p}.batch.context", f"var {prog.context!r} already counts the call's {m.vars[prog.context].axis}")
        else:
            used.add(("var", prog.context))
    passed = {a.value for c in prog.calls for a in c.args if a.kind == "buf"}
    splits = [b for b in m.filled("cu_seqlens") if b.name in passed]
    if prog.independent_rows:
        _independent(m, prog, p, err, passed, groups_var)
    elif prog.chunked and prog.groups > 1 and not splits:
        err.add(f"{p}.batch.groups", f"a chunk of {prog.groups} sequences needs a cu_seqlens input to split its rows"
                " (or independent_rows, where no row reads its sequence)")
    for b in splits:
        if len(b.shape) != 1:
            err.add(f"buffers.{b.name}.shape", "a cu_seqlens buffer has one dim")
            continue
        d = b.shape[0]
        room = d if isinstance(d, int) else m.vars[d].max if d in m.vars else None
        if room is not None and room < prog.groups + 1:
            err.add(f"buffers.{b.name}.shape", f"holds {room} offsets, {p} packs {prog.groups} sequences (needs {prog.groups + 1})")


def _independent(m: Manifest, prog, p: str, err: "_Errors", passed: set, groups_var) -> None:
    """independent_rows: a chunk whose rows read nothing of their sequence and that emits nothing."""
    if not prog.chunked:
        err.add(f"{p}.batch.independent_rows", "only a chunk (rows given as a var) lays several sequences' rows in one call")
        return
    tables = {b.name for b in derive.page_tables(m) + derive.line_tables(m)}
    for name in sorted(passed):
        b = m.buffers.get(name)
        if b is None:
            continue
        per_seq = name in tables or b.fill in ("seq_len", "cu_seqlens")
        if b.fill in ("tokens", "count"):
            err.add(f"{p}.batch.independent_rows", f"buffer {name!r} emits per sequence: independent rows emit nothing")
        elif per_seq or (groups_var is not None and groups_var.name in b.shape):
            err.add(f"{p}.batch.independent_rows", f"buffer {name!r} is per sequence: its rows read their sequence")


def _programs(m: Manifest, err: "_Errors", used: set) -> None:
    written_anywhere: set[str] = set()
    derived: set[str] = set()
    rows_var = next((v for v in m.vars.values() if v.axis == "rows"), None)
    groups_var = next((v for v in m.vars.values() if v.axis == "groups"), None)
    for prog in m.programs.values():
        p = f"programs.{prog.name}"
        _flags(prog, p, err)
        at_load = "derive" if prog.derive else "once" if prog.once else None
        if prog.batched:
            _batch(m, prog, p, err, used, rows_var, groups_var)
        written: set[str] = set()
        for ci, call in enumerate(prog.calls):
            cp = f"{p}.calls[{ci}]"
            op = m.ops.get(call.op)
            if op is None:
                err.add(f"{cp}.op", f"unknown op {call.op!r}")
                continue
            used.add(("op", call.op))
            if len(call.args) != len(op.params):
                err.add(f"{cp}.args", f"{len(call.args)} args for op {call.op}'s {len(op.params)} params")
                continue
            writes: list[str] = []
            for ai, (a, prm) in enumerate(zip(call.args, op.params)):
                ap = f"{cp}.args[{ai}]"
                if a.kind == "buf":
                    if _buf_arg(m, prog, call.op, a, prm, ap, err, used, written, at_load):
                        writes.append(a.value)
                        if prog.derive and m.buffers[a.value].kind == "weight":
                            derived.add(a.value)
                else:
                    _other_arg(m, a, prm, ap, err, used)
            written.update(writes)
        written_anywhere |= written
    for b in m.buffers.values():
        if b.kind in ("output", "carry") and b.name not in written_anywhere and ("buffer", b.name) in used:
            err.add(f"buffers.{b.name}", f"{b.kind} is never written by any program")
        if b.kind == "weight" and not b.bind and b.name not in derived:
            err.add(f"buffers.{b.name}.bind", "a weight needs a bind naming its tensor, or a derive program that writes it")


def _buf_arg(m: Manifest, prog, op: str, a, prm, ap: str, err: "_Errors", used: set, written: set,
             at_load: str | None) -> bool:
    """Check a buffer argument `a` of a call to `op` in `prog` (at `ap`) against its param; whether the
    call writes it (False where the buffer is unknown or passed to a param that is not a buffer)."""
    b = m.buffers.get(a.value)
    if b is None:
        err.add(ap, f"unknown buffer {a.value!r}")
        return False
    used.add(("buffer", a.value))
    if prm.what != "buffer":
        err.add(ap, f"buffer {a.value} passed to a {_fmt(prm)} param")
        return False
    if b.dtype != prm.dtype:
        err.add(ap, f"buffer {a.value} is {b.dtype}, the param wants {prm.dtype}")
    if prm.writes and (b.kind in ("input", "source") or b.kind == "weight" and not prog.derive):
        err.add(ap, f"op {op} writes {b.kind} buffer {a.value}" + (
            " (only a derive program writes weights)" if b.kind == "weight" else ""))
    if prm.reads and b.kind in ("output", "workspace") and a.value not in written:
        err.add(ap, f"reads {b.kind} buffer {a.value} before anything in {prog.name} writes it")
    if prm.reads and b.kind == "source" and not prog.derive:
        err.add(ap, f"reads source buffer {a.value} outside a derive program (a source lives only during load)")
    if prm.reads and at_load and b.kind in ("input", "inout"):
        err.add(ap, f"a {at_load} program runs at load, before any caller writes {b.kind} buffer {a.value}")
    return bool(prm.writes)


def _other_arg(m: Manifest, a, prm, ap: str, err: "_Errors", used: set) -> None:
    """Check a state, var, expression or literal argument `a` (at `ap`) against its param."""
    if a.kind == "state":
        if a.value not in m.states:
            err.add(ap, f"unknown state {a.value!r}")
            return
        used.add(("state", a.value))
        if prm.what != "state":
            err.add(ap, f"state {a.value} passed to a {_fmt(prm)} param")
    elif a.kind == "var":
        if a.value not in m.vars:
            err.add(ap, f"unknown var {a.value!r}")
        used.add(("var", a.value))
        if not prm.is_scalar:
            err.add(ap, f"var passed to a {_fmt(prm)} param")
    elif a.kind == "expr":
        problem = expr.check(a.value)
        if problem:
            err.add(ap, problem)
        for n in expr.names(a.value):
            used.add(("var", n))
        if not prm.is_scalar:
            err.add(ap, f"expression passed to a {_fmt(prm)} param")
    elif not prm.is_scalar:
        err.add(ap, f"literal passed to a {_fmt(prm)} param")


def _unused(m: Manifest, err: "_Errors", used: set) -> None:
    for kind, section in (("var", m.vars), ("state", m.states), ("buffer", m.buffers), ("module", m.modules), ("op", m.ops)):
        for name in section:
            if (kind, name) not in used:
                err.add(f"{kind}s.{name}", "declared but never used")
