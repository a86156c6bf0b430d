"""A target's steps in lanes (`run_target`): one lane per session, each step after the steps it needs
(`_Plan`: one `concurrent.futures.Future` per step, its typed result or why it did not complete, shared
by the lanes), the lanes at once on daemon threads; a lane whose step fails records why and the steps
after it are reported not run."""

from __future__ import annotations


import threading
import time
import traceback
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.results import Opened
from e2e.session import (ServerExited, Unavailable)
from kern.errors import KernError
from e2e.gate import Run, _let_go
from e2e.scenarios import fresh_lacking, step_lacking

__all__ = ["lanes", "run_target"]


def lanes(steps: list, at_once: bool = True) -> list[list]:
    """The steps split into lanes, in plan order: one per session (its steps in order) and one per
    step without a session (`kern_test`, `run_equals_reference`); with `at_once` False, one lane."""
    if not at_once:
        return [list(steps)] if steps else []
    out: list[list] = []
    by_session: dict[str, list] = {}
    for step in steps:
        if step.session is None:
            out.append([step])
        elif step.session in by_session:
            by_session[step.session].append(step)
        else:
            by_session[step.session] = [step]
            out.append(by_session[step.session])
    return out


class _DepFailed(KernError):
    """A step this lane needs did not complete (its lane recorded why): the lane stops quietly."""


class _NotRun(KernError):
    """Why a step did not complete (failed, never reached, or skipped): its future's exception."""


class _Lacking(_NotRun):
    """A step skipped because the engine under test lacks `lacks` (docs/engine-contract.md)."""

    def __init__(self, why: str, lacks: list[str]) -> None:
        super().__init__(why)
        self.lacks = lacks


@dataclass
class _Plan:
    """What the lanes of one target share: one future per step (its typed result, e2e/results.py, or
    None; else a `_NotRun` saying why, a `_Lacking` when the engine lacks what it needs), the first
    session's start (its `Opened`, or None: the facts every other session's flags read), and whether
    the target is stopping. Each future is set once, by the lane of its step."""
    base_lane: int | None
    needs: dict[str, tuple[str, ...]]  # each step's deps, direct and through them
    ends: dict[str, Future]  # each step's end
    base: Future = field(default_factory=Future)  # the first session's start
    stopping: bool = False
    unavailable: str | None = None
    errors: list[str] = field(default_factory=list)

    def wait(self, deps: tuple[str, ...]) -> None:
        """Until each of `deps` ended; `_DepFailed` naming the first that did not complete."""
        for d in deps:
            try:
                self.ends[d].result()
            except _NotRun:
                raise _DepFailed(d) from None

    def given(self, name: str) -> dict[type, Any]:
        """The results step `name` may read: those its deps (direct and through them) gave, by type."""
        done = (self.ends[d] for d in self.needs.get(name, ()))
        found = (f.result() for f in done if f.done() and f.exception() is None)
        return {type(r): r for r in found if r is not None}

    def complete(self, name: str, result: Any) -> None:
        self.ends[name].set_result(result)

    def fail(self, name: str, why: str, lacks: list[str] | None = None) -> None:
        self.ends[name].set_exception(_Lacking(why, lacks) if lacks else _NotRun(why))

    def started(self, opened: Opened | None) -> None:
        """The first session's start is known (None: it never started), told once."""
        if not self.base.done():
            self.base.set_result(opened)

    def lacked(self, name: str) -> list[str]:
        """What the engine lacks for step `name`, if it was skipped for it (once the step ended)."""
        exc = self.ends[name].exception()
        return exc.lacks if isinstance(exc, _Lacking) else []

    def lacked_deps(self, deps: tuple[str, ...]) -> list[str]:
        """What the engine lacks for a step these deps need, if one of them was skipped for it."""
        return next((lacks for lacks in map(self.lacked, deps) if lacks), [])


def run_target(run: Run, steps: list, at_once: bool = True) -> str | None:
    """Every step, each lane (`lanes`) in its own thread: a session's server starts as soon as the
    first session's facts are known and its steps wait for the steps they depend on. Lanes that
    share nothing run at once, so the target takes its longest chain, not the sum. Returns why the
    target could not run (a reason outside the commit: `Unavailable`), else None. Checks and served
    answers come back in lane order, whatever order the lanes finish in."""
    split = lanes(steps, at_once)
    first = next((i for i, lane in enumerate(split) if any(st.session for st in lane)), None)
    plan = _Plan(first, _needs(steps), {st.name: Future() for st in steps})
    if first is None:
        plan.started(None)
    views = [run.lane() for _ in split]
    # daemon threads, not a ThreadPoolExecutor: its workers are joined at exit, so after Ctrl-C the
    # process would wait for every running step to end
    threads = [threading.Thread(target=_run_lane, args=(v, lane, plan, i), daemon=True,
                                name=f"{run.target.name}:{lane[0].session or lane[0].name}")
               for i, (v, lane) in enumerate(zip(views, split))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # short joins: Ctrl-C reaches this thread
    except BaseException:
        plan.stopping = True
        raise
    for v in views:
        run.fold(v)
    if plan.unavailable is not None:
        return plan.unavailable
    if plan.errors:
        run.checks.add("error", False, "; ".join(plan.errors)[:2000])
    _unjudged(run, steps, plan)
    return None


def _needs(steps: list) -> dict[str, tuple[str, ...]]:
    """Each step's deps in the plan, direct and through them, in plan order."""
    names = [st.name for st in steps]
    direct = {st.name: {d for d in st.deps if d in names} for st in steps}
    out: dict[str, tuple[str, ...]] = {}
    for st in steps:  # plan order: a dep's own needs are known before the step's
        seen = set(direct[st.name])
        for d in direct[st.name]:
            seen.update(out.get(d, ()))
        out[st.name] = tuple(n for n in names if n in seen)
    return out


def _unjudged(run: Run, steps: list, plan: _Plan) -> None:
    """Every check a step that did not complete should have added, and every session's policy check
    that was never judged, recorded as ``error`` with why (never dropped from the report)."""
    sessions: dict[str, str] = {}
    lacked: dict[str, list[str]] = {}
    for st in steps:
        lacks = plan.lacked(st.name)  # skipped for what the engine lacks: its checks say so already
        if not lacks:
            lacks = _step_lacks(run, st, plan, ())
            for name in st.checks if lacks else ():  # never reached, and the engine could not have run it anyway
                run.checks.skip(name, lacks)
        if lacks:
            if st.session:
                lacked.setdefault(st.session, lacks)
            continue
        failed = plan.ends[st.name].exception()
        if failed is not None:
            why = str(failed) or "its step did not complete"
            for name in st.checks:
                run.checks.could_not_run(name, f"step {st.name}: {why}")
            if st.session and not sessions.get(st.session):  # the session's first step that failed says why
                sessions[st.session] = f"its session ended at step {st.name}: {why}"
        elif st.session and st.serial:
            sessions.setdefault(st.session, "")
    for session, why in sessions.items():
        for kind in ("policy", "metrics"):
            run.checks.could_not_run(f"{kind}_{session}", why or f"the session's {kind} check was never judged")
    for session, lacks in lacked.items():
        if session not in sessions:  # every step of it skipped: so are its policy and metrics checks
            for kind in ("policy", "metrics"):
                run.checks.skip(f"{kind}_{session}", lacks)


def _run_lane(run: Run, steps: list, plan: _Plan, index: int) -> None:
    """One lane's steps in order (`run` is the lane's view): open each step's session when it first
    needs one, wait for the step's dependencies, run it. An error ends the lane with its note in
    `plan.errors`; steps that never completed are ended as failed, so lanes needing them stop."""
    def spent(part: str, since: float) -> float:
        now = time.monotonic()
        run.times[part] = round(run.times.get(part, 0.0) + now - since, 2)
        return now

    done = 0
    why = "the target stopped before it"
    lane_key = f"{run.target.name}/{steps[0].session or steps[0].name}" if steps else run.target.name
    try:
        if index != plan.base_lane and any(st.facts for st in steps):
            run.take(plan.base.result())  # every session's flags read the first session's facts
        for step in steps:
            if plan.stopping:
                raise _DepFailed("the target is stopping")
            _one_step(run, step, plan, index == plan.base_lane, lane_key, spent)
            done += 1
        t0 = time.monotonic()
        name = run.live.session.name if run.live is not None else None
        run.close()
        if name is not None:
            spent(f"{name} stop", t0)
    except _DepFailed as exc:
        why = f"it needs {exc}, which did not complete"
        _drop(run)
    except Unavailable as exc:
        plan.unavailable = plan.unavailable or str(exc)
        plan.stopping = True
        _drop(run)
    except Exception as exc:  # any failure ends the lane, and the target has a gated error
        plan.errors.append(_error_note(run, exc))
        why = f"{type(exc).__name__} in this step (the error check has its note)"
        if not isinstance(exc, ServerExited):
            try:
                run.policy_check()
            except Exception:  # the error above is the news; a policy check that cannot be read is not
                pass
        _drop(run)
    finally:
        if run.opts.progress is not None:
            run.opts.progress.done(lane_key)
        if index == plan.base_lane:
            plan.started(None)
        for i, step in enumerate(steps[done:]):
            plan.fail(step.name, why if i == 0 else f"{steps[done].name} before it in its session failed")


def _one_step(run: Run, step, plan: _Plan, base: bool, key: str, spent) -> None:
    """One step of a lane: skipped if the engine lacks what it needs; else its session opened (its flags
    given what its deps gave; on the `base` lane, the start told to the others), its deps waited for,
    run, and its result handed to the plan for the steps that depend on it."""
    deps = tuple(d for d in step.deps if d in plan.ends)
    lacks = _step_lacks(run, step, plan, deps)
    if lacks:  # docs/engine-contract.md: its checks are skipped, never run half-way or failed
        for name in step.checks:
            run.checks.skip(name, lacks)
        plan.fail(step.name, f"the engine lacks {', '.join(lacks)}", lacks)
        return
    run.step, run.results = step.name, {}
    if step.session is not None and (run.live is None or run.live.session.name != step.session):
        if not step.early:
            plan.wait(deps)  # its flags may read what they find (answer lengths, ...)
            run.results = plan.given(step.name)
        _busy(run, key, f"starting the {step.session} session's server")
        opened = None
        try:
            _switch(run, step, spent)
            opened = run.opened(step.session) if base else None
        finally:
            if base:
                plan.started(opened)
    plan.wait(deps)
    t0 = time.monotonic()
    _busy(run, key, f"step {step.name}")
    run.serial, run.results = step.serial, plan.given(step.name)
    if not step.serial and step.session is not None:
        run.unserial.add(step.session)
    result = step.run(run)
    if run.live is not None and run.live.policy is not None and run.live.policy.active:
        run.live.policy.compare(step.name, run.live.client.stats())
    spent(step.session or step.name, t0)
    plan.complete(step.name, result)


def _switch(run: Run, step, spent) -> None:
    """Close the lane's open session (if another) and open `step`'s, each timed."""
    t0 = time.monotonic()
    if run.live is not None:
        name = run.live.session.name
        run.close()
        t0 = spent(f"{name} stop", t0)
    run.open(step.session, step.flags(run) if step.flags else [], step.cache(run) if step.cache else None)
    spent(f"{step.session} start", t0)


def _error_note(run: Run, exc: Exception) -> str:
    """What the error check says of an exception that ended a lane: its type and message, the innermost
    frame of ours (where a bisect should look), and the server's exit and log tail if it died."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "site-packages" not in f.filename] or frames
    where = ours[-1]
    note = f"{type(exc).__name__}: {exc} (at {Path(where.filename).name}:{where.lineno} in {where.name})"
    if run.live is not None and not isinstance(exc, ServerExited):
        s = run.live.session
        if not s.alive() and s.proc is not None:
            note += f" (server {s.name} exited with code {s.proc.returncode}; log tail: {s.log.tail(8)})"
    return note


def _busy(run: Run, key: str, what: str) -> None:
    if run.opts.progress is not None:
        run.opts.progress.busy(key, what)


def _step_lacks(run: Run, step, plan: _Plan, deps: tuple[str, ...]) -> list[str]:
    """The capabilities the engine under test lacks for `step` to run: its own (its row's `runs`), or a skipped
    dependency's. Only an engine under the contract lacks any, so only its lanes wait on deps here."""
    e = run.opts.engine
    if not e.external and e.has("kern-runtime"):
        return []
    return step_lacking(e, step.name) or (plan.lacked_deps(deps) if e.external else []) or fresh_lacking(e, step)


def _drop(run: Run) -> None:
    """Stop the lane's open session without its closing checks."""
    live, run.live = run.live, None
    if live is not None:
        _let_go(live)
        live.session.stop()
        run.note_cpu(live.session)

