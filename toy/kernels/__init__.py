"""The toy kernel module: `write`, `predict`, `fold`, `round` for the CPU (numba) and CUDA.

A manifest names this module as `{"impl": "toy.kernels", "block": B, "sha256": H}`; `H` is
`build_hash({"block": B})`, which covers every kernel source file of the module and the build
parameters, so a manifest names exactly the kernels it was made with.
"""

from __future__ import annotations

from pathlib import Path

from toy.module import load_entry, source_hash

SOURCES = ("cpu.py", "cuda.py")
ENTRIES = ("toy_write", "toy_predict", "toy_predict_mem", "toy_fold", "toy_round", "toy_round_mem")
_HERE = Path(__file__).parent


def build_hash(params: dict) -> str:
    return source_hash([(name, _HERE / name) for name in SOURCES], params)


def entry(backend: str, name: str):
    """The launchable kernel `name` for `backend` ("cpu" or "gpu"): `fn(grid, block, *args)`."""
    return load_entry(__name__, ENTRIES, backend, name)
