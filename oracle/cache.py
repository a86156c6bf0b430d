"""The oracle's answer cache (``oracle.json``) and the cached `kern run` oracle (SPEC §8).

``oracle.json`` is ``{"identity": sha256, "answers": {json.dumps([ids, steps, rows]): ids}}``. The
identity names everything the answers depend on; a file with another identity is thrown away
whole, so a ``git bisect`` step never reuses another commit's answers:

- reference: the kind and the model file's bytes (and the manifest's, which `generate` reads);
- kern run: the kind, the manifest and weights bytes, the module hashes, the sorted source bytes
  of ``runtime/ toy/ manifests/ oracle/``, and the backend.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any, Iterable

__all__ = ["RUNTIME_LOCK", "THREADSAFE_LAYERS", "runtime_lock", "threading_layer", "Cache", "CommandRun", "KernRun", "SOURCE_DIRS", "identity", "kern_run_identity", "key", "reference_identity"]

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("runtime", "toy", "manifests", "oracle", "kern")  # kern: the EOS the runtime stops at


def key(ids: Iterable[int], steps: int, rows: int) -> str:
    return json.dumps([[int(t) for t in ids], int(steps), int(rows)])


def identity(kind: str, parts: Iterable[bytes]) -> str:
    """sha256 of the kind and each part, length-prefixed so no two splits of the bytes collide."""
    h = hashlib.sha256(kind.encode())
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()


def reference_identity(model: str | Path, manifest: str | Path | None = None) -> str:
    parts = [Path(model).read_bytes()]
    if manifest is not None:
        parts.append(Path(manifest).read_bytes())
    return identity("reference", parts)


def _sources(root: Path, dirs: Iterable[str]) -> list[bytes]:
    out = []
    for d in dirs:
        files = sorted(p for p in (root / d).rglob("*.py") if "__pycache__" not in p.parts)
        for p in files:
            out += [p.relative_to(root).as_posix().encode(), p.read_bytes()]
    return out


def kern_run_identity(manifest: str | Path, weights: Iterable[str | Path], backend: str,
                      root: Path = ROOT, dirs: Iterable[str] = SOURCE_DIRS) -> str:
    mbytes = Path(manifest).read_bytes()
    modules = json.loads(mbytes).get("modules", {})
    hashes = json.dumps({n: m.get("sha256") for n, m in sorted(modules.items())}).encode()
    parts = [mbytes, *(Path(w).read_bytes() for w in weights), hashes, *_sources(root, dirs), backend.encode()]
    return identity("kern run", parts)


class Cache:
    """Answers keyed by ids, steps and rows; loaded if its identity matches, rewritten on every put."""

    def __init__(self, path: str | Path, ident: str):
        self.path = Path(path)
        self.identity = ident
        self.answers: dict[str, list[int]] = {}
        self.discarded = False
        self.lock = threading.Lock()
        try:
            raw = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        if isinstance(raw, dict) and raw.get("identity") == ident and isinstance(raw.get("answers"), dict):
            self.answers = raw["answers"]
        else:
            self.discarded = True

    def get(self, ids: Iterable[int], steps: int, rows: int) -> list[int] | None:
        hit = self.answers.get(key(ids, steps, rows))
        return list(hit) if hit is not None else None

    def put(self, ids: Iterable[int], steps: int, rows: int, answer: list[int]) -> None:
        with self.lock:  # a target's lanes put from threads
            self.answers[key(ids, steps, rows)] = [int(t) for t in answer]
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps({"identity": self.identity, "answers": self.answers}))
            os.replace(tmp, self.path)


# One GPU runtime at a time in this process, whoever runs it (KernRun, the float targets' Prober):
# numba-cuda's module loading is not for concurrent callers (e2e gates targets and their lanes from
# threads; two locks let a toy-paged run and a toy-float probe load kernels at once, and numba-cuda's
# library table raised "key already in dictionary"), nor is numba's `workqueue` CPU layer. On the
# CPU under a threadsafe layer (omp, tbb) runs go at once: the kernels release the GIL (nogil).
RUNTIME_LOCK = threading.Lock()
THREADSAFE_LAYERS = ("omp", "tbb")


def threading_layer() -> str | None:
    """numba's threading layer in this process, started now if no parallel kernel has run yet (so no
    first launch has to decide it alone); None when it cannot be started or named."""
    import numba

    try:
        return numba.threading_layer()
    except ValueError:  # no parallel kernel has run in this process yet: start the layer now
        try:
            from numba.np.ufunc.parallel import _launch_threads  # what a first parallel launch calls

            _launch_threads()
            return numba.threading_layer()
        except Exception:  # none loads, or numba's internals moved: the first launch decides
            return None


def runtime_lock(on_cpu: bool) -> Any:
    """The lock a runtime call takes: none for a CPU runtime under a threadsafe numba threading layer,
    else RUNTIME_LOCK."""
    if on_cpu and threading_layer() in THREADSAFE_LAYERS:
        return contextlib.nullcontext()
    return RUNTIME_LOCK


class KernRun:
    """`kern run` in process: one sequence through the runtime, no server, answers cached.

    The integer toy has no logits, so `near_tie` returns None there and a divergence is never
    excused. Given a `prober` (a float target), `near_tie` judges on the probe's logits at that
    step (`verdicts.evidence`, no reference to check the probe against).
    """

    kind = "kern run"
    exact = False
    available = True
    accept_pct = None

    def __init__(self, manifest: str | Path, weights: Iterable[str | Path], backend: str = "cpu",
                 cache: Cache | None = None, chunk: int | None = None, prober: Any = None):
        self.manifest_path = Path(manifest)
        self.prober = prober
        self.weights = [str(w) for w in weights]
        self.backend = backend
        self.cache = cache
        self.chunk = chunk
        self._manifest: Any = None
        self._on_cpu = backend == "cpu"
        self._warm = False  # a run has loaded this manifest's kernels

    def run(self, ids: list[int], steps: int, rows: int) -> list[int]:
        ids = [int(t) for t in ids]
        if self.cache is not None:
            hit = self.cache.get(ids, steps, rows)
            if hit is not None:
                return hit
        from manifests import load
        from runtime.sequence import generate, single

        if self._manifest is None:
            self._manifest = load(self.manifest_path)
        # a GPU's first run loads this manifest's kernels (numba-cuda's loading takes turns); later
        # ones launch loaded kernels and go at once
        lock = contextlib.nullcontext() if self._warm and not self._on_cpu else runtime_lock(self._on_cpu)
        with lock:
            rt, cell = single(self._manifest, self.weights, len(ids), steps, rows, self.backend)
            self._on_cpu = getattr(rt.backend, "name", None) == "cpu"  # `auto` is known once resolved
            out = [int(t) for t in generate(rt, cell, ids, steps, rows, self.chunk).ids]
        self._warm = True
        if self.cache is not None:
            self.cache.put(ids, steps, rows, out)
        return out

    def near_tie(self, context: list[int], a: int, b: int, rows: int) -> str | None:
        if self.prober is None:
            return None
        from verdicts import evidence

        try:
            _, probe, _ = self.prober.probe(context)
        except Exception as exc:  # no probe, no evidence: nothing is excused
            return f"no evidence (probe failed: {type(exc).__name__}: {exc})"
        return evidence(probe, a, b)


class CommandRun:
    """`CMD --config C run TARGET --prompt-ids ... --steps N --rows R` of another kern (``e2e --kern``):
    its answer is the ``generated ids: [...]`` line it writes to stderr (the Rust kern's and ours).
    Not cached: the command's bytes are not this checkout's, so no identity could name them."""

    kind = "kern run (the --kern command)"
    exact = False
    available = True
    accept_pct = None

    def __init__(self, kern: list[str], config: str | Path, target: str, timeout: float = 1800.0):
        self.kern, self.config, self.target, self.timeout = list(kern), str(config), target, timeout

    def run(self, ids: list[int], steps: int, rows: int) -> list[int]:
        import re
        import subprocess

        cmd = [*self.kern, "--config", self.config, "run", self.target, "--prompt-ids", ",".join(map(str, ids)),
               "--steps", str(steps), "--rows", str(rows)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout)
        found = re.findall(r"generated ids: \[([^\]]*)\]", p.stderr)
        if p.returncode != 0 or not found:
            raise RuntimeError(f"{' '.join(cmd[:6])} ... failed (exit {p.returncode}): {p.stderr[-300:]}")
        return [int(t) for t in found[-1].replace(",", " ").split()]
