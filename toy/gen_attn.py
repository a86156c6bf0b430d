"""The attn toy's manifests (`toy-attn` and its `-ref` twin), for `kern gen`.

    prefill  (packed)     attn     rows of up to PACK sequences, split by cu_seqlens; emits
    decode   (groups 256) attn     one row a sequence

One paged state `attn` (K and V words and their tails, 1024 bytes a token) and one op, `attn`,
that reads a sequence's cached entries, writes its rows' entries in order and emits the token
after its last row (docs/toy.md, "Context-dependent entries").
"""

from __future__ import annotations

import json
from pathlib import Path

from toy import model
from toy.attn import build_hash

NAME = "toy-attn"
BYTES_PER_TOKEN = 1024  # 8 K words + 8 V words + 112 tails
PAGE = 16
WIDTH = 2048  # reach 32768 tokens
CONTEXT = 16384  # a packed prefill call's bound on the sum of its sequences' pos + rows
TOKENS = 2048
SEQS = 256
PACK = 32  # sequences one prefill call may pack
STATE = model.ATTN_STATE


def manifest(block: int) -> dict:
    reach = PAGE * WIDTH
    buffers = {
        "token_ids": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "token", "domain": {"min": 0, "max": model.EOS}},
        "positions": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "position", "domain": {"min": 0, "max": reach - 1}},
        "slot_mapping": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "slot", "domain": {"index_into": STATE}},
        "cu_seqlens": {"dtype": "i64", "shape": [SEQS + 1], "kind": "input", "fill": "cu_seqlens", "domain": {"min": 0, "max": TOKENS}},
        "block_table": {"dtype": "i32", "shape": ["seqs", WIDTH], "kind": "input", "domain": {"index_into": STATE, "stride": PAGE}},
        "next_token": {"dtype": "i64", "shape": ["seqs"], "kind": "output", "fill": "tokens", "domain": {"min": 0, "max": model.EOS}},
        "salt": {"dtype": "i64", "shape": [model.WORDS], "kind": "weight", "bind": [{"tensor": "salt"}]},
    }
    i64, i32 = "in buffer<i64>", "in buffer<i32>"
    params = [i64, i64, i64, i64, i32, "inout state", i64, "out buffer<i64>"]
    literals = [("i64", BYTES_PER_TOKEN), ("i32", PAGE), ("i32", WIDTH)]
    launch = {
        "module": "attn",
        "entry": "toy_attn",
        "block": [block, 1, 1],
        "grid": ["seqs", 1, 1],
        "params": params + [t for t, _ in literals],
        "args": [{"param": i} for i in range(len(params))] + [{t: v} for t, v in literals],
    }
    b = lambda name: {"buf": name}  # noqa: E731
    call = {"op": "attn", "args": [b("token_ids"), b("positions"), b("slot_mapping"), b("cu_seqlens"), b("block_table"),
                                   {"state": STATE}, b("salt"), b("next_token")]}
    programs = {
        "prefill": {"batch": {"groups": PACK, "rows": "tokens", "context": "context"}, "calls": [call]},
        "decode": {"batch": {"groups": SEQS, "rows": 1}, "graph": True, "calls": [call]},
    }
    return {
        "schema_version": 5,
        "model": NAME,
        "vars": {"tokens": {"max": TOKENS, "axis": "rows"}, "seqs": {"max": SEQS, "axis": "groups"}, "context": {"max": CONTEXT}},
        "states": {STATE: {"bytes_per_token": BYTES_PER_TOKEN}},
        "buffers": buffers,
        "modules": {"attn": {"impl": "toy.attn", "block": block, "sha256": build_hash({"block": block})}},
        "ops": {"attn": {"params": params, "impl": {"launches": [launch]}}},
        "programs": programs,
    }


def write(out: Path, blocks: tuple[int, int], pins: dict) -> tuple[list[Path], dict]:
    """Write the two manifests under `out/toy` (pinning `pins`, the salt's); return the paths and
    the config table."""
    written = []
    for name, block in ((NAME, blocks[0]), (f"{NAME}-ref", blocks[1])):
        path = out / "toy" / f"{name}.json"
        path.write_text(json.dumps({**manifest(block), "weights": pins}, indent=1) + "\n")
        written.append(path)
    return written, {"manifest": f"toy/{NAME}.json", "reference": f"toy/{NAME}-ref.json", "weights": ["toy/salt.safetensors"]}
