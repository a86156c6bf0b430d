"""`e2e --shrink` and `e2e --replay-case`: a failed check's session shrunk to a small case that still
fails (replayed `CONFIRM` times more), and a case replayed against the engine it records."""

from __future__ import annotations


import dataclasses
import json
from pathlib import Path
from typing import Callable

import click

from e2e.config import ConfigError
from e2e.gate import Options
from e2e.scenarios import session_of
from e2e.session import merge_flags, split_flags
from manifests.config import PACKAGED, PACKAGED_PP

from e2e.driver import _names
from e2e.spawners import on_the_cpu

CONFIRM = 3  # a shrunk case is replayed this many times more, and its notes say how often it failed


TIMED_TRIES = 3  # a candidate with a burst (its failure may hang on timing) still fails only if it fails each try


def shrink_failures(reports: list[dict], opts: Options, echo: Callable[[str], None] = click.echo) -> dict[str, Path]:
    """`--shrink`: each failed target's first failed check, its session replayed against the engine that
    failed and shrunk to a case that records that engine; {target: the case file written}."""
    written = {}
    for r in reports:
        failed = [c["name"] for c in r.get("checks", []) if c["ok"] is False and c["name"] != "error"
                  and not c.get("error")]
        if r.get("skipped") is not None or not failed:
            continue
        if opts.progress is not None:
            opts.progress.busy(f"shrink {r['target']}", f"shrinking {failed[0]}: one replay per line below")
        try:
            path = _shrink_one(r, failed[0], opts, echo)
        finally:
            if opts.progress is not None:
                opts.progress.done(f"shrink {r['target']}")
        if path is not None:
            written[r["target"]] = path
    return written


def _case_of(r: dict, check: str, opts: Options):
    """The failed session of report `r` as a case: its requests, the flags its server had, the engine
    that served it (`Engine.describe`, None for this checkout's kern), the config and the gate's flags."""
    from e2e.case import Case

    session = session_of(check)
    scripts = json.loads((opts.out / r["target"] / "sessions.json").read_text())
    if session not in scripts:
        return None
    s = scripts[session]
    flags = merge_flags(split_flags(opts.server_flags), split_flags(s["flags"]))  # the case carries both
    about = r.get("engine") or {}
    packaged = opts.config.resolve() in (PACKAGED.resolve(), PACKAGED_PP.resolve())
    gate = {"backend": "cpu" if on_the_cpu(opts.backend) else opts.backend, "capacity": opts.capacity,
            "load_timeout": opts.load_timeout, "server_flags": opts.server_flags}
    return Case(r["target"], session, check, flags, s["requests"], opts.seed, opts.max_tokens,
                engine=about if about.get("command") else None, config=None if packaged else str(opts.config),
                gate=gate)


def _shrink_one(r: dict, check: str, opts: Options, echo: Callable[[str], None]) -> Path | None:
    """Shrink report `r`'s failed `check` to a case file (None: nothing to shrink, or it did not fail again)."""
    from e2e.case import Case, kind_of, replay, replay_run, shrink, write

    case = _case_of(r, check, opts)
    if case is None:
        echo(f"shrink {r['target']}: {check} belongs to no recorded session; nothing to shrink")
        return None
    want = kind_of(check, case.session)
    tmp = opts.out / r["target"] / "shrink"

    def once(c: Case) -> bool:
        run = replay_run(c, tmp)
        if not run.opts.engine.external:  # this checkout's kern: the gate's zygote or hosts start it
            run.opts = dataclasses.replace(opts, out=tmp)
        try:
            got = replay(c, run)
        finally:
            run.oracle.close()
        return want in got or "error" in got

    def fails(c: Case) -> bool:  # a case with a burst fails by timing too: it must fail every one of its tries
        timed = any(q["kind"] == "burst" for q in c.requests)
        return all(once(c) for _ in range(TIMED_TRIES if timed else 1))

    under = f" against `{case.engine['command']}`" if case.engine else ""
    echo(f"shrink {r['target']}: {check} in session {case.session}: {case.size()[0]} requests{under}")
    if not fails(case):
        echo(f"shrink {r['target']}: the session's replay passes ({check} may need another session, or "
             "timing); no case written")
        return None
    small = shrink(case, fails, echo)
    again = sum(once(small) for _ in range(CONFIRM))  # a burst's failure may hang on timing: say how often
    small.notes.append(f"shrunk from {case.size()[0]} requests ({case.size()[1]} prompt tokens) by e2e --shrink; "
                       f"replayed {CONFIRM} times more, it failed {again}")
    path, test = write(small, opts.out / r["target"])
    n, p, m = small.size()
    echo(f"shrink {r['target']}: {n} request(s), {p} prompt tokens, {m} answer tokens (failed {again} of "
         f"{CONFIRM} replays more): {path} (pytest: {test}; replay: e2e --replay-case {path})")
    return path


def replay_case(path: str, backend: str, out: Path, engine: str | None = None, capabilities: str | None = None) -> int:
    """`--replay-case FILE`: 0 when the case passes, 1 when it fails, 2 when it is no case. The case's own
    engine is started (its recorded command); `engine` (``--engine`` at the replay) stands in for it."""
    from e2e.case import Case, replay, replay_run

    caps = _names((capabilities,)) if capabilities is not None else None
    try:
        case = Case.load(path)
        run = replay_run(case, out / "replay", None if backend == "auto" else backend, engine, caps,
                         echo=click.echo)
    except (ValueError, ConfigError) as exc:  # EngineError is a ValueError
        raise click.UsageError(str(exc)) from None
    under = run.opts.engine.command if run.opts.engine.external else "kern (this checkout)"
    click.echo(f"case {path}: replaying {case.check} of {case.target} against {under}")
    try:
        failed = replay(case, run)
    finally:
        run.oracle.close()
    n, p, m = case.size()
    click.echo(f"case {path}: {case.target}, session {case.session}, {n} request(s), {p} prompt tokens: "
               + ("pass" if not failed else f"FAIL: {', '.join(failed)}"))
    return 1 if failed else 0

