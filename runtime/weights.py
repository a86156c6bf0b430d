"""Weights: safetensors files bound to `weight` buffers by their `bind` segments."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from manifests.schema import Manifest

_DT = {"i64": np.int64, "i32": np.int32, "u8": np.uint8, "f32": np.float32}


class WeightsError(ValueError):
    """A weight that cannot be bound: a missing file or tensor, or a size or dtype that disagrees."""


def read_tensors(paths: list[str | Path]) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    tensors: dict[str, np.ndarray] = {}
    for p in paths:
        if not Path(p).is_file():
            raise WeightsError(f"weights file {p} does not exist")
        try:
            tensors.update(load_file(str(p)))
        except Exception as exc:  # safetensors raises its own error types
            raise WeightsError(f"weights file {p}: {exc}") from exc
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
