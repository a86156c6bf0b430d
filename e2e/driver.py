"""One target through the gate (`gate_target`: `kern test`, then its sessions, its report), and every
chosen target at once (`gate_all`, one per worker)."""

from __future__ import annotations


import concurrent.futures
import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Callable


from e2e.checks import Checks
from e2e.config import GateTarget
from e2e.engine import Engine
from e2e.gate import Options, Run
from e2e.lanes import run_target
from e2e.oracles import oracles_for
from e2e.scenarios import CROSS_CHECKS, SESSION_PORTS, plan
from e2e.session import stop_all

SESSIONS = len(SESSION_PORTS)  # a target's sessions: its block of ports under a fixed --port


def _names(values: tuple[str, ...]) -> list[str]:
    """Names given as repeated options, each space or comma separated."""
    return [n for v in values for n in v.replace(",", " ").split()]


def _skipped(t: GateTarget, reason: str, echo: Callable[[str], None]) -> dict:
    echo(f"== {t.name}\n  skipped: {reason}")
    return {"target": t.name, "skipped": reason, "facts": {}, "counters": {}, "checks": [], "wall_s": 0.0}


def gate_target(t: GateTarget, opts: Options, reference: Path | None, wanted: set[str] | None,
                echo: Callable[[str], None] | None = None) -> dict:
    echo = echo or opts.say
    if t.skipped:
        return _skipped(t, t.skipped, echo)
    opts = dataclasses.replace(opts, engine=engine_of(t, opts))
    lacks = opts.engine.lacks_family(t.family)  # told by the config's facts (else learned as it starts)
    if lacks is not None:
        return _skipped(t, lacks, echo)
    steps = plan(t, wanted, reference is not None or t.oracle is not None, opts.engine.external)
    if wanted is not None and not any(set(s.checks) & wanted or f"policy_{s.session}" in wanted
                                      or f"metrics_{s.session}" in wanted for s in steps) \
            and not wanted & set(CROSS_CHECKS):
        return _skipped(t, "no selected check applies", echo)
    staged = f", {t.stages} pipeline stages" if t.stages > 1 else ""
    under = f"; engine: {opts.engine.shown}" if opts.engine.external else ""
    echo(f"== {t.name} ({t.ranks} rank(s), {'stateful' if t.lined else 'paged'}, rows {t.widest}{staged}{under})")
    t0 = time.monotonic()
    began = round(t0 - opts.started, 1)  # where this target sits on the gate's timeline
    oracle, runner = oracles_for(t, reference, opts.out, opts.backend, opts.reference_worker,
                              None if opts.kern is not None else opts.hosts, opts.kern_test_timeout, opts.kern)
    prober = oracle.prober
    if prober is not None:  # its device and kernels made now, off the first near-tie's path
        threading.Thread(target=prober.warm, name=f"{t.name}:probe-warm", daemon=True).start()
    checks = Checks(wanted, echo=echo, engine=opts.engine)
    run = Run(t, opts, oracle, runner, checks, echo=echo)
    try:
        unavailable = run_target(run, steps, opts.at_once)
    finally:
        oracle.close()
    wall = round(time.monotonic() - t0, 1)
    write_scripts(opts.out, t.name, run.scripts)
    hits = {"served": run.served, "counters": run.session_hits}  # for stages_equal_single (e2e/stages.py)
    if unavailable is not None:
        echo(f"  skipped: {unavailable}")
        return {"target": t.name, "skipped": unavailable, "facts": run.facts, "counters": run.counters,
                "checks": checks.list, "hits": hits, "wall_s": wall, "engine": opts.engine.describe()}
    if t.floats:
        made = prober.made if prober is not None else 0
        per = ", ".join(f"{k} {v}" for k, v in checks.excused.items()) or "none"
        echo(f"  near-ties excused: {sum(checks.excused.values())} ({per}); {made} probes run")
    echo(f"  {t.name}: {wall:.1f}s ({time_split(run.times)})")
    return {"target": t.name, "skipped": None, "facts": run.facts, "counters": run.counters,
            "checks": checks.list, "near_ties": dict(checks.excused), "hits": hits, "wall_s": wall,
            "times": dict(run.times), "cpu": dict(run.cpu), "began_s": began, "engine": opts.engine.describe()}


def engine_of(t: GateTarget, opts: Options) -> Engine:
    """The engine under test for target `t`: ``--engine`` (the gate's, in `opts.engine`), else the
    target's `engine` key, else this checkout's kern (or ``--kern``)."""
    if opts.engine is not None and opts.engine.external:
        return dataclasses.replace(opts.engine, facts=dict(opts.engine.facts))  # each target asks its own
    if t.engine is not None:
        here = str((t.config or Path(".")).resolve().parent)  # {here}: the config's folder
        e = Engine.foreign(t.engine.replace("{here}", here), t.capabilities)
        e.facts.update(t.facts or {})
        e.name = t.engine_name or e.name
        return e
    return Engine.own(opts.kern)


def write_scripts(out: Path, target: str, scripts: dict) -> None:
    """Every session's flags and requests as sent: OUT/<target>/sessions.json (what --shrink reads)."""
    d = out / target
    d.mkdir(parents=True, exist_ok=True)
    (d / "sessions.json").write_text(json.dumps(scripts) + "\n")


def time_split(times: dict[str, float], top: int = 6) -> str:
    """The largest parts of a target's time, ``part 1.2s, ...`` (a session's name: its steps' time)."""
    parts = sorted(times.items(), key=lambda kv: -kv[1])
    text = ", ".join(f"{k} {v:.1f}s" for k, v in parts[:top])
    rest = sum(v for _, v in parts[top:])
    return text + (f", the rest {rest:.1f}s" if rest else "")


def gate_all(chosen: list[GateTarget], opts: Options, ref: Path | None, wanted: set[str] | None, jobs: int) -> list[dict]:
    """Every target, `jobs` at a time; reports in the order chosen, whatever order they finish in."""
    if jobs == 1 or len(chosen) < 2:
        return [gate_target(t, opts, ref, wanted) for t in chosen]

    def one(i: int, t: GateTarget) -> dict:
        def echo(line: str) -> None:
            opts.say(f"[{t.name}] {line.lstrip()}")

        # fixed ports: each target its own block of session ports
        o = opts if opts.port == 0 else dataclasses.replace(opts, port=opts.port + i * SESSIONS)
        return gate_target(t, o, ref, wanted, echo)

    ex = concurrent.futures.ThreadPoolExecutor(jobs)
    try:
        return list(ex.map(one, range(len(chosen)), chosen))
    except BaseException:
        stop_all()  # the workers' servers go first, so the workers fail fast instead of gating on
        ex.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        ex.shutdown(wait=True)

