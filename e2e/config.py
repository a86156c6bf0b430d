"""The gate's targets: a config's `[targets.NAME]` tables, and what the driver reads of each manifest.

A target is skipped (not failed) when its manifest, reference manifest or a weights file is
missing, or its manifest is not JSON; `--targets` naming a target the config lacks is a usage error.

With no `--config` and no `kern.toml` found, the targets are the packaged `manifests/toy.toml`'s and
then `manifests/toy-pp.toml`'s (toy-layers through 2 and 3 pipeline stages: a file of its own, as
the Rust kern gate driver, which also reads toy.toml, denies the `stages` key). A target remembers
the file it came from: its servers and `kern test` are given that `--config`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from manifests.config import PACKAGED, PACKAGED_PP, ConfigError, find_config, load_config

__all__ = ["ConfigError", "GateTarget", "family_of", "load_targets"]


@dataclass(frozen=True)
class GateTarget:
    name: str
    manifest: Path
    reference: Path | None
    weights: tuple[Path, ...]
    model: str
    lined: bool
    widest: int
    ranks: int
    skipped: str | None
    floats: bool = False  # a `logits` buffer: answers may diverge at near-ties (judged on probes)
    stages: int = 1  # the config's `stages`: each server is started with `--stages N` (N > 1: a pipeline)
    config: Path | None = None  # the config file it came from (given to its servers and `kern test`)
    engine: str | None = None  # the command of an engine under the contract (docs/engine-contract.md)
    capabilities: tuple[str, ...] | None = None  # that engine's, as the config declares them
    oracle: Path | None = None  # the target's own reference model.py (over e2e --reference)
    facts: dict | None = None  # that engine's facts, as the config declares them (page, max_request_tokens)
    engine_name: str | None = None  # that engine's name, as the config gives it
    family: str = "paged"  # the toy family its manifest computes (`family_of`; docs/toy.md): what facts.families names

    @property
    def spec(self) -> bool:
        return self.widest > 1


def _widest(m: dict[str, Any]) -> int:
    rows = [p.get("batch", {}).get("rows") for p in m.get("programs", {}).values()]
    return max([r for r in rows if isinstance(r, int)] or [1])


def family_of(m: dict[str, Any]) -> str:
    """The toy family a manifest computes, as docs/toy.md tells them apart (its own ``family`` key first):
    ``float``, ``layered``, ``attn``, ``lined`` or ``paged``."""
    if isinstance(m.get("family"), str):
        return m["family"]
    states = m.get("states") or {}
    if "logits" in (m.get("buffers") or {}):
        return "float"
    if "kv.0" in states:
        return "layered"
    if "attn" in states:
        return "attn"
    return "lined" if any((s or {}).get("bytes_per_seq", 0) for s in states.values()) else "paged"


def _ranks(m: dict[str, Any]) -> int:
    groups = (m.get("topology") or {}).get("groups") or {}
    sizes = groups.values() if isinstance(groups, dict) else groups
    n = 1
    for g in sizes:
        n *= int(g)
    return n


def _target(t, config: Path | None = None) -> GateTarget:
    skipped = None
    m: dict[str, Any] = {}
    if not t.manifest.is_file():
        skipped = f"manifest {t.manifest} missing"
    else:
        try:
            m = json.loads(t.manifest.read_text())
        except ValueError as exc:
            skipped = f"manifest {t.manifest} is not JSON: {exc}"
    if skipped is None and t.oracle is not None and not t.oracle.is_file():
        skipped = f"oracle {t.oracle} missing"
    if skipped is None and t.reference is not None and not t.reference.is_file():
        skipped = f"reference manifest {t.reference} missing"
    for w in t.weights:
        if skipped is None and not w.exists():
            skipped = f"weights {w} missing"
    weights = t.weights or tuple(sorted(t.manifest.parent.glob("*.safetensors")))
    lined = any((s or {}).get("bytes_per_seq", 0) for s in m.get("states", {}).values())
    return GateTarget(t.name, t.manifest, t.reference, weights, m.get("model", t.name), lined,
                      _widest(m), _ranks(m), skipped, "logits" in m.get("buffers", {}), t.stages, config,
                      t.engine, t.capabilities, t.oracle, t.facts, t.engine_name, family_of(m))


def load_targets(config: str | Path | None, names: list[str] | None) -> tuple[Path, list[GateTarget]]:
    """The config's path and its targets (all, or `names` in the given order)."""
    path = find_config(config)
    cfg = load_config(path)
    where = dict.fromkeys(cfg.targets, path)
    if config is None and path.resolve() == PACKAGED.resolve() and PACKAGED_PP.is_file():
        staged = load_config(PACKAGED_PP).targets
        clash = sorted(set(staged) & set(cfg.targets))
        if clash:
            raise ConfigError(f"{PACKAGED_PP} names targets {path} has too: {', '.join(clash)}")
        cfg.targets.update(staged)
        where.update(dict.fromkeys(staged, PACKAGED_PP))
    if names:
        unknown = [n for n in names if n not in cfg.targets]
        if unknown:
            known = ", ".join(sorted(cfg.targets)) or "none"
            raise ConfigError(f"unknown target(s) {', '.join(unknown)} in {path} (targets: {known})")
        chosen = [cfg.targets[n] for n in names]
    else:
        chosen = list(cfg.targets.values())
    return path, [_target(t, where[t.name]) for t in chosen]
