"""Random cuttable manifests and a symbolic interpreter for them (reference kern-manifest-toy §4.3).

A manifest here is a program `p` of calls on opaque ops: `x` arrives, a few random calls pass
values through workspaces and a paged state `s` (three calls to a layer, each layer its own state
region), and the last call writes `y`. A once program `init` fills carries `c` and `d`.

The interpreter gives every value a hash of everything that produced it: a call reads its op, its
label, its in/inout buffers and its state regions, and writes hash(read, j) to its j-th out or
inout argument. So a stage that reads a wrong, stale or missing value computes a different `y`.
"""

from __future__ import annotations

from manifests.schema import Manifest
from toy.kernels import build_hash

M64 = (1 << 64) - 1
OPS = {
    "f1": ["in buffer<i64>", "out buffer<i64>"],
    "f2": ["in buffer<i64>", "in buffer<i64>", "out buffer<i64>"],
    "g": ["inout buffer<i64>"],
    "sw": ["in buffer<i64>", "inout state"],
    "sr": ["in state", "in buffer<i64>", "out buffer<i64>"],
    "z": ["out buffer<i64>"],
}


class Rng:
    """xorshift64 (<<13, >>7, <<17); next(n) = (x >> 33) % n."""

    def __init__(self, seed: int):
        self.x = (seed * 0x9E3779B97F4A7C15) & M64 or 1

    def next(self, n: int) -> int:
        x = self.x
        x ^= (x << 13) & M64
        x ^= x >> 7
        x ^= (x << 17) & M64
        self.x = x
        return (x >> 33) % n


def fnv(words: list[int]) -> int:
    """FNV-1a 64 over the little-endian u64 words."""
    h = 0xCBF29CE484222325
    for w in words:
        for b in (w & M64).to_bytes(8, "little"):
            h = ((h ^ b) * 0x100000001B3) & M64
    return h


def hs(s: str) -> int:
    return fnv([ord(ch) for ch in s])


def random_manifest(seed: int) -> dict:
    """A verified-to-be manifest: f1(x->w), 3..11 random calls (call i on state offset 4*(i//3)), f1(->y)."""
    rng = Rng(seed)
    ws = [f"w{i}" for i in range(4)]
    readable = ["x", "c", "d"]
    first = ws[rng.next(4)]
    calls = [("f1", [("buf", "x", 0), ("buf", first, 0)])]
    written = {first}
    for i in range(3 + rng.next(9)):
        src = lambda: (readable + sorted(written))[rng.next(len(readable) + len(written))]  # noqa: E731
        out = ws[rng.next(4)]
        off = 8 if out in written and rng.next(5) == 0 else 0  # now and then a partial write: no kill
        region = ("state", "s", 4 * (i // 3))
        op = ["f1", "f2", "g", "sw", "sr"][rng.next(5)]
        if op == "f1":
            args = [("buf", src(), 0), ("buf", out, off)]
        elif op == "f2":
            args = [("buf", src(), 0), ("buf", src(), 0), ("buf", out, off)]
        elif op == "g":
            out = sorted(written)[rng.next(len(written))]
            args = [("buf", out, 0)]
        elif op == "sw":
            args = [("buf", src(), 0), region]
            out = None
        else:
            args = [region, ("buf", src(), 0), ("buf", out, off)]
        calls.append((op, args))
        if out:
            written.add(out)
    calls.append(("f1", [("buf", (sorted(written))[rng.next(len(written))], 0), ("buf", "y", 0)]))
    return build(calls)


def build(calls: list[tuple[str, list]], init=(("z", "c"), ("z", "d"))) -> dict:
    """The manifest for program p = `calls` ((op, [(buf|state, name, offset)])) and a once `init`."""
    vec = {"dtype": "i64", "shape": ["tokens", 8]}
    kinds = {"x": "input", "y": "output", "c": "carry", "d": "carry", **{f"w{i}": "workspace" for i in range(4)}}
    used = {n for _, args in calls for k, n, _ in args if k == "buf"} | {b for _, b in init}
    buffers = {n: {**vec, "kind": k} if k not in ("carry",) else {"dtype": "i64", "shape": [8], "kind": k}
               for n, k in kinds.items() if n in used}
    ops_used = {op for op, _ in calls} | {op for op, _ in init}
    p_calls = [{"op": op, "label": f"p{i}", "args": [{k: n, **({"offset": o} if o else {})} for k, n, o in args]}
               for i, (op, args) in enumerate(calls)]
    return {
        "schema_version": 5,
        "model": "cuttable",
        "vars": {"tokens": {"max": 4, "axis": "rows"}, "seqs": {"max": 4, "axis": "groups"}},
        "states": {"s": {"bytes_per_token": 16}} if any(k == "state" for _, a in calls for k, _, _ in a) else {},
        "buffers": buffers,
        "modules": {"sym": {"impl": "toy.kernels", "block": 256, "sha256": build_hash({"block": 256})}},
        "ops": {op: {"params": OPS[op], "impl": {"launches": [
            {"module": "sym", "entry": op, "block": [256, 1, 1], "grid": ["seqs", 1, 1]}]}}
            for op in OPS if op in ops_used},
        "programs": {
            "init": {"once": True, "calls": [{"op": op, "label": f"i{j}", "args": [{"buf": b}]} for j, (op, b) in enumerate(init)]},
            "p": {"batch": {"groups": 1, "rows": 1}, "calls": p_calls},
        },
    }


class Machine:
    """One manifest's symbolic memory: buffers as {offset: value}, state regions as values."""

    def __init__(self, m: Manifest):
        self.m = m
        self.bufs: dict[str, dict[int, int]] = {}
        self.regions: dict[tuple[str, int], int] = {}
        self.wrote_regions: set[tuple[str, int]] = set()

    def start(self) -> None:
        if "x" in self.m.buffers:
            self.bufs["x"] = {0: hs("x")}
        for p in self.m.programs.values():
            if p.derive:
                self.run(p.name)
        for p in self.m.programs.values():
            if p.once:
                self.run(p.name)

    def run(self, program: str) -> None:
        for call in self.m.programs[program].calls:
            params = self.m.ops[call.op].params
            read = [hs(call.op), hs(call.label or "")]
            for a, prm in zip(call.args, params):
                if a.kind == "buf" and prm.reads:
                    if a.value not in self.bufs:
                        raise AssertionError(f"{program}: {call.label} reads {a.value}, which holds nothing")
                    read += [w for off, v in sorted(self.bufs[a.value].items()) for w in (off, v)]
                elif a.kind == "state":
                    read.append(self.regions.get((a.value, a.offset), 0))
            h = fnv(read)
            for j, (a, prm) in enumerate(zip(call.args, params)):
                if not prm.writes:
                    continue
                v = fnv([h, j])
                if a.kind == "buf":
                    if prm.direction == "out" and a.offset == 0:
                        self.bufs[a.value] = {}
                    self.bufs.setdefault(a.value, {})[a.offset] = v
                else:
                    self.regions[(a.value, a.offset)] = v
                    self.wrote_regions.add((a.value, a.offset))
