"""stages_equal_single: a target served through pipeline stages answers and hits as its single process.

A staged target (`stages = N > 1` in its config) is gated like any other, every check against the
reference and the policy oracle. This check, recorded once every target of the run was gated, holds
it to its single-process twin (the target of the run with the same manifest and `stages = 1`): every
answer of the serial steps (`e2e.scenarios.COMPARED`: ids, cached tokens, tier, snapshot, request by
request) and the hit counters of every all-serial session must be the same. Reported, not gated, when
the twin was not gated in this run (or was skipped, or ended with an error: nothing to compare).
"""

from __future__ import annotations

from typing import Any, Callable

from e2e.checks import mark
from e2e.config import GateTarget
from e2e.scenarios import CROSS_CHECKS, STEPS

__all__ = ["CHECK", "compare", "record", "twin"]

(CHECK,) = CROSS_CHECKS
FIELDS = ("request", "tokens", "ids", "cached", "tier", "snapshot")


def twin(t: GateTarget, chosen: list[GateTarget]) -> GateTarget | None:
    """The single-process target of the run with `t`'s manifest (None when `t` is not staged)."""
    if t.stages <= 1:
        return None
    same = [c for c in chosen if c.stages == 1 and c.manifest.resolve() == t.manifest.resolve()]
    return same[0] if same else None


def single_only(staged: GateTarget, single: GateTarget) -> set[str]:
    """The sessions whose steps apply to the single process but not to its staged twin (params, explore)."""
    return ({s.session for s in STEPS if s.session and s.applies(single)}
            - {s.session for s in STEPS if s.session and s.applies(staged)})


def _cached(hits: dict, step: str) -> list[int]:
    return [e["cached"] for e in hits.get("served", []) if e["step"] == step]


def compare(mine: dict[str, Any], single: dict[str, Any], skip: set[str] | frozenset = frozenset()) -> tuple[bool, str]:
    """(ok, note): the staged report's hits against the single process's, exactly; `skip` names the
    sessions only the single process runs (their steps do not apply to a staged target)."""
    a, b = mine.get("hits") or {}, single.get("hits") or {}
    name = single["target"]
    sa, sb = a.get("served", []), b.get("served", [])
    sb = [e for e in sb if e["session"] not in skip]
    diffs = []
    if len(sa) != len(sb):
        diffs.append(f"{len(sa)} serial answers, {name} {len(sb)}")
    for x, y in zip(sa, sb):
        if (x["session"], x["step"]) != (y["session"], y["step"]):
            diffs.append(f"answer {x['request']} in {x['session']}/{x['step']}, {name}'s in {y['session']}/{y['step']}")
            break
        got = {k: x[k] for k in FIELDS if x[k] != y[k]}
        if got:
            diffs.append(f"{x['session']} {x['step']} {x['request']}: "
                         + ", ".join(f"{k} {v} ({name} {y[k]})" for k, v in got.items()))
    ca, cb = a.get("counters", {}), {k: v for k, v in b.get("counters", {}).items() if k not in skip}
    for s in sorted(set(ca) | set(cb)):
        keys = sorted(set(ca.get(s, {})) | set(cb.get(s, {})))
        d = [f"{k} {ca.get(s, {}).get(k)} ({name} {cb.get(s, {}).get(k)})" for k in keys
             if ca.get(s, {}).get(k) != cb.get(s, {}).get(k)]
        if d:
            diffs.append(f"{s} counters: " + ", ".join(d))
    steps = dict.fromkeys(e["step"] for e in sa)
    head = (f"{len(sa)} serial answers ({', '.join(steps)}) and the hit counters of {', '.join(sorted(ca)) or 'no'} "
            f"session(s) vs {name}; repeat cached {_cached(a, 'repeat')}, turn 2 cached {_cached(a, 'turn2')}")
    if diffs:
        return False, f"{head}: {len(diffs)} difference(s): " + "; ".join(diffs[:6])
    return True, f"{head}: all equal"


def record(chosen: list[GateTarget], reports: list[dict[str, Any]], wanted: set[str] | None,
           echo: Callable[[str], None]) -> None:
    """Add the check to every staged target's report (in place)."""
    if wanted is not None and CHECK not in wanted:
        return
    by_name = {r["target"]: r for r in reports}
    for t in chosen:
        mine = by_name.get(t.name)
        if t.stages <= 1 or mine is None or mine.get("skipped"):
            continue
        other = twin(t, chosen)
        single = by_name.get(other.name) if other is not None else None
        failed = [r["target"] for r in (mine, single) if r is not None
                  and any(c["name"] == "error" for c in r["checks"])]
        if single is None:
            ok, note = None, "no single-process target with this manifest was gated in this run: nothing to compare"
        elif single.get("skipped"):
            ok, note = None, f"{single['target']} was skipped ({single['skipped']}): nothing to compare"
        elif failed:
            ok, note = None, f"not compared: {', '.join(failed)} ended with an error"
        else:
            ok, note = compare(mine, single, single_only(t, other))
        mine["checks"].append({"name": CHECK, "ok": ok, "note": note})
        echo(f"== {t.name}\n  {mark(ok)} {CHECK}: {note}")
