"""The gate's lanes (`e2e.lanes.run_target`): a target's sessions at once, each step after its deps.

Steps here have no server (session None: each its own lane) or fake sessions that only `lanes`
groups, so these run in milliseconds; the gate over real servers is `e2e` itself (CI runs it).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

from e2e.checks import Checks
from e2e.config import load_targets
from e2e.gate import Options, Run
from e2e.lanes import lanes, run_target
from e2e.scenarios import STEPS, Step, plan


def _run(tmp_path: Path) -> Run:
    cfg, (t,) = load_targets(None, ["toy-paged"])
    return Run(t, Options(cfg, tmp_path), None, None, Checks(echo=lambda line: None))


def test_lanes_group_each_session_and_keep_sessionless_steps_apart():
    """Property: every step lands in exactly one lane; a lane holds one session's steps in plan
    order, or one step without a session; lanes come in the order of their first step."""
    cfg, targets = load_targets(None, None)
    for t in targets:
        steps = plan(t, None, True)
        split = lanes(steps)
        assert sorted(s.name for lane in split for s in lane) == sorted(s.name for s in steps)
        for lane in split:
            sessions = {s.session for s in lane}
            assert len(sessions) == 1 and (None not in sessions or len(lane) == 1)
            assert [steps.index(s) for s in lane] == sorted(steps.index(s) for s in lane)
        firsts = [steps.index(lane[0]) for lane in split]
        assert firsts == sorted(firsts)
        assert lanes(steps, at_once=False) == [steps]


def _steps(n: int, seed: int, log: list, fail: set[str]) -> list[Step]:
    """`n` sessionless steps with random earlier deps; each sleeps a little, records when it ran and
    adds its check; those named in `fail` raise."""
    rng = random.Random(seed)
    lock = threading.Lock()
    out = []
    for i in range(n):
        name = f"s{i}"
        deps = tuple(sorted({f"s{rng.randrange(i)}" for _ in range(rng.randrange(3))})) if i else ()

        def body(r, name=name):
            with lock:
                log.append(("start", name, time.monotonic()))
            time.sleep(rng.random() * 0.02)
            if name in fail:
                raise RuntimeError(f"{name} broke")
            r.checks.add(name, True, "ran")
            with lock:
                log.append(("end", name, time.monotonic()))

        out.append(Step(name, None, (name,), deps, body, facts=False))
    return out


def test_every_step_runs_after_its_deps_and_checks_come_back_in_plan_order(tmp_path):
    """Property (seeded random DAGs): a step starts only after each of its deps ended; every step
    runs once; the checks come back in plan order whatever order the lanes finished in."""
    for seed in range(20):
        log: list = []
        steps = _steps(12, seed, log, set())
        r = _run(tmp_path)
        assert run_target(r, steps) is None
        ends = {name: t for kind, name, t in log if kind == "end"}
        starts = {name: t for kind, name, t in log if kind == "start"}
        assert set(starts) == set(ends) == {s.name for s in steps}
        for s in steps:
            for d in s.deps:
                assert ends[d] <= starts[s.name], (seed, s.name, d)
        assert [c["name"] for c in r.checks.list] == [s.name for s in steps]


def test_a_failed_step_is_one_error_and_what_needs_it_never_runs(tmp_path):
    """Property: the steps depending (transitively) on a failed one never run; the others all do;
    the target gets a single gated ``error`` check naming the failure."""
    for seed in range(20):
        log: list = []
        steps = _steps(12, seed, log, {"s3"})
        r = _run(tmp_path)
        assert run_target(r, steps) is None
        needs = {"s3"}
        for s in steps:
            if set(s.deps) & needs:
                needs.add(s.name)
        ran = {name for kind, name, _ in log if kind == "end"}
        assert ran == {s.name for s in steps} - needs, seed
        errors = [c for c in r.checks.list if c["name"] == "error"]
        assert len(errors) == 1 and errors[0]["ok"] is False and "s3 broke" in errors[0]["note"]


def test_independent_steps_overlap(tmp_path):
    """Two steps with no deps between them run at once: the second starts before the first ends
    (each waits for the other to have started, so this cannot pass one after the other)."""
    both = threading.Barrier(2, timeout=10)

    def body(r):
        both.wait()  # raises BrokenBarrierError if the other never starts while this one runs
        r.checks.add(r.step, True, "met")

    steps = [Step("a", None, ("a",), (), body, facts=False), Step("b", None, ("b",), (), body, facts=False)]
    r = _run(tmp_path)
    run_target(r, steps)
    assert [(c["name"], c["ok"]) for c in r.checks.list] == [("a", True), ("b", True)]
    r = _run(tmp_path)
    both.reset()
    steps_in_turn = [Step("a", None, ("a",), (), lambda r: both.wait(timeout=0.2), facts=False)]
    run_target(r, steps_in_turn, at_once=False)
    # alone in its turn, the barrier breaks: the error, and its step's check as not run (never dropped)
    assert [(c["name"], c.get("error", False)) for c in r.checks.list] == [("error", False), ("a", True)]


def test_the_packaged_steps_declare_what_their_sessions_read():
    """The steps whose servers start early (`early`) have flags that read nothing of the run: called
    without one they still give their flags (a flags function reading the run raises here)."""
    early = [s for s in STEPS if s.early]
    assert early
    for s in early:
        assert s.flags is not None and isinstance(s.flags(None), list) and s.flags(None)


def test_a_result_reaches_the_steps_that_depend_on_it_and_no_other(tmp_path):
    """Typed step results (e2e/results.py): a step's result is handed to the steps depending on it,
    directly or through another, whatever lane they run in; a step that does not depend on it and
    reads it fails with an error naming the step and the result, and never sees it."""
    from dataclasses import dataclass

    from e2e.gate import MissingResult

    @dataclass(frozen=True)
    class Given:
        n: int

    seen: dict[str, object] = {}

    def give(r):
        return Given(7)

    def read(r):
        try:
            seen[r.step] = r.got(Given).n
        except MissingResult as exc:
            seen[r.step] = str(exc)
            raise
        r.checks.add(r.step, True, "read")

    steps = [Step("a", None, ("a",), (), give, facts=False),
             Step("b", None, ("b",), ("a",), read, facts=False),
             Step("c", None, ("c",), ("b",), read, facts=False),  # through b
             Step("d", None, ("d",), (), read, facts=False)]  # no dependency on a
    for at_once in (True, False):
        seen.clear()
        r = _run(tmp_path)
        assert run_target(r, steps, at_once) is None
        assert seen["b"] == 7 and seen["c"] == 7, seen
        assert "step d reads Given, which no step it depends on gave" in seen["d"], seen
        errors = [c for c in r.checks.list if c["name"] == "error"]
        assert len(errors) == 1 and "MissingResult" in errors[0]["note"], errors


def test_the_lanes_share_nothing_but_the_plan(tmp_path):
    """Each lane writes only its own view (facts, counters, times): what the target reports is the
    lanes' folded in plan order once they all ended, never a dict two lanes wrote at once."""
    def body(r):
        r.counters[r.step] = {"n": 1}
        r.times[r.step] = 0.5
        r.checks.add(r.step, True, "ran")

    steps = [Step(f"s{i}", None, (f"s{i}",), (), body, facts=False) for i in range(6)]
    r = _run(tmp_path)
    views: list = []
    real = Run.lane

    def lane(self):
        v = real(self)
        views.append(v)
        return v

    Run.lane = lane
    try:
        assert run_target(r, steps) is None
    finally:
        Run.lane = real
    assert len(views) == 6
    for v in views:
        assert v.counters is not r.counters and v.times is not r.times and v.facts is not r.facts
        assert len(v.counters) == 1
    assert list(r.counters) == [s.name for s in steps]
    assert r.times == {s.name: 0.5 for s in steps}


def test_a_step_whose_dependency_failed_is_reported_not_run_naming_it(tmp_path):
    """A failed step's dependents are never run and never dropped: each of their checks is a gated
    ``not run`` naming the step it needed (directly: the failed one; through another: that other)."""
    ran: list[str] = []

    def body(r):
        ran.append(r.step)
        if r.step == "a":
            raise RuntimeError("a broke")
        r.checks.add(r.step, True, "ran")

    steps = [Step(n, None, (n,), deps, body, facts=False)
             for n, deps in (("a", ()), ("b", ("a",)), ("c", ("b",)), ("d", ()))]
    for at_once, after in ((True, {"b": "it needs a, which did not complete",
                                   "c": "it needs b, which did not complete"}),
                           (False, {"b": "a before it in its session failed",
                                    "c": "a before it in its session failed",
                                    "d": "a before it in its session failed"})):
        ran.clear()
        r = _run(tmp_path)
        assert run_target(r, steps, at_once) is None
        got = {c["name"]: c for c in r.checks.list}
        assert sorted(ran) == (["a", "d"] if at_once else ["a"]), ran
        assert got["a"]["note"] == "not run: step a: RuntimeError in this step (the error check has its note)"
        for name, why in after.items():
            assert (got[name]["ok"], got[name].get("error")) == (False, True), got[name]
            assert got[name]["note"] == f"not run: step {name}: {why}", got[name]
        assert [c["name"] for c in r.checks.list] == (["d", "error", "a", "b", "c"] if at_once
                                                       else ["error", "a", "b", "c", "d"])


def test_a_dependency_skipped_for_what_the_engine_lacks_skips_its_dependents_alike(tmp_path):
    """Under an engine lacking `kern-runtime`, a step that runs only with it is skipped, and so is every
    step depending on it (directly or through another), for the same lack: never run, never failed."""
    from e2e.engine import Engine

    ran: list[str] = []

    def body(r):
        ran.append(r.step)
        r.checks.add(r.step, True, "ran")

    steps = [Step(n, None, (n,), deps, body, facts=False, runs=runs) for n, deps, runs in (
        ("cut_equals_whole", (), ("kern-runtime",)), ("b", ("cut_equals_whole",), ()), ("c", ("b",), ()),
        ("d", (), ()))]
    cfg, (t,) = load_targets(None, ["toy-paged"])
    for at_once in (True, False):
        ran.clear()
        opts = Options(cfg, tmp_path, engine=Engine.foreign("engine --port {port}", []))
        r = Run(t, opts, None, None, Checks(echo=lambda line: None))
        assert run_target(r, steps, at_once) is None
        assert ran == ["d"], ran
        got = {c["name"]: c for c in r.checks.list}
        assert set(got) == {"cut_equals_whole", "b", "c", "d"}, got
        for name in ("cut_equals_whole", "b", "c"):
            assert got[name]["ok"] is None and got[name]["skipped"] == ["kern-runtime"], got[name]
            assert got[name]["note"].startswith("skipped (engine lacks kern-runtime"), got[name]
        assert got["d"]["ok"] is True
