"""Weights: safetensors files bound to `weight` buffers by their `bind` segments.

A manifest may pin its weights files by name (`"weights": {"salt.safetensors": {"sha256": ...}}`): a
pinned file whose bytes hash to another sha256 is refused before it is read, and so is an unpinned
file that supplies a tensor the manifest binds (a swapped file under another name)."""

from __future__ import annotations

from pathlib import Path

import hashlib

import numpy as np

from kern.errors import KernError
from manifests.schema import Manifest

_DT = {"i64": np.int64, "i32": np.int32, "u8": np.uint8, "f32": np.float32}


class WeightsError(KernError, ValueError):
    """A weight that cannot be bound: a missing file or tensor, or a size or dtype that disagrees."""


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    except OSError as exc:
        raise WeightsError(f"weights file {path}: cannot read: {exc.strerror or exc}") from exc
    return h.hexdigest()


def bound_tensors(m: Manifest) -> set[str]:
    """The tensor names the manifest's weight and source buffers bind."""
    return {n for b in m.buffers.values() if b.kind in ("weight", "source") for n in b.bind}


def read_tensors(paths: list[str | Path], pins: dict[str, str] | None = None,
                 bound: set[str] | frozenset = frozenset()) -> dict[str, np.ndarray]:
    """Every tensor of the files. With `pins` (a manifest's `weights`: file name -> sha256), a pinned
    file must hash to its pin, and a tensor in `bound` must come from a pinned file."""
    from safetensors.numpy import load_file

    tensors: dict[str, np.ndarray] = {}
    origin: dict[str, Path] = {}
    for p in paths:
        p = Path(p)
        if not p.is_file():
            raise WeightsError(f"weights file {p} does not exist")
        if pins and p.name in pins:
            got = sha256_file(p)
            if got != pins[p.name]:
                raise WeightsError(f"weights file {p}: sha256 {got}, but the manifest pins {p.name} at sha256 "
                                   f"{pins[p.name]} (a corrupted or swapped file; regenerate it or the manifest)")
        try:
            loaded = load_file(str(p))
        except Exception as exc:  # safetensors raises its own error types
            raise WeightsError(f"weights file {p}: {exc}") from exc
        tensors.update(loaded)
        origin.update(dict.fromkeys(loaded, p))
    if pins:
        for name in sorted(bound):
            src = origin.get(name)
            if src is not None and src.name not in pins:
                raise WeightsError(f"weights file {src}: supplies tensor {name!r}, but the manifest pins its weights "
                                   f"to {', '.join(sorted(pins))} by sha256 and not this file")
    return tensors


def bind(m: Manifest, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """For each weight or source buffer that binds tensors, its bytes: the bound tensors laid end to
    end, tiling it exactly. (A weight a derive program writes binds nothing.)"""
    out = {}
    env = m.var_max()
    for b in m.buffers.values():
        if b.kind not in ("weight", "source") or not b.bind:
            continue
        parts = []
        for name in b.bind:
            if name not in tensors:
                raise WeightsError(f"buffer {b.name} binds tensor {name!r}, which no weights file holds")
            t = tensors[name]
            if t.dtype != _DT.get(b.dtype):
                raise WeightsError(f"tensor {name} is {t.dtype}, buffer {b.name} is {b.dtype}")
            parts.append(t.reshape(-1))
        data = np.concatenate(parts) if parts else np.zeros(0)
        if data.nbytes != b.nbytes(env):
            raise WeightsError(f"buffer {b.name} holds {b.nbytes(env)} bytes, its tensors {data.nbytes}")
        out[b.name] = data.view(np.uint8)
    return out
