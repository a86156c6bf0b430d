"""The layered toy's manifests (`toy-layers` and its `-ref` twin) and its checkpoint, for `kern gen`.

    derive   (at load)    mix = derive(source)              the source lives only during load
    table    (once)       table = table(mix, salt)          a carry every layer reads
    prefill  (packed)     embed, layer x LAYERS, head       rows of up to PACK sequences, split by cu_seqlens
    decode   (groups 256) embed, layer x LAYERS, head       the same calls, so a cut index lands on
                                                            the same layer boundary in both

Each layer `l` owns the paged state `kv.l` and reads `mix` and `table` at its own offset; the
activation `act` (ACT i64 words a row) is the workspace that crosses from layer to layer, and so
from stage to stage when the manifest is cut.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from toy import model
from toy.layers import build_hash

NAME = "toy-layers"
LAYERS = 4
BYTES_PER_TOKEN = 1024  # per layer: 16 heads + 112 tails; 4 KiB a token over the four layers
PAGE = 16
WIDTH = 2048  # reach 32768 tokens
CONTEXT = 16384  # a packed prefill call's bound on the sum of its sequences' pos + rows
TOKENS = 2048
SEQS = 256
PACK = 32  # sequences one prefill call may pack
WEIGHTS = "layers.safetensors"


def _launch(entry: str, block: int, grid, params: list[str], literals: list[tuple[str, int]] = ()) -> dict:
    return {
        "module": "layers",
        "entry": entry,
        "block": [block, 1, 1],
        "grid": [grid, 1, 1],
        "params": params + [t for t, _ in literals],
        "args": [{"param": i} for i in range(len(params))] + [{t: v} for t, v in literals],
    }


def _op(params: list[str], launch: dict) -> dict:
    return {"params": params, "impl": {"launches": [launch]}}


def manifest(block: int) -> dict:
    reach = PAGE * WIDTH
    kv0 = "kv.0"
    buffers = {
        "token_ids": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "token", "domain": {"min": 0, "max": model.EOS}},
        "positions": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "position", "domain": {"min": 0, "max": reach - 1}},
        "slot_mapping": {"dtype": "i64", "shape": ["tokens"], "kind": "input", "fill": "slot", "domain": {"index_into": kv0}},
        "cu_seqlens": {"dtype": "i64", "shape": [SEQS + 1], "kind": "input", "fill": "cu_seqlens", "domain": {"min": 0, "max": TOKENS}},
        "block_table": {"dtype": "i32", "shape": ["seqs", WIDTH], "kind": "input", "domain": {"index_into": kv0, "stride": PAGE}},
        "act": {"dtype": "i64", "shape": ["tokens", model.ACT], "kind": "workspace"},
        "next_token": {"dtype": "i64", "shape": ["seqs"], "kind": "output", "fill": "tokens", "domain": {"min": 0, "max": model.EOS}},
        "salt": {"dtype": "i64", "shape": [model.WORDS], "kind": "weight", "bind": [{"tensor": "salt"}]},
        "source": {"dtype": "i64", "shape": [LAYERS * model.ACT], "kind": "source", "bind": [{"tensor": "layers.source"}]},
        "mix": {"dtype": "i64", "shape": [LAYERS * model.ACT], "kind": "weight"},
        "table": {"dtype": "i64", "shape": [LAYERS * model.LAYER_HEAD], "kind": "carry"},
    }
    i64, i32 = "in buffer<i64>", "in buffer<i32>"
    embed = [i64, i64, i64, i64, "out buffer<i64>"]
    layer = [i64, i64, i64, i32, "inout state", i64, i64, "inout buffer<i64>"]
    head = [i64, i64, "out buffer<i64>"]
    derive = [i64, "out buffer<i64>"]
    table = [i64, i64, "out buffer<i64>"]
    geometry = [("i64", BYTES_PER_TOKEN), ("i32", PAGE), ("i32", WIDTH)]
    ops = {
        "embed": _op(embed, _launch("toy_embed", block, "seqs", embed)),
        "layer": _op(layer, _launch("toy_layer", block, "seqs", layer, geometry)),
        "head": _op(head, _launch("toy_head", block, "seqs", head)),
        "derive": _op(derive, _launch("toy_derive", block, LAYERS * model.ACT, derive)),
        "table": _op(table, _launch("toy_table", block, LAYERS * model.LAYER_HEAD, table)),
    }
    b = lambda name, offset=0: {"buf": name, "offset": offset} if offset else {"buf": name}  # noqa: E731
    calls = [{"op": "embed", "label": "embed", "args": [b("cu_seqlens"), b("token_ids"), b("positions"), b("salt"), b("act")]}]
    for l in range(LAYERS):
        calls.append({"op": "layer", "label": f"layer.{l}", "args": [
            b("positions"), b("slot_mapping"), b("cu_seqlens"), b("block_table"), {"state": f"kv.{l}"},
            b("mix", 8 * model.ACT * l), b("table", 8 * model.LAYER_HEAD * l), b("act")]})
    calls.append({"op": "head", "label": "head", "args": [b("cu_seqlens"), b("act"), b("next_token")]})
    programs = {
        "derive": {"derive": True, "calls": [{"op": "derive", "args": [b("source"), b("mix")]}]},
        "table": {"once": True, "calls": [{"op": "table", "args": [b("mix"), b("salt"), b("table")]}]},
        "prefill": {"batch": {"groups": PACK, "rows": "tokens", "context": "context"}, "calls": calls},
        "decode": {"batch": {"groups": SEQS, "rows": 1}, "graph": True, "calls": calls},
    }
    return {
        "schema_version": 5,
        "model": NAME,
        "vars": {"tokens": {"max": TOKENS, "axis": "rows"}, "seqs": {"max": SEQS, "axis": "groups"}, "context": {"max": CONTEXT}},
        "states": {f"kv.{l}": {"bytes_per_token": BYTES_PER_TOKEN} for l in range(LAYERS)},
        "buffers": buffers,
        "modules": {"layers": {"impl": "toy.layers", "block": block, "sha256": build_hash({"block": block})}},
        "ops": ops,
        "programs": programs,
    }


def checkpoint() -> dict[str, np.ndarray]:
    """The layered toy's own tensors (the salt comes from the shared salt file)."""
    return {"layers.source": np.array(model.source(LAYERS), dtype=np.int64)}


def write(out: Path, blocks: tuple[int, int], pins: dict | None = None) -> tuple[list[Path], dict]:
    """Write the checkpoint and the two manifests under `out/toy` (pinning the checkpoint's sha256 and
    `pins`, the salt's); return the paths and the config table."""
    import hashlib

    from safetensors.numpy import save_file

    written = []
    weights = out / "toy" / WEIGHTS
    save_file(checkpoint(), str(weights))
    pins = {**(pins or {}), WEIGHTS: {"sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}}
    for name, block in ((NAME, blocks[0]), (f"{NAME}-ref", blocks[1])):
        path = out / "toy" / f"{name}.json"
        path.write_text(json.dumps({**manifest(block), "weights": pins}, indent=1) + "\n")
        written.append(path)
    written.append(weights)
    target = {"manifest": f"toy/{NAME}.json", "reference": f"toy/{NAME}-ref.json", "weights": ["toy/salt.safetensors", f"toy/{WEIGHTS}"]}
    return written, target
