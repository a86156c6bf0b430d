"""Probes: the runtime's logits at one step, in the Rust kern's probe layout (SPEC §9).

`kern run --probe-dir DIR` writes, for each step that emitted (tag ``chunk`` for an emitting
prefill's first chunk, ``decode0``, ``decode1``, ... for decode steps), ``<tag>.logits.bin`` (the
bf16 logits the step's tokens were taken from, one row of ``vocab`` little-endian bf16 per
sequence; one sequence here, so row 0) and ``<tag>.tokens.bin`` (the tokens it emitted, i64 LE).
`read` takes a dump as the Rust e2e driver does: ``chunk`` then ``decode0``, the first whose row 0
argmax is the first token of its tokens file (read as i32 and as i64).

`Prober` is the warm probing process: it keeps the manifest loaded and one runtime per size, so a
probe is a prefill and one decode step, and it keeps every dump under its directory, named by the
context, beside an ``identity`` file (the `kern run` identity of the artifacts): a dump made by
other artifacts is thrown away, never reused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import threading
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from kern.errors import KernError
from oracle.cache import runtime_lock

__all__ = ["ProbeError", "Prober", "read", "write"]

TAGS = ("chunk", "decode0")


class ProbeError(KernError, RuntimeError):
    """A probe that could not be made or read."""


def write(d: Path, tag: str, logits: np.ndarray, tokens: list[int]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{tag}.logits.bin").write_bytes(np.ascontiguousarray(logits, dtype="<u2").tobytes())
    (d / f"{tag}.tokens.bin").write_bytes(np.asarray(tokens, dtype="<i8").tobytes())


def bf16_to_f32(raw: bytes) -> list[float]:
    bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)
    return [float(x) for x in bits.view(np.float32)]


def read(d: Path, vocab: int) -> tuple[str, list[float], int]:
    """(tag, row-0 logits as floats, first token) of the first dump whose argmax is its first token."""
    for tag in TAGS:
        lp, tp = d / f"{tag}.logits.bin", d / f"{tag}.tokens.bin"
        if not (lp.is_file() and tp.is_file()):
            continue
        raw, traw = lp.read_bytes(), tp.read_bytes()
        if len(raw) < vocab * 2 or len(traw) < 4:
            continue
        row = bf16_to_f32(raw[: vocab * 2])
        top = max(range(vocab), key=lambda v: (row[v], -v))
        firsts = {int.from_bytes(traw[:4], "little", signed=True)}
        if len(traw) >= 8:
            firsts.add(int.from_bytes(traw[:8], "little", signed=True))
        if top in firsts:
            return tag, row, top
    raise ProbeError(f"no dumped step in {d} produced its first token")


def _name(context: list[int]) -> str:
    return "probe-" + hashlib.sha1(json.dumps(context).encode()).hexdigest()[:12]


class Prober:
    """`kern run --probe-dir` in this process, kept warm; dumps cached under `root` by identity."""

    ROOM = 1024  # runtimes are sized in steps of this many tokens

    def __init__(self, manifest: str | Path, weights: Iterable[str | Path], backend: str, root: str | Path,
                 identity: str, spawn: Callable[[list[str], Path], tuple[str, int | None]] | None = None):
        """`spawn`, if given, runs `kern ARGV` elsewhere, its output in a log, and returns (that
        output, its exit code): then each probe is `kern run --probe-dir` run there (a gate's host,
        warm already) and this process makes no runtime, device context or kernels of its own."""
        self.spawn = spawn
        self.manifest_path = Path(manifest)
        self.weights = [str(w) for w in weights]
        self.backend = backend
        self.root = Path(root)
        self.identity = identity
        self._manifest = None
        self._runtimes: dict[int, tuple] = {}
        self.made = 0  # probes run (not read from the cache)
        self._lock = threading.Lock()  # one probe at a time: its warm runtimes and dump directory
        self.vocab = int(json.loads(self.manifest_path.read_text())["buffers"]["logits"]["shape"][-1])

    def warm(self) -> None:
        """Make the runtime a first probe would use, and run it one token (its device, its kernels
        loaded), so that probe does not pay them: a gate calls this from a thread as a float target
        starts. Failures are the first probe's to report. Nothing to do when probes are spawned."""
        if self.spawn is not None:
            return
        try:
            with self._lock, runtime_lock(self.backend == "cpu"):
                from runtime.sequence import generate
                from runtime.step import Cell

                rt, cell = self._runtime(1)
                generate(rt, Cell(cell.pages, cell.slot, [], 0), [0], 1, 1)
        except Exception:  # the probe that needs it will say why
            pass

    def _runtime(self, tokens: int) -> tuple:
        """A warm (runtime, cell) with room for `tokens` tokens (sized in steps of ROOM)."""
        from manifests import load
        from runtime.sequence import single

        if self._manifest is None:
            self._manifest = load(self.manifest_path)
        size = -(-tokens // self.ROOM) * self.ROOM
        got = self._runtimes.get(size)
        if got is None:
            got = self._runtimes[size] = single(self._manifest, self.weights, size - 1, 1, 1, self.backend)
        return got

    def _fresh_root(self) -> None:
        ident = self.root / "identity"
        if self.root.is_dir() and (not ident.is_file() or ident.read_text().strip() != self.identity):
            shutil.rmtree(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        ident.write_text(self.identity + "\n")

    def probe(self, context: list[int]) -> tuple[str, list[float], int]:
        """The runtime's logits predicting the token after `context`: (tag, logits, its argmax)."""
        context = [int(t) for t in context]
        in_here = runtime_lock(self.backend == "cpu") if self.spawn is None else contextlib.nullcontext()
        with self._lock, in_here:  # a GPU's runtimes: one at a time in this process
            self._fresh_root()
            d = self.root / _name(context)
            try:
                return read(d, self.vocab)
            except ProbeError:
                pass
            if d.exists():
                shutil.rmtree(d)
            self._run(context, d)
            self.made += 1
            return read(d, self.vocab)

    def _run(self, context: list[int], d: Path) -> None:
        tmp = d.with_name(d.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        if self.spawn is not None:
            self._spawned(context, tmp, d.with_name(d.name + ".log"))
            tmp.rename(d)
            return
        from runtime.sequence import generate
        from runtime.step import Cell

        rt, cell = self._runtime(len(context) + 1)
        cell = Cell(cell.pages, cell.slot, [], 0)

        def dump(tag: str, tokens: list[int]) -> None:
            rows = rt.logits(1)
            if rows is not None:
                write(tmp, tag, rows[0], tokens)

        generate(rt, cell, context, 1, 1, on_step=dump)
        if not tmp.exists():
            raise ProbeError(f"{self.manifest_path.name} has no logits to probe")
        tmp.rename(d)

    def _spawned(self, context: list[int], tmp: Path, log: Path) -> None:
        """The same probe as `_run`'s (one sequence, one row, one step) as a `kern run` elsewhere."""
        cmd = ["run", str(self.manifest_path),
               *[a for w in self.weights for a in ("--weights", w)], "--prompt-ids", ",".join(map(str, context)),
               "--steps", "1", "--rows", "1", "--backend", self.backend, "--probe-dir", str(tmp)]
        out, code = self.spawn(cmd, log)
        if code != 0 or not tmp.is_dir():
            raise ProbeError(f"`kern run --probe-dir` for {len(context)} tokens exited {code}: {out.strip()[-300:]}")
