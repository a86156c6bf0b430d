"""`kern test`: the candidate build against its reference twin, case by case (SPEC §8).

4 fixed prompts x chunks {default, 7} x rows {1, widest} x N steps; a case passes when the ids
and the final state bytes (every token slot the sequence holds, and its line) are identical.
"""

from __future__ import annotations

from typing import Callable

from manifests.schema import Manifest
from runtime.protocol import Protocol
from runtime.sequence import generate, single

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


def ab_test(a: Manifest, b: Manifest, weights: list, steps: int, backend: str, echo: Callable[[str], None] = print) -> int:
    ran = failed = 0
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
            echo(f"  skip  {label}: {type(exc).__name__}: {exc}")
            continue
        ran += 1
        (ida, sa), (idb, sb) = got
        if ida != idb:
            failed += 1
            k = next((i for i, (x, y) in enumerate(zip(ida, idb)) if x != y), min(len(ida), len(idb)))
            echo(f"  FAIL  {label}: ids diverge at token {k}: {ida[k:k+4]} (A) vs {idb[k:k+4]} (B)")
        elif sa != sb:
            failed += 1
            k = next(i for i, (x, y) in enumerate(zip(sa, sb)) if x != y) if len(sa) == len(sb) else min(len(sa), len(sb))
            echo(f"  FAIL  {label}: ids identical, state bytes differ at byte {k} of {len(sa)}")
        else:
            echo(f"  ok    {label}: {len(ida)} ids and {len(sa)} state bytes identical")
    if ran == 0:
        echo("INCONCLUSIVE: no case could run")
        return INCONCLUSIVE
    if failed:
        echo(f"FAIL: {failed}/{ran} cases differ between {b.model} (B) and its reference (A)")
        return FAIL
    echo(f"PASS: {ran}/{ran} cases identical (ids and state bytes)")
    return PASS
