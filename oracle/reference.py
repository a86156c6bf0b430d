"""The reference oracle: a model.py loaded by path, exact, so it excuses nothing (SPEC §8).

The module must expose ``generate(ids, max_tokens, manifest) -> list[int]`` (the greedy
continuation, stopping before EOS) and may expose ``ACCEPT_PCT = (lo, hi)``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from oracle.cache import Cache

__all__ = ["Reference", "ReferenceError", "load_model"]

PACKAGED_MODEL = Path(__file__).resolve().parent.parent / "toy" / "model.py"


class ReferenceError(ValueError):
    """A reference module that cannot be loaded or lacks `generate`."""


def load_model(path: str | Path) -> ModuleType:
    """Import a model.py by path, under a name private to its bytes (two files never collide)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ReferenceError(f"reference {path}: cannot read: {exc.strerror or exc}") from exc
    name = f"_kern_reference_{hashlib.sha256(data).hexdigest()[:16]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ReferenceError(f"reference {path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ReferenceError(f"reference {path}: import failed: {type(exc).__name__}: {exc}") from exc
    if not callable(getattr(module, "generate", None)):
        raise ReferenceError(f"reference {path}: no generate(ids, max_tokens, manifest)")
    sys.modules[name] = module
    return module


class Reference:
    """`generate` of a model.py for one manifest; `rows` is ignored (every drafted row is greedy)."""

    kind = "reference"
    exact = True
    available = True

    def __init__(self, model: str | Path, manifest: dict[str, Any] | str | Path, cache: Cache | None = None):
        self.path = Path(model)
        self.module = load_model(self.path)
        if not isinstance(manifest, dict):
            manifest = json.loads(Path(manifest).read_text())
        self.manifest = manifest
        self.cache = cache
        pct = getattr(self.module, "ACCEPT_PCT", None)
        self.accept_pct: tuple[float, float] | None = tuple(pct) if pct is not None else None  # type: ignore[assignment]

    def run(self, ids: list[int], steps: int, rows: int = 1) -> list[int]:
        ids = [int(t) for t in ids]
        if self.cache is not None:
            hit = self.cache.get(ids, steps, rows)
            if hit is not None:
                return hit
        out = [int(t) for t in self.module.generate(list(ids), int(steps), self.manifest)]
        if self.cache is not None:
            self.cache.put(ids, steps, rows, out)
        return out

    def near_tie(self, context: list[int], a: int, b: int, rows: int = 1) -> str:
        # exact arithmetic has no near-ties: every divergence is a real one
        return f"confident flip: the reference says {b}"
