"""The layered toy's kernel module: `embed`, `layer`, `head`, and the load-time `derive` and `table`,
for the CPU (numba) and CUDA (numba.cuda). The arithmetic is `toy/model.py`'s layered toy.

A manifest names this module as `{"impl": "toy.layers", "block": B, "sha256": H}`; `H` is
`build_hash({"block": B})` over this module's own kernel sources, so the other toy manifests'
module hashes do not move when these kernels change.
"""

from __future__ import annotations

from pathlib import Path

from toy.module import load_entry, source_hash

SOURCES = ("cpu.py", "cuda.py")
ENTRIES = ("toy_embed", "toy_layer", "toy_head", "toy_derive", "toy_table")
_HERE = Path(__file__).parent


def build_hash(params: dict) -> str:
    return source_hash([(name, _HERE / name) for name in SOURCES], params)


def entry(backend: str, name: str):
    """The launchable kernel `name` for `backend` ("cpu" or "gpu"): `fn(grid, block, *args)`."""
    return load_entry(__name__, ENTRIES, backend, name)
