"""The toy kernel module: `write`, `predict`, `fold`, `round` for the CPU (numba) and CUDA.

A manifest names this module as `{"impl": "toy.kernels", "block": B, "sha256": H}`; `H` is
`build_hash({"block": B})`, which covers every kernel source file of the module and the build
parameters, so a manifest names exactly the kernels it was made with.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path

SOURCES = ("cpu.py", "cuda.py")
ENTRIES = ("toy_write", "toy_predict", "toy_predict_mem", "toy_fold", "toy_round", "toy_round_mem")
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
        raise KeyError(f"toy.kernels has no entry {name!r} (it has {', '.join(ENTRIES)})")
    mod = importlib.import_module(f"{__name__}.{'cpu' if backend == 'cpu' else 'cuda'}")
    return getattr(mod, name)
