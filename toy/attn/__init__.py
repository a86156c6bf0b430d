"""The attn toy's kernel module: one entry, `toy_attn`, for the CPU (numba) and CUDA (numba.cuda).
The arithmetic is `toy/model.py`'s attn toy (docs/toy.md, "Context-dependent entries").

A manifest names this module as `{"impl": "toy.attn", "block": B, "sha256": H}`; `H` is
`build_hash({"block": B})` over this module's own kernel sources, so the other toy manifests'
module hashes do not move when these kernels change.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path

SOURCES = ("cpu.py", "cuda.py")
ENTRIES = ("toy_attn",)
_HERE = Path(__file__).parent


def build_hash(params: dict) -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        path = _HERE / name
        if path.exists():
            h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(json.dumps(params, sort_keys=True).encode())
    return h.hexdigest()


def entry(backend: str, name: str):
    """The launchable kernel `name` for `backend` ("cpu" or "gpu"): `fn(grid, block, *args)`."""
    if name not in ENTRIES:
        raise KeyError(f"toy.attn has no entry {name!r} (it has {', '.join(ENTRIES)})")
    mod = importlib.import_module(f"{__name__}.{'cpu' if backend == 'cpu' else 'cuda'}")
    return getattr(mod, name)
