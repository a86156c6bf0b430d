"""What every toy kernel module's `__init__` shares (toy.kernels, toy.layers, toy.float_kernels, toy.attn):
the build hash a manifest pins (`modules.*.sha256`) and the lookup of a launchable entry."""

from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path

__all__ = ["load_entry", "source_hash"]


def source_hash(sources: list[tuple[str, Path]], params: dict) -> str:
    """sha256 over each (name, path) present, in order (`name NUL bytes NUL`), then the build parameters as
    sorted JSON: a manifest names exactly the kernel sources and build it was made with."""
    h = hashlib.sha256()
    for name, path in sources:
        if path.exists():
            h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(json.dumps(params, sort_keys=True).encode())
    return h.hexdigest()


def load_entry(package: str, entries: tuple[str, ...], backend: str, name: str):
    """The launchable kernel `name` of `package` for `backend` ("cpu" or "gpu"): `fn(grid, block, *args)`."""
    if name not in entries:
        raise KeyError(f"{package} has no entry {name!r} (it has {', '.join(entries)})")
    mod = importlib.import_module(f"{package}.{'cpu' if backend == 'cpu' else 'cuda'}")
    return getattr(mod, name)
