"""`kern verify`: a manifest loaded, verified and its weights checked on the host, no device.

What it checks is what a load checks before anything reaches a device: the manifest parses and
verifies (`manifests.load`: every field, every reference, each kernel module's sha256 against its
sources), and, unless told not to, its weights (`runtime.weights`: every pinned file present and
hashing to its pin, every bound tensor there with its dtype and size). Nothing is compiled and no
backend is made: numba is never imported. Each problem is one line naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kern.errors import KernError
from manifests import ManifestError, load
from manifests.config import ConfigError, resolve
from manifests.describe import describe, lines
from manifests.schema import Manifest
from runtime.weights import WeightsError, bind, bound_tensors, read_tensors

__all__ = ["Verified", "Problems", "verify", "text"]


class Problems(KernError):
    """What is wrong with the manifest or its weights, one line each (never raised past the command)."""

    def __init__(self, lines: list[str]):
        super().__init__("; ".join(lines))
        self.lines = lines


@dataclass
class Verified:
    """A verified manifest's derived geometry (`manifests.describe`) and the weights files checked."""

    geometry: dict
    weights: list[dict] = field(default_factory=list)  # {"file", "sha256" (its pin, or None)}

    def as_json(self) -> dict:
        return {**self.geometry, "weights": self.weights}


def verify(what: str, config: str | None, weights: list[str], check_weights: bool = True) -> Verified:
    """Resolve WHAT (a manifest path or a target's name), load and verify it, and check its weights.
    Raises `Problems` naming each thing wrong."""
    try:
        t = resolve(what, config, weights or None)
    except ConfigError as exc:
        raise Problems([str(exc)]) from None
    try:
        m = load(t.manifest)
    except ManifestError as exc:
        raise Problems([f"{exc.source}: {p}" for p in exc.problems]) from None
    checked = _weights(m, list(t.weights)) if check_weights else []
    return Verified(describe(m), checked)


def _weights(m: Manifest, paths: list[Path]) -> list[dict]:
    """Every pinned file among `paths` and hashing to its pin, every bound tensor present and the
    size of its buffer: what a load refuses, checked on the host (`runtime.weights`)."""
    names = {Path(p).name for p in paths}
    missing = [f"{m.source}: weights.{n}: pinned file {n} is not among the weights files "
               f"({', '.join(str(p) for p in paths) or 'none found'})" for n in sorted(m.weights) if n not in names]
    if missing:
        raise Problems(missing)
    try:
        bind(m, read_tensors(paths, m.weights, bound_tensors(m)))
    except WeightsError as exc:
        raise Problems([f"{m.source}: {exc}"]) from None
    return [{"file": str(p), "sha256": m.weights.get(Path(p).name)} for p in paths]


def text(v: Verified) -> list[str]:
    """The lines `kern verify` prints: the geometry's, with the var bounds and the weights after its head."""
    out = lines(v.geometry)
    bounds = ", ".join(f"{n}<={mx}" for n, mx in v.geometry["vars"].items())
    extra = [f"  vars {bounds}"]
    for w in v.weights:
        pin = f"sha256 {w['sha256'][:16]}... matches" if w["sha256"] else "not pinned"
        extra.append(f"  weights {w['file']}: {pin}")
    return [out[0], *extra, *out[1:]]
