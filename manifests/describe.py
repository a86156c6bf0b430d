"""What a verified manifest derives, as plain values (`kern verify`): its states, the page and the
reach the pool and admission use, and every program with the shape of each call, so a manifest's
author sees what the runtime will make of it without a device."""

from __future__ import annotations

from manifests.derive import page_unit, reach
from manifests.schema import Arg, Manifest, Program

__all__ = ["describe", "lines"]


def describe(m: Manifest) -> dict:
    """The derived geometry of `m` (already loaded, so verified): JSON-ready."""
    states = [{"name": s.name, "kind": "paged" if s.paged else "lined" if s.lined else "fixed",
               "bytes": s.bytes_per_token or s.bytes_per_seq or s.bytes}
              for s in sorted(m.states.values(), key=lambda s: s.name)]
    return {"model": m.model, "schema_version": m.schema_version, "states": states, "page_tokens": page_unit(m),
            "reach_tokens": reach(m), "vars": {v.name: v.max for v in m.vars.values()},
            "programs": [_program(m, p) for p in m.programs.values()]}


def _program(m: Manifest, p: Program) -> dict:
    flags = [f for f, on in (("graph", p.graph), ("once", p.once), ("derive", p.derive),
                             ("independent_rows", p.independent_rows)) if on]
    return {"name": p.name, "rows": p.rows, "groups": p.groups, "context": p.context, "flags": flags,
            "calls": [{"op": c.op, "label": c.label, "args": [_arg(m, a) for a in c.args]} for c in p.calls]}


def _arg(m: Manifest, a: Arg) -> str:
    """One argument as `name: dtype[shape]`, `name: state`, `var=max` or a literal."""
    if a.kind == "buf":
        b = m.buffers[a.value]
        at = f"+{a.offset}" if a.offset else ""
        return f"{b.name}{at}: {b.dtype}[{','.join(str(d) for d in b.shape)}]"
    if a.kind == "state":
        return f"{a.value}: state"
    if a.kind == "var":
        return f"{a.value}<={m.vars[a.value].max}"
    return str(a.value)


def lines(d: dict) -> list[str]:
    """`describe`'s dict as the text `kern verify` prints."""
    out = [f"{d['model']}: verified (schema {d['schema_version']})"]
    for s in d["states"]:
        unit = {"paged": "bytes/token", "lined": "bytes/sequence", "fixed": "bytes"}[s["kind"]]
        out.append(f"  state {s['name']}: {s['kind']}, {s['bytes']} {unit}")
    out.append(f"  page {d['page_tokens']} tokens, reach {d['reach_tokens']} tokens a sequence")
    for p in d["programs"]:
        shape = "" if p["groups"] is None else f", groups {p['groups']}, rows {p['rows']}"
        ctx = f", context bound {p['context']}" if p["context"] else ""
        flags = f" [{' '.join(p['flags'])}]" if p["flags"] else ""
        out.append(f"  program {p['name']}{shape}{ctx}{flags}: {len(p['calls'])} calls")
        for c in p["calls"]:
            label = f" ({c['label']})" if c["label"] else ""
            out.append(f"    {c['op']}{label}({', '.join(c['args'])})")
    return out
