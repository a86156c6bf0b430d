"""Targets: the TOML config (`[targets.NAME]` tables) and how a name or a path resolves to one.

A target name resolves through `--config`, else the nearest `kern.toml` walking up from the
working directory, else the packaged `manifests/toy.toml` and then `manifests/toy-pp.toml` (the
staged targets: a file of its own, see toy/gen.py). A manifest given by path loads its weights from
`--weights`, by default every `*.safetensors` beside it.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from kern.errors import KernError

PACKAGED = Path(__file__).parent / "toy.toml"
# toy-layers through pipeline stages: kept out of toy.toml, whose readers include the Rust kern gate
# driver, which denies the unknown `stages` key (and with it the whole file)
PACKAGED_PP = Path(__file__).parent / "toy-pp.toml"
TARGET_KEYS = {"manifest", "reference", "weights", "tokenizer", "kernels", "stages", "cut", "engine", "capabilities",
               "oracle", "facts", "engine_name"}
TOP_KEYS = {"targets", "gpu", "capacity", "kernels", "test", "run"}


class ConfigError(KernError, ValueError):
    """A config that cannot be read, or a target it does not name."""


@dataclass(frozen=True)
class Target:
    name: str
    manifest: Path
    reference: Path | None = None
    weights: tuple[Path, ...] = ()
    tokenizer: Path | None = None
    kernels: Path | None = None
    stages: int = 1  # served as a pipeline of this many stages (kern serve --stages; e2e passes it)
    cut: tuple[int, ...] = ()  # the cut points for those stages (default: balanced calls per stage)
    engine: str | None = None  # e2e: the command of the engine under test (docs/engine-contract.md), not kern
    capabilities: tuple[str, ...] | None = None  # e2e: what that engine can do (else asked of it)
    oracle: Path | None = None  # e2e: the target's reference model.py (else e2e --reference)
    facts: dict | None = None  # e2e: that engine's facts (page, max_request_tokens), as /kern/capabilities gives them
    engine_name: str | None = None  # e2e: that engine's name in the summary (else /kern/capabilities', else the command)


@dataclass(frozen=True)
class Config:
    path: Path
    targets: dict[str, Target] = field(default_factory=dict)


def find_config(explicit: str | Path | None = None, cwd: Path | None = None) -> Path:
    if explicit is not None:
        return Path(explicit)
    here = (cwd or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "kern.toml").is_file():
            return d / "kern.toml"
    return PACKAGED


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"config {path}: cannot read: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path}: not valid TOML: {exc}") from exc
    problems = [f"unknown key {k!r}" for k in raw if k not in TOP_KEYS]
    base = path.parent
    targets = {}
    tables = raw.get("targets", {})
    if not isinstance(tables, dict):
        problems.append("targets: expected tables [targets.NAME]")
        tables = {}
    for name, t in tables.items():
        if not isinstance(t, dict):
            problems.append(f"targets.{name}: expected a table")
            continue
        problems += [f"targets.{name}.{k}: unknown key" for k in t if k not in TARGET_KEYS]
        if "manifest" not in t:
            problems.append(f"targets.{name}.manifest: missing")
            continue
        rel = lambda v: (base / Path(v).expanduser()) if v is not None else None  # noqa: E731
        weights = t.get("weights", [])
        if isinstance(weights, str):
            weights = [weights]
        targets[name] = Target(
            name,
            rel(t["manifest"]),
            rel(t.get("reference")),
            tuple(rel(w) for w in weights),
            rel(t.get("tokenizer")),
            rel(t.get("kernels")),
            *_pipeline(name, t, problems),
            *_engine(name, t, problems),
            rel(t.get("oracle")),
            _facts(name, t, problems),
            t.get("engine_name") if isinstance(t.get("engine_name"), str) else None,
        )
    if problems:
        raise ConfigError(f"config {path}: " + "; ".join(problems))
    return Config(path, targets)


def _pipeline(name: str, t: dict, problems: list[str]) -> tuple[int, tuple[int, ...]]:
    stages, cut = t.get("stages", 1), t.get("cut", [])
    if not isinstance(stages, int) or isinstance(stages, bool) or stages < 1:
        problems.append(f"targets.{name}.stages: expected a positive integer, got {stages!r}")
        stages = 1
    if not isinstance(cut, list) or not all(isinstance(a, int) and not isinstance(a, bool) for a in cut):
        problems.append(f"targets.{name}.cut: expected a list of call indices, got {cut!r}")
        cut = []
    elif cut and len(cut) != stages - 1:
        problems.append(f"targets.{name}.cut: {len(cut)} cut point(s) for {stages} stages (expected {stages - 1})")
    return stages, tuple(cut)


def _engine(name: str, t: dict, problems: list[str]) -> tuple[str | None, tuple[str, ...] | None]:
    engine, caps = t.get("engine"), t.get("capabilities")
    if engine is not None and (not isinstance(engine, str) or not engine.strip()):
        problems.append(f"targets.{name}.engine: expected a command line, got {engine!r}")
        engine = None
    if caps is not None and (not isinstance(caps, list) or not all(isinstance(c, str) for c in caps)):
        problems.append(f"targets.{name}.capabilities: expected a list of names, got {caps!r}")
        caps = None
    return engine, tuple(caps) if caps is not None else None


def _facts(name: str, t: dict, problems: list[str]) -> dict | None:
    facts = t.get("facts")

    def fits(k, v) -> bool:  # families: a list of toy family names; every other fact an integer
        if k == "families":
            return isinstance(v, list) and all(isinstance(x, str) for x in v)
        if k == "reset":  # the path of its cache reset (docs/engine-contract.md)
            return isinstance(v, str) and v.startswith("/")
        if k == "params":  # the request-parameter rules it follows (verdicts/params.py: kern, vllm)
            return isinstance(v, str) and bool(v)
        return isinstance(v, int) and not isinstance(v, bool)
    if facts is not None and (not isinstance(facts, dict) or not all(fits(k, v) for k, v in facts.items())):
        problems.append(f"targets.{name}.facts: expected a table of integers (page = 32, ...) and families, "
                        f"a list of toy family names, reset, a path (\"/reset_prefix_cache\"), and params, the "
                        f"name of the parameter rules it follows (\"vllm\"), got {facts!r}")
    return facts


def resolve(what: str, config: str | Path | None = None, weights: list[str] | None = None) -> Target:
    """A target by name (through the config) or a manifest by path."""
    p = Path(what)
    if what.endswith(".json") or p.is_file():
        if not p.is_file():
            raise ConfigError(f"manifest {what} does not exist")
        ws = tuple(Path(w) for w in weights) if weights else tuple(sorted(p.parent.glob("*.safetensors")))
        return Target(p.stem, p, None, ws)
    cfg = load_config(find_config(config))
    if what not in cfg.targets and cfg.path.resolve() == PACKAGED.resolve() and PACKAGED_PP.is_file():
        cfg = Config(cfg.path, {**load_config(PACKAGED_PP).targets, **cfg.targets})
    if what not in cfg.targets:
        known = ", ".join(sorted(cfg.targets)) or "none"
        raise ConfigError(f"unknown target {what!r} in {cfg.path} (targets: {known})")
    t = cfg.targets[what]
    if weights:
        t = dataclasses.replace(t, weights=tuple(Path(w) for w in weights))
    return t
