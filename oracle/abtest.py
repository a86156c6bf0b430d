"""`kern test`: the candidate build against its reference twin, case by case (SPEC §8).

4 fixed prompts x chunks {default, 7} x rows {1, widest} x N steps; a case passes when the ids
and the final state bytes (every token slot the sequence holds, and its line) are identical.

A float target (a manifest with a `logits` buffer) adds in an order its build fixes, so the twins
may part at a near-tie. Its ids are judged with e2e's rule (`verdicts.Same`): each divergence is
excused only when the A side's logits at that very step (a probe) put both tokens within 4 bf16
ULPs of the top, at most 3 per case, A continuing from B's token; and the state bytes are then
compared with A's state over the same ids (B's answer fed to A as a prompt).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from kern.errors import KernError
from manifests import load
from manifests.config import resolve
from manifests.schema import Manifest
from runtime.protocol import Protocol
from runtime.sequence import generate, single
from verdicts import Same, evidence

PROMPTS = (
    "The lighthouse keeper had not seen a ship in eleven days",
    "A hash map trades memory for speed",
    "x",
    "Compilers optimize loops by hoisting invariant computations out of them, which means that the "
    "loop body does less work on every iteration, and the savings add up quickly in hot code.",
)

PASS, FAIL, INCONCLUSIVE = 0, 1, 2


def cases(m: Manifest) -> list[tuple[str, int | None, int]]:
    proto = Protocol(m)
    rows = sorted({1, proto.widest})
    return [(p, chunk, r) for p in PROMPTS for chunk in (None, 7) for r in rows]


@dataclass
class Case:
    """One case's result: `status` pass, fail or skip (it could not run), and what was seen."""

    status: str
    label: str
    detail: str
    near_ties: bool = False  # a float pass whose ids were excused at near-ties

    def line(self) -> str:
        return f"  {MARKS[self.status]:<6}{self.label}: {self.detail}"


MARKS = {"pass": "ok", "fail": "FAIL", "skip": "skip"}
VERDICTS = {PASS: "PASS", FAIL: "FAIL", INCONCLUSIVE: "INCONCLUSIVE"}


@dataclass
class Outcome:
    """Every case and the verdict: `code` is the exit code, `summary` the verdict line's reason."""

    cases: list[Case] = field(default_factory=list)
    code: int = INCONCLUSIVE
    summary: str = ""

    def counts(self) -> dict[str, int]:
        n = {s: sum(c.status == s for c in self.cases) for s in MARKS}
        return {"cases": len(self.cases), "ran": n["pass"] + n["fail"], **n,
                "near_ties": sum(c.near_ties for c in self.cases)}

    def line(self) -> str:
        return f"{VERDICTS[self.code]}: {self.summary}"

    def as_json(self, model: str) -> dict:
        """`kern test --json`: the verdict and its exit code, what each code means, the counts, each case."""
        return {"model": model, "verdict": VERDICTS[self.code], "exit": self.code, "summary": self.summary,
                "exit_codes": {str(c): v for c, v in VERDICTS.items()}, "counts": self.counts(),
                "cases": [{"status": c.status, "case": c.label, "detail": c.detail, "near_ties": c.near_ties}
                          for c in self.cases]}


class PairError(KernError, ValueError):
    """No pair of builds to test: neither a target with a reference nor both manifests given."""


def pair(config: str | None, target: str | None, cand: str | None, ref: str | None,
         weights: tuple[str, ...]) -> tuple[Manifest, Manifest, list[str]]:
    """`kern test`'s builds, loaded: (A the reference, B the candidate, the weights of both), from a
    TARGET (its manifest and reference, either replaced by `cand` or `ref`), else from both manifests
    (their weights: `weights`, else every *.safetensors beside the candidate)."""
    if target:
        t = resolve(target, config, list(weights) or None)
        cand_path, ref_path, ws = Path(cand or t.manifest), ref or t.reference, list(t.weights)
        if ref_path is None:
            raise PairError(f"target {target} has no reference manifest to test against")
    else:
        if not (cand and ref):
            raise PairError("give a TARGET, or both --manifest and --reference")
        cand_path, ref_path = Path(cand), Path(ref)
        ws = list(weights) or sorted(str(p) for p in cand_path.parent.glob("*.safetensors"))
    return load(ref_path), load(cand_path), ws


def ab_test(a: Manifest, b: Manifest, weights: list, steps: int, backend: str, echo: Callable[[str], None] = print) -> int:
    """The exit code of `kern test` (PASS, FAIL or INCONCLUSIVE), each case's line and the verdict echoed."""
    return run_cases(a, b, weights, steps, backend, echo).code


def run_cases(a: Manifest, b: Manifest, weights: list, steps: int, backend: str,
              echo: Callable[[str], None] = print) -> Outcome:
    """Every case of B against A, each echoed as its line as it ends, then the verdict line."""
    out = Outcome()
    for prompt, chunk, rows in cases(b):
        ids = list(prompt.encode())
        label = f"prompt {len(ids)} tokens, chunk {chunk or 'default'}, rows {rows}"
        try:
            got = []
            for m in (a, b):
                rt, cell = single(m, weights, len(ids), steps, rows, backend)
                g = generate(rt, cell, ids, steps, rows, chunk)
                got.append((g.ids, rt.read_state(cell.pages, cell.slot, g.length)))
        except Exception as exc:  # a case that cannot run is inconclusive, not a pass
            case = Case("skip", label, f"{type(exc).__name__}: {exc}")
        else:
            case = _judge(a, b, weights, backend, (ids, chunk, rows, label), got)
        out.cases.append(case)
        echo(case.line())
    c = out.counts()
    if c["ran"] == 0:
        out.code, out.summary = INCONCLUSIVE, "no case could run"
    elif c["fail"]:
        out.code, out.summary = FAIL, f"{c['fail']}/{c['ran']} cases differ between {b.model} (B) and its reference (A)"
    else:
        tail = f", {c['near_ties']} of them after near-ties" if c["near_ties"] else ""
        out.code, out.summary = PASS, f"{c['ran']}/{c['ran']} cases identical (ids and state bytes){tail}"
    echo(out.line())
    return out


def _judge(a: Manifest, b: Manifest, weights: list, backend: str, case: tuple, got: list) -> Case:
    """One case that ran: A's and B's ids and state bytes, compared (a float target's ids under `Same`)."""
    ids, chunk, rows, label = case
    (ida, sa), (idb, sb) = got
    if ida != idb and "logits" in b.buffers:
        same = Same(_Side(a, weights, backend, chunk), rows)
        if not same.add(label, ids, idb, ida):
            return Case("fail", label, str(same))
        if _state_of(a, weights, backend, ids + idb, len(sb)) != sb:
            return Case("fail", label, "ids match after near-ties, state bytes differ from A's over the same ids")
        return Case("pass", label, f"{len(idb)} ids after {same.excused} near-tie tokens ({'; '.join(same.notes)}), "
                                   f"{len(sb)} state bytes identical", near_ties=True)
    if ida != idb:
        k = next((i for i, (x, y) in enumerate(zip(ida, idb)) if x != y), min(len(ida), len(idb)))
        return Case("fail", label, f"ids first differ at token {k}: A {ida[k:k+4]}, B {idb[k:k+4]}")
    if sa != sb:
        k = next(i for i, (x, y) in enumerate(zip(sa, sb)) if x != y) if len(sa) == len(sb) else min(len(sa), len(sb))
        return Case("fail", label, f"ids identical, state bytes differ at byte {k} of {len(sa)}")
    return Case("pass", label, f"{len(ida)} ids and {len(sa)} state bytes identical")


class _Side:
    """The A build as an oracle for `Same`: its greedy continuation, and its logits as evidence."""

    def __init__(self, m: Manifest, weights: list, backend: str, chunk: int | None):
        self.m, self.weights, self.backend, self.chunk = m, weights, backend, chunk

    def run(self, ids: list[int], steps: int, rows: int) -> list[int]:
        rt, cell = single(self.m, self.weights, len(ids), steps, rows, self.backend)
        return generate(rt, cell, ids, steps, rows, self.chunk).ids

    def near_tie(self, context: list[int], a: int, b: int, rows: int) -> str:
        rt, cell = single(self.m, self.weights, len(context), 1, 1, self.backend)
        seen: list = []
        generate(rt, cell, context, 1, 1, self.chunk, on_step=lambda tag, toks: seen.append(rt.logits(1)[0]))
        if not seen:
            return "no evidence (A dumped no logits)"
        bits = np.asarray(seen[0], np.uint32) << np.uint32(16)
        return evidence([float(x) for x in bits.view(np.float32)], a, b)


def _state_of(m: Manifest, weights: list, backend: str, ids: list[int], nbytes: int) -> bytes:
    """A's state bytes after feeding `ids` (B's prompt and answer), cut to B's state's length."""
    rt, cell = single(m, weights, len(ids), 1, 1, backend)
    g = generate(rt, cell, ids, 1, 1)
    return rt.read_state(cell.pages, cell.slot, len(ids))[:nbytes] if g is not None else b""
