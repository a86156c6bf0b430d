"""`kern gen`: write the toy manifests (five shapes, the float toy, the layered toy (`toy/gen_layers.py`),
the attn toy (`toy/gen_attn.py`), and their `-ref` twins), the salt, the layered toy's checkpoint, the config, and the pipeline config
(toy-layers through 2 and 3 stages).

The generated set ships as `manifests/toy/` + `manifests/toy.toml` + `manifests/toy-pp.toml`; a test
holds `kern gen --out manifests` to reproducing it byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tomli_w

from toy import gen_attn, gen_float, gen_layers, model
from toy.kernels import build_hash

CANDIDATE_BLOCK = 256
REFERENCE_BLOCK = 128
SEQS = 256
LINE_BYTES = 1 << 20


@dataclass(frozen=True)
class Shape:
    name: str
    bytes_per_token: int
    page: int
    width: int
    tokens_max: int
    lined: bool
    rows: int

    @property
    def context(self) -> int:
        return self.page * self.width


SHAPES = (
    Shape("toy-paged", 4096, 16, 512, 2048, False, 1),
    Shape("toy-stateful", 4096, 16, 512, 2048, True, 1),
    Shape("toy-spec", 4096, 16, 512, 2048, False, 4),
    Shape("toy-stateful-spec", 4096, 16, 512, 2048, True, 4),
    Shape("toy-big", 65536, 64, 1024, 8192, False, 1),
)


def _launch(entry: str, block: int, grid: str, params: list[str], literals: list[tuple[str, int]]) -> dict:
    return {
        "module": "toy",
        "entry": entry,
        "block": [block, 1, 1],
        "grid": [grid, 1, 1],
        "params": params + [t for t, _ in literals],
        "args": [{"param": i} for i in range(len(params))] + [{t: v} for t, v in literals],
    }


def _op(params: list[str], launch: dict) -> dict:
    return {"params": params, "impl": {"launches": [launch]}}


def manifest(shape: Shape, block: int) -> dict:
    s = shape
    buffers = _buffers(s)
    ops = _ops(s, block)
    programs = _programs(s)
    states: dict = {"kv": {"bytes_per_token": s.bytes_per_token}}
    if s.lined:
        states["mem"] = {"bytes_per_seq": LINE_BYTES}
    return {
        "schema_version": 5,
        "model": s.name,
        "vars": {"tokens": {"max": s.tokens_max, "axis": "rows"}, "seqs": {"max": SEQS, "axis": "groups"}},
        "states": states,
        "buffers": buffers,
        "modules": {"toy": {"impl": "toy.kernels", "block": block, "sha256": build_hash({"block": block})}},
        "ops": ops,
        "programs": programs,
    }


def _buffers(s: Shape) -> dict:
    buffers: dict = {
        "token_ids": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "token", "domain": {"min": 0, "max": model.EOS}},
        "positions": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "position", "domain": {"min": 0, "max": s.context - 1}},
        "slot_mapping": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "slot", "domain": {"index_into": "kv"}},
        "block_table": {"dtype": "i32", "shape": ["seqs", s.width], "kind": "input", "domain": {"index_into": "kv", "stride": s.page}},
        "seq_lens": {"dtype": "i32", "shape": ["seqs"], "kind": "input", "fill": "seq_len", "domain": {"min": 1, "max": s.context}},
    }
    if s.lined:
        buffers["mem.line"] = {"dtype": "i32", "shape": [1, "seqs"], "kind": "input", "domain": {"index_into": "mem", "stride": LINE_BYTES}}
    buffers["next_token"] = {"dtype": "i64", "shape": ["seqs"], "kind": "output", "fill": "tokens", "domain": {"min": 0, "max": model.EOS}}
    if s.rows > 1:
        buffers["round_tokens"] = {"dtype": "i64", "shape": ["seqs", s.rows], "kind": "output", "fill": "tokens", "domain": {"min": 0, "max": model.EOS}}
        buffers["count"] = {"dtype": "i32", "shape": ["seqs"], "kind": "output", "fill": "count", "domain": {"min": 1, "max": s.rows}}
    buffers["salt"] = {"dtype": "i64", "shape": [model.WORDS], "kind": "weight", "bind": [{"tensor": "salt"}]}
    return buffers


def _ops(s: Shape, block: int) -> dict:
    geometry = [("i64", s.bytes_per_token), ("i32", s.page), ("i32", s.width)]
    line = [("i64", LINE_BYTES)] if s.lined else []
    i64, i32 = "in buffer<i64>", "in buffer<i32>"
    write = [i64, i64, i64, "inout state", i64]
    ops = {"write": _op(write, _launch("toy_write", block, "tokens", write, [("i64", s.bytes_per_token)]))}
    if s.lined:
        fold = [i64, i64, i32, "inout state", i64, "i32"]
        ops["fold"] = _op(fold, _launch("toy_fold", block, "seqs", fold, line))
        predict = [i32, i32, "in state", i32, "in state", i64, "out buffer<i64>"]
        ops["predict"] = _op(predict, _launch("toy_predict_mem", block, "seqs", predict, geometry + line))
    else:
        predict = [i32, i32, "in state", i64, "out buffer<i64>"]
        ops["predict"] = _op(predict, _launch("toy_predict", block, "seqs", predict, geometry))
    if s.rows > 1:
        rnd = [i64, i64, i64, i32, "inout state"] + ([i32, "inout state"] if s.lined else []) + [i64, "out buffer<i64>", "out buffer<i32>"]
        entry = "toy_round_mem" if s.lined else "toy_round"
        ops["round"] = _op(rnd, _launch(entry, block, "seqs", rnd, geometry + [("i32", s.rows)] + line))
    return ops


def _programs(s: Shape) -> dict:
    b = lambda name: {"buf": name}  # noqa: E731
    st = lambda name: {"state": name}  # noqa: E731
    write_call = {"op": "write", "args": [b("token_ids"), b("positions"), b("slot_mapping"), st("kv"), b("salt")]}
    if s.lined:
        predict_call = {"op": "predict", "args": [b("seq_lens"), b("block_table"), st("kv"), b("mem.line"), st("mem"), b("salt"), b("next_token")]}
        fold_args = [b("token_ids"), b("positions"), b("mem.line"), st("mem"), b("salt")]
        prefill = [write_call, {"op": "fold", "args": fold_args + [{"var": "tokens"}]}, predict_call]
        decode = [write_call, {"op": "fold", "args": fold_args + [{"i32": 1}]}, predict_call]
    else:
        predict_call = {"op": "predict", "args": [b("seq_lens"), b("block_table"), st("kv"), b("salt"), b("next_token")]}
        prefill = [write_call]
        decode = [write_call, predict_call]
    # a paged prefill only writes each row's slot from its token and position: several sequences' rows
    # share one call (`independent_rows`); a lined one folds its rows into its sequence's line in order
    chunk = {"groups": 1, "rows": "tokens"} if s.lined else {"groups": SEQS, "rows": "tokens", "independent_rows": True}
    programs = {
        "prefill": {"batch": chunk, "calls": prefill},
        "decode": {"batch": {"groups": SEQS, "rows": 1}, "graph": True, "calls": decode},
    }
    if s.rows > 1:
        args = [b("token_ids"), b("positions"), b("slot_mapping"), b("block_table"), st("kv")]
        args += [b("mem.line"), st("mem")] if s.lined else []
        args += [b("salt"), b("round_tokens"), b("count")]
        programs["round"] = {"batch": {"groups": SEQS, "rows": s.rows}, "graph": True, "calls": [{"op": "round", "args": args}]}
    return programs


def salt() -> np.ndarray:
    return np.array(model.SALT, dtype=np.int64)


def pin(path: Path) -> dict:
    """A weights file's entry in a manifest's `weights`: its sha256, checked when it loads."""
    return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


# `kernels` is for the Rust kern gate driver: it requires the key and skips a target whose kernels
# path is missing. Our kernels are Python modules each manifest pins by sha256 (`modules`), so a
# target the Rust toy model can compute names the manifests' own directory; one it cannot (the float
# and layered toys are ours) names a path that is absent on purpose, so that driver leaves it out.
KERNELS = "toy"
RUST_SKIPS = {gen_float.NAME: "the Rust toy model has no float (bf16 logits) toy",
              gen_layers.NAME: "the Rust toy model has no layered toy",
              gen_attn.NAME: "the Rust toy model has no attn (context-dependent K and V) toy"}
HEADER = """# The toy targets (written by `kern gen`). Paths are relative to this file.
#
# `kernels` is read only by the Rust kern gate driver, which requires it and skips (not fails) a
# target whose kernels path is missing. Ours are Python modules pinned by sha256 in each manifest, so
# the integer toys name the manifests' directory; toy-float, toy-layers and toy-attn (ours alone: the
# Rust toy model cannot compute them) name a path that is absent on purpose, so that driver leaves
# them out.
# Our own config reader accepts the key and serves every target.
"""


def config_text(targets: dict[str, dict]) -> str:
    """toy.toml: a [targets.NAME] table per target, a comment on each the Rust driver skips."""
    parts = [HEADER]
    for name, table in targets.items():
        why = RUST_SKIPS.get(name)
        table = {**table, "kernels": f"absent-on-purpose/{name}" if why else KERNELS}
        note = f"# kernels: absent on purpose, {why}; the Rust kern gate driver skips this target\n" if why else ""
        parts.append(f"\n[targets.{name}]\n{note}" + tomli_w.dumps(table))
    return "".join(parts)


# The layered toy through pipeline stages (`kern serve --stages N`): e2e gates these as targets of
# their own. They live in a second file, toy-pp.toml, because the Rust kern gate driver denies unknown
# fields in a config (reference/kern-e2e.md §3): a `stages` key in toy.toml would make it refuse the
# whole file, not skip one target. That driver reads only the config it is given (kern.toml by
# default); `e2e`, with no --config and no kern.toml found, reads toy.toml and then toy-pp.toml.
PP_STAGES = (2, 3)
PP_HEADER = """# toy-layers served as a pipeline (written by `kern gen`). Paths are relative to this file.
#
# Each target is toy-layers of toy.toml (the same manifest, reference and weights) with `stages = N`:
# `kern serve` cuts it into N stages and serves it as a head and N-1 stage processes, and `e2e`
# (which reads this file after toy.toml when given no --config and no kern.toml is found) gates it
# like toy-layers, token-exact against toy/model.py, and checks its hits equal toy-layers'.
#
# A file of its own: the Rust kern gate driver denies unknown fields (it has no `stages`), so the key
# in toy.toml would make that driver refuse the whole file. It never reads this one.
"""


def pp_config_text(layered: dict) -> str:
    """toy-pp.toml: toy-layers' table once per pipeline depth in `PP_STAGES`, with its `stages`."""
    parts = [PP_HEADER]
    for n in PP_STAGES:
        parts.append(f"\n[targets.{gen_layers.NAME}-pp{n}]\n" + tomli_w.dumps({**layered, "stages": n}))
    return "".join(parts)


def generate(out: str | Path) -> list[Path]:
    """Write the toy set under `out`; return the paths written."""
    from safetensors.numpy import save_file

    out = Path(out)
    (out / "toy").mkdir(parents=True, exist_ok=True)
    written = []
    targets = {}
    salt_path = out / "toy" / "salt.safetensors"
    save_file({"salt": salt()}, str(salt_path))  # first: the manifests pin its sha256
    salt_pin = {salt_path.name: pin(salt_path)}
    for shape in SHAPES:
        for name, block in ((shape.name, CANDIDATE_BLOCK), (f"{shape.name}-ref", REFERENCE_BLOCK)):
            path = out / "toy" / f"{name}.json"
            path.write_text(json.dumps({**manifest(shape, block), "weights": salt_pin}, indent=1) + "\n")
            written.append(path)
        targets[shape.name] = {
            "manifest": f"toy/{shape.name}.json",
            "reference": f"toy/{shape.name}-ref.json",
            "weights": ["toy/salt.safetensors"],
        }
    # the float toy: toy-paged's shape, bf16 logits (toy/gen_float.py)
    for name, block in ((gen_float.NAME, CANDIDATE_BLOCK), (f"{gen_float.NAME}-ref", REFERENCE_BLOCK)):
        path = out / "toy" / f"{name}.json"
        m = gen_float.manifest(manifest(SHAPES[0], block), block)
        path.write_text(json.dumps({**m, "weights": salt_pin}, indent=1) + "\n")
        written.append(path)
    targets[gen_float.NAME] = {"manifest": f"toy/{gen_float.NAME}.json", "reference": f"toy/{gen_float.NAME}-ref.json",
                               "weights": ["toy/salt.safetensors"]}
    layered, targets[gen_layers.NAME] = gen_layers.write(out, (CANDIDATE_BLOCK, REFERENCE_BLOCK), salt_pin)
    written += layered
    attn, targets[gen_attn.NAME] = gen_attn.write(out, (CANDIDATE_BLOCK, REFERENCE_BLOCK), salt_pin)
    written += attn
    written.append(salt_path)
    config = out / "toy.toml"
    config.write_text(config_text(targets))
    written.append(config)
    pp = out / "toy-pp.toml"
    pp.write_text(pp_config_text(targets[gen_layers.NAME]))
    written.append(pp)
    return written
