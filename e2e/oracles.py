"""A target's oracles (the reference and `kern run`) and a `Run` of one target outside a gate: what the
gate's CLI and a case's replay (e2e/case.py) both build, in a module of its own so neither imports the other.
The oracle a `Run` judges against is an `Oracle` (e2e/oracle_seam.py): `Adapted` makes one of the oracle
package's classes one."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from e2e.checks import Checks
from e2e.config import ConfigError, GateTarget, load_targets
from e2e.engine import Engine
from e2e.gate import Options, Run
from e2e.oracle_seam import Oracle
from e2e.spawn import own_kern, run_command
from oracle.cache import Cache, CommandRun, KernRun, kern_run_identity
from oracle.probe import Prober
from oracle.reference import PACKAGED_MODEL, Reference

__all__ = ["Adapted", "make_run", "oracles_for"]


class Adapted:
    """An oracle of the oracle package as the gate's `Oracle`: the reference's every member; `kern run`'s
    (in process, or the --kern command) with nothing to prefetch or close and no EOS, logits or path (nor
    a prober for the --kern command, nor its near-tie evidence: a divergence from it is a real one)."""

    def __init__(self, raw: Reference | KernRun | CommandRun):
        self.raw = raw
        self.kind, self.exact, self.available, self.accept_pct = raw.kind, raw.exact, raw.available, raw.accept_pct
        ref = raw if isinstance(raw, Reference) else None
        self.eos: int | None = None if ref is None else getattr(ref.module, "EOS", None)  # a model.py may name none
        self.prober = None if isinstance(raw, CommandRun) else raw.prober
        self.logits = None if ref is None else ref.logits
        self.path_of = None if ref is None else ref.path_of
        self.eos_masked = (ref.eos_masked if ref is not None and callable(getattr(ref.module, "eos_masked", None))
                           else None)

    def run(self, ids: list[int], steps: int, rows: int) -> list[int]:
        return self.raw.run(ids, steps, rows)

    def near_tie(self, context: list[int], a: int, b: int, rows: int) -> str | None:
        return None if isinstance(self.raw, CommandRun) else self.raw.near_tie(context, a, b, rows)

    def prefetch(self, ids: list[int], steps: int, rows: int, path: tuple[int, bool] | None = None) -> None:
        if isinstance(self.raw, Reference):
            self.raw.prefetch(ids, steps, rows, path=path)

    def close(self) -> None:
        if isinstance(self.raw, Reference):
            self.raw.close()


def oracles_for(t: GateTarget, reference: Path | None, out: Path, backend: str, worker: int = 0,
             hosts=None, timeout: float = 600.0,
             kern: list[str] | None = None) -> tuple[Oracle, KernRun | CommandRun | None]:
    """(oracle, runner): the reference (its own `oracle` over `reference`) and `kern run` (in process,
    or the ``--kern`` command's `run`, so run_equals_reference tests that kern, not this checkout);
    without a reference, `kern run` is the oracle and there is no runner."""
    if t.oracle is not None:
        reference = t.oracle
    if kern is not None:
        runner = CommandRun(kern, t.config or "kern.toml", t.name, timeout)
        if reference is None:
            return Adapted(runner), None
        return Adapted(Reference(reference, t.manifest, worker=worker)), runner
    ident = kern_run_identity(t.manifest, t.weights, backend)
    # a float target's divergences may be near-ties: the probe gives the runtime's logits at that step,
    # made in one of the gate's hosts when it has them (then this process makes no device context)
    spawn = None if hosts is None else (lambda argv, log: run_command(hosts, [*own_kern(), *argv], log, timeout))
    prober = Prober(t.manifest, t.weights, backend, out / t.name / "probes", ident, spawn) if t.floats else None
    runner = KernRun(t.manifest, t.weights, backend, Cache(out / t.name / "oracle.json", ident), prober=prober)
    if reference is None:
        return Adapted(runner), None
    return Adapted(Reference(reference, t.manifest, prober=prober, worker=worker)), runner


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
