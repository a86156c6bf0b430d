"""The reference oracle: a model.py loaded by path (SPEC §8).

The module must expose ``generate(ids, max_tokens, manifest) -> list[int]`` (the greedy
continuation, stopping before EOS) and may expose ``ACCEPT_PCT = (lo, hi)`` and
``path(ids, max_tokens, manifest, rows, emits)`` (what each step emits: the policy oracle's input).

On integer targets it is exact and excuses nothing. On a float target (a manifest with a
``logits`` buffer) whose model.py also exposes ``logits(ids, manifest)`` (bf16 bits of the 257
logits after `ids`), the runtime adds in another order than the reference, so a divergence may be
a true near-tie: `near_tie` then probes the runtime at that step (`oracle.probe.Prober`), checks
the probe against the reference's logits and gives the verdict (`verdicts.evidence`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import struct
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from oracle.cache import Cache
from verdicts import evidence

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

    def __init__(self, model: str | Path, manifest: dict[str, Any] | str | Path, cache: Cache | None = None,
                 prober: Any = None, worker: bool = False):
        self.path = Path(model)
        self.prober = prober
        self.module = load_model(self.path)
        if not isinstance(manifest, dict):
            manifest = json.loads(Path(manifest).read_text())
        self.manifest = manifest
        self.cache = cache
        pct = getattr(self.module, "ACCEPT_PCT", None)
        self.accept_pct: tuple[float, float] | None = tuple(pct) if pct is not None else None  # type: ignore[assignment]
        # `worker`: the module's arithmetic runs in a process of its own (one, so what it remembers of
        # earlier calls, a plain-Python model's memo, serves every later one); the caller's threads
        # (a gate's lanes, its other targets) keep their GIL for their clients and checks
        self._pool = None
        if worker:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_worker_init, initargs=(str(self.path), self.manifest))

    def _call(self, name: str, *args):
        """`name(*args, manifest)` of the module, here or in the worker."""
        if self._pool is not None:
            return self._pool.submit(_worker_call, name, *args).result()
        return getattr(self.module, name)(*args, self.manifest)

    def close(self) -> None:
        """End the worker process, if any."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def run(self, ids: list[int], steps: int, rows: int = 1) -> list[int]:
        ids = [int(t) for t in ids]
        if self.cache is not None:
            hit = self.cache.get(ids, steps, rows)
            if hit is not None:
                return hit
        out = [int(t) for t in self._call("generate", list(ids), int(steps))]
        if self.cache is not None:
            self.cache.put(ids, steps, rows, out)
        return out

    @property
    def floats(self) -> bool:
        """A float target whose model.py gives logits: divergences may be near-ties."""
        return "logits" in self.manifest.get("buffers", {}) and callable(getattr(self.module, "logits", None))

    def logits(self, context: list[int]) -> list[float]:
        """The reference's logits after `context`, as floats (from its bf16 bits)."""
        bits = [int(b) for b in self._call("logits", [int(t) for t in context])]
        return [struct.unpack("<f", struct.pack("<I", (b & 0xFFFF) << 16))[0] for b in bits]

    def path_of(self, ids: list[int], steps: int, rows: int, emits: bool) -> dict | None:
        """The module's `path` (what each step emits, for the policy oracle), or None without one."""
        fn = getattr(self.module, "path", None)
        if not callable(fn):
            return None
        if self._pool is not None:
            return self._pool.submit(_worker_path, [int(t) for t in ids], int(steps), int(rows), bool(emits)).result()
        return fn([int(t) for t in ids], int(steps), self.manifest, int(rows), bool(emits))

    def near_tie(self, context: list[int], a: int, b: int, rows: int = 1) -> str:
        if not self.floats or self.prober is None:
            # exact arithmetic has no near-ties: every divergence is a real one
            return f"confident flip: the reference says {b}"
        try:
            _, probe, _ = self.prober.probe(context)
        except Exception as exc:  # no probe, no evidence: nothing is excused
            return f"no evidence (probe failed: {type(exc).__name__}: {exc})"
        return evidence(probe, a, b, self.logits(context))


# the worker process's side (`Reference(worker=True)`): the module and manifest, loaded once
_WORKER: dict[str, Any] = {}


def _worker_init(path: str, manifest: dict[str, Any]) -> None:
    _WORKER["module"] = load_model(path)
    _WORKER["manifest"] = manifest


def _worker_call(name: str, *args):
    return getattr(_WORKER["module"], name)(*args, _WORKER["manifest"])


def _worker_path(ids: list[int], steps: int, rows: int, emits: bool):
    return _WORKER["module"].path(ids, steps, _WORKER["manifest"], rows, emits)
