"""A target's oracles (the reference and `kern run`) and a `Run` of one target outside a gate: what the
gate's CLI and a case's replay (e2e/case.py) both build, in a module of its own so neither imports the other."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from e2e.checks import Checks
from e2e.config import ConfigError, GateTarget, load_targets
from e2e.engine import Engine
from e2e.gate import Options, Run
from e2e.spawn import own_kern, run_command
from oracle.cache import Cache, CommandRun, KernRun, kern_run_identity
from oracle.probe import Prober
from oracle.reference import PACKAGED_MODEL, Reference

__all__ = ["make_run", "oracles_for"]


def oracles_for(t: GateTarget, reference: Path | None, out: Path, backend: str, worker: bool = False,
             hosts=None, timeout: float = 600.0, kern: list[str] | None = None):
    """(oracle, runner): the reference (its own `oracle` over `reference`) and `kern run` (in process,
    or the ``--kern`` command's `run`, so run_equals_reference tests that kern, not this checkout)."""
    if t.oracle is not None:
        reference = t.oracle
    if kern is not None:
        runner = CommandRun(kern, t.config or "kern.toml", t.name, timeout)
        return (Reference(reference, t.manifest, worker=worker), runner) if reference is not None else (runner, None)
    ident = kern_run_identity(t.manifest, t.weights, backend)
    # a float target's divergences may be near-ties: the probe gives the runtime's logits at that step,
    # made in one of the gate's hosts when it has them (then this process makes no device context)
    spawn = None if hosts is None else (lambda argv, log: run_command(hosts, [*own_kern(), *argv], log, timeout))
    prober = Prober(t.manifest, t.weights, backend, out / t.name / "probes", ident, spawn) if t.floats else None
    runner = KernRun(t.manifest, t.weights, backend, Cache(out / t.name / "oracle.json", ident), prober=prober)
    if reference is None:
        return runner, None
    return Reference(reference, t.manifest, prober=prober, worker=worker), runner


def make_run(target: str, backend: str, out: Path, seed: int = 0, max_tokens: int = 64,
             echo: Callable[[str], None] = print, opts: Options | None = None,
             reference: Path | None = PACKAGED_MODEL, config: str | None = None, engine: Engine | None = None,
             capacity: int | None = None, load_timeout: float | None = None) -> Run:
    """A `Run` of one target outside a gate (a case's replay): its oracles, no checks filter; servers
    from `opts`' spawners when given, else fresh processes; `engine` the engine under test (None: the one
    in `opts`, else this checkout's kern); `capacity` and `load_timeout` the gate's `Options` (None: default)."""
    cfg, chosen = load_targets(config, [target])
    t = chosen[0]
    if t.skipped:
        raise ConfigError(f"target {target}: {t.skipped}")
    more = {k: v for k, v in (('capacity', capacity), ('load_timeout', load_timeout)) if v is not None}
    o = dataclasses.replace(opts, out=out, seed=seed, **more) if opts is not None else Options(
        cfg.resolve(), out, max_tokens, backend, seed=seed, **more)
    if engine is not None:
        o = dataclasses.replace(o, engine=engine)
    oracle, runner = oracles_for(t, reference, out, backend)
    return Run(t, o, oracle, runner, Checks(None, echo=echo, engine=o.engine), echo=echo)
