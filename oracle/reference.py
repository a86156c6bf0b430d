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

import copy
import hashlib
import importlib.util
import json
import os
import pickle
import struct
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from types import ModuleType
from typing import Any

from kern.errors import KernError
from oracle.cache import Cache
from verdicts import evidence

__all__ = ["Reference", "ReferenceError", "load_model"]

PACKAGED_MODEL = Path(__file__).resolve().parent.parent / "toy" / "model.py"


class ReferenceError(KernError, ValueError):
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
        # `worker`: the module's arithmetic runs in processes of their own (True: one; N: up to N,
        # `Workers`: a call goes to the one its prompt's start picks, so what a plain-Python model
        # remembers of a prompt serves the calls that extend it); the caller's threads (a gate's
        # lanes, its other targets) keep their GIL for their clients and checks
        self._pool = None
        self._memo: dict[tuple, Any] = {}  # (what, args) -> its answer, or a Future of it (`prefetch`)
        self._memo_lock = threading.Lock()
        if worker:
            self._pool = Workers(self.path, self.manifest, int(worker))

    def _call(self, name: str, *args):
        """`name(*args, manifest)` of the module (`path`: `path(ids, steps, manifest, rows, emits)`),
        here or in the worker; remembered, since the arithmetic is a pure function of its arguments."""
        key = (name, *[tuple(a) if isinstance(a, list) else a for a in args])
        with self._memo_lock:
            got = self._memo.get(key)
            if got is None and self._pool is not None:
                got = self._memo[key] = self._pool.submit(name, *args)
        if got is None:
            got = self._local(name, *args)
            with self._memo_lock:
                self._memo[key] = got
            return got
        return got.result() if isinstance(got, Future) else got

    def _local(self, name: str, *args):
        if name == "path":
            ids, steps, rows, emits = args
            return self.module.path(ids, steps, self.manifest, rows, emits)
        return getattr(self.module, name)(*args, self.manifest)

    def prefetch(self, ids: list[int], steps: int, rows: int = 1, path: tuple[int, bool] | None = None) -> None:
        """With a worker: start computing `run(ids, steps)` (and, given ``path=(rows, emits)``, its
        `path_of`) now, while the caller does other things (sends the same prompt to the server);
        the later call takes the answer. Without a worker, nothing (it would only take turns)."""
        if self._pool is None:
            return
        ids = [int(t) for t in ids]
        if self.cache is None or self.cache.get(ids, steps, rows) is None:
            self._submit("generate", ids, int(steps))
        if path is not None and callable(getattr(self.module, "path", None)):
            self._submit("path", ids, int(steps), int(path[0]), bool(path[1]))

    def _submit(self, name: str, *args) -> None:
        key = (name, *[tuple(a) if isinstance(a, list) else a for a in args])
        with self._memo_lock:
            if key not in self._memo and self._pool is not None:
                self._memo[key] = self._pool.submit(name, *args)

    def close(self) -> None:
        """End the worker process, if any."""
        if self._pool is not None:
            self._pool.close()
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

    def eos_masked(self, context: list[int]) -> int | None:
        """The module's `eos_masked(ids, manifest)`: the token its model emits after `context` with EOS
        masked (an engine that honours ``min_tokens``, vLLM), or None when the module has none."""
        if not callable(getattr(self.module, "eos_masked", None)):
            return None
        return int(self._call("eos_masked", [int(t) for t in context]))

    def path_of(self, ids: list[int], steps: int, rows: int, emits: bool) -> dict | None:
        """The module's `path` (what each step emits, for the policy oracle), or None without one."""
        fn = getattr(self.module, "path", None)
        if not callable(fn):
            return None
        got = self._call("path", [int(t) for t in ids], int(steps), int(rows), bool(emits))
        return copy.deepcopy(got)  # remembered: the caller's copy is its own

    def near_tie(self, context: list[int], a: int, b: int, rows: int = 1) -> str:
        if not self.floats:
            return ""  # exact arithmetic has no near-ties: every divergence is a real one, nothing to add
        if self.prober is None:
            return f"no evidence (no probe): the reference says {b}"
        try:
            _, probe, _ = self.prober.probe(context)
        except Exception as exc:  # no probe, no evidence: nothing is excused
            return f"no evidence (probe failed: {type(exc).__name__}: {exc})"
        return evidence(probe, a, b, self.logits(context))


class Worker:
    """One `python -m oracle.reference MODEL` process that runs the module's calls in turn;
    `submit(name, *args)` returns a Future of `name(*args, manifest)` (`path`: with the manifest
    third). A process of our own, not a multiprocessing pool: nothing of the caller's `__main__` is
    imported again there. If it dies, every call not answered fails with `ReferenceError`."""

    def __init__(self, path: Path, manifest: dict[str, Any]):
        import subprocess

        root = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-m", "oracle.reference", str(path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, start_new_session=True)
        self.lock = threading.Lock()
        self.waiting: dict[int, Future] = {}
        self.next = 0
        self._send(("manifest", manifest))
        self.reader = threading.Thread(target=self._read, name="reference-worker", daemon=True)
        self.reader.start()

    def _send(self, obj) -> None:
        assert self.proc.stdin is not None
        pickle.dump(obj, self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.flush()

    def submit(self, name: str, *args) -> Future:
        fut: Future = Future()
        with self.lock:
            n, self.next = self.next, self.next + 1
            self.waiting[n] = fut
            try:
                self._send((n, name, args))
            except (BrokenPipeError, OSError, ValueError) as exc:
                self.waiting.pop(n, None)
                fut.set_exception(ReferenceError(f"the reference worker is gone ({exc})"))
        return fut

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while True:
            try:
                n, ok, value = pickle.load(self.proc.stdout)
            except (EOFError, OSError, pickle.UnpicklingError, ValueError):
                break
            with self.lock:
                fut = self.waiting.pop(n, None)
            if fut is not None:
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(value)
        with self.lock:
            left, self.waiting = self.waiting, {}
        for fut in left.values():
            fut.set_exception(ReferenceError(f"the reference worker exited (code {self.proc.poll()})"))

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except Exception:
            self.proc.kill()
            self.proc.wait()


ROUTE_TOKENS = 16  # a call's worker: picked by its ids' first this many tokens


class Workers:
    """Up to `n` `Worker` processes, each started at the first call routed to it. A call goes to the
    worker its ids' first ROUTE_TOKENS tokens pick (`index`): a prompt's later turns, its paths and
    its probes meet the memo of the worker that fed it, and unrelated prompts spread over the
    processes instead of taking turns in one (a layered or float target's oracle, plain Python, was
    its gate's slowest session on a GPU machine)."""

    def __init__(self, path: Path, manifest: dict[str, Any], n: int = 1):
        if n < 1:
            raise ValueError(f"reference workers: {n} must be at least 1")
        self.path, self.manifest = path, manifest
        self.slots: list[Worker | None] = [None] * n
        self.lock = threading.Lock()

    def index(self, ids) -> int:
        """The worker for a call on `ids` (a function of their first ROUTE_TOKENS tokens alone)."""
        return hash(tuple(int(t) for t in list(ids)[:ROUTE_TOKENS])) % len(self.slots)

    def submit(self, name: str, *args) -> Future:
        ids = args[0] if args and isinstance(args[0], (list, tuple)) else ()
        i = self.index(ids)
        with self.lock:
            w = self.slots[i]
            if w is None:
                w = self.slots[i] = Worker(self.path, self.manifest)
        return w.submit(name, *args)

    @property
    def started(self) -> list["Worker"]:
        return [w for w in self.slots if w is not None]

    def close(self) -> None:
        with self.lock:
            workers, self.slots = self.started, [None] * len(self.slots)
        for w in workers:
            w.close()


def _worker_call(module: ModuleType, manifest: dict[str, Any], name: str, *args):
    if name == "path":
        ids, steps, rows, emits = args
        return module.path(ids, steps, manifest, rows, emits)
    return getattr(module, name)(*args, manifest)


def _serve_worker(path: str) -> None:
    """The worker's loop: the manifest first, then (n, name, args) -> (n, ok, answer or why)."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # what the module prints is not the protocol
    module = load_model(path)
    _, manifest = pickle.load(stdin)
    while True:
        try:
            n, name, args = pickle.load(stdin)
        except EOFError:
            return
        try:
            out = (n, True, _worker_call(module, manifest, name, *args))
        except Exception as exc:  # the reference's own failure: raised to the caller as it was raised here
            out = (n, False, exc)
            try:
                pickle.dumps(exc)
            except Exception:
                out = (n, False, ReferenceError(f"{type(exc).__name__}: {exc}"))
        pickle.dump(out, stdout, protocol=pickle.HIGHEST_PROTOCOL)
        stdout.flush()


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m oracle.reference",
                                 description="A reference worker a gate starts (`Reference(worker=N)`): loads "
                                             "MODEL, then answers pickled calls on stdin with pickled answers on "
                                             "stdout until stdin closes. Not for typing at.")
    ap.add_argument("model", help="the model.py to load")
    _serve_worker(ap.parse_args().model)
