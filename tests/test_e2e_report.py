"""The gate's written outputs: summary.md's header and failure reasons, and docs/checks.md covering
every check name the gate can emit."""

from __future__ import annotations

import re
from pathlib import Path

from e2e.report import commit, summary_text, write_summary
from e2e.scenarios import CHECKS, POLICY_CHECKS, STEPS

ROOT = Path(__file__).resolve().parents[1]
CHECKS_DOC = ROOT / "docs" / "checks.md"


def emitted() -> set[str]:
    """Every check name the gate can record: the registry, plus `error` (recorded by the gate itself)."""
    return set(CHECKS) | {"error"}


def literal_names() -> set[str]:
    """Check names recorded by literal anywhere in e2e/ (``checks.add("name", ...)``)."""
    names: set[str] = set()
    for path in (ROOT / "e2e").rglob("*.py"):
        names.update(re.findall(r"checks\.add\(\s*\"([a-z0-9_]+)\"", path.read_text()))
    return names


def documented() -> set[str]:
    """Names in backticks on a heading line or in a table row of docs/checks.md."""
    out: set[str] = set()
    for line in CHECKS_DOC.read_text().splitlines():
        if line.startswith("#") or line.startswith("|"):
            out.update(re.findall(r"`([a-z0-9_]+)`", line))
    return out


def test_the_registry_holds_every_literal_check_name():
    # a scenario that records a check its Step does not declare would escape --scenarios and the docs
    missing = literal_names() - emitted()
    assert not missing, f"checks recorded in e2e/ but not in e2e.scenarios.CHECKS: {sorted(missing)}"


def test_every_policy_session_has_a_check():
    sessions = {s.session for s in STEPS if s.session}
    assert set(POLICY_CHECKS) == {f"policy_{s}" for s in sessions}


def test_every_check_is_documented():
    missing = sorted(emitted() - documented())
    assert not missing, f"docs/checks.md has no heading or table entry for: {', '.join(missing)}"


def _reports() -> list[dict]:
    return [
        {"target": "toy-paged", "skipped": None, "facts": {"default": {"backend": "cpu", "page": 16}},
         "checks": [{"name": "conc1_equals_run", "ok": True, "note": "12/12 identical"},
                    {"name": "rows1_vs_spec", "ok": None, "note": "3/4 identical to the 4-row answers"},
                    {"name": "park_wake", "ok": False, "note": "parks 0 | wakes 0; turn 2 again: 4/4 identical"},
                    {"name": "error", "ok": False,
                     "note": "ServerExited: server host exited with code 101 (scheduler crashed)\nlog tail: ```boom```"}],
         "wall_s": 12.5},
        {"target": "toy-big", "skipped": "port 18060 in use", "facts": {}, "checks": [], "wall_s": 0.0},
    ]


def test_summary_names_each_failed_checks_reason(tmp_path):
    meta = {"commit": "0123456789abcdef0123456789abcdef01234567", "backend": "auto", "max_tokens": 64, "wall_s": 83.25}
    text, code = write_summary(tmp_path, _reports(), meta)
    written = (tmp_path / "summary.md").read_text()
    assert written == text + "\n" and code == 1
    head = written.split("| target |")[0]
    assert "commit: 0123456789abcdef0123456789abcdef01234567" in head
    assert "backend: auto (servers ran: cpu)" in head
    assert "max tokens: 64" in head and "wall time: 83.2 s" in head
    assert "| toy-paged | 3 gated, 1 reported | FAIL: park_wake, error |" in written
    assert "| toy-big | — | skipped: port 18060 in use |" in written
    # each failed check's reason, verbatim; passing and reported checks' notes are not repeated
    assert "### toy-paged: park_wake" in written and "parks 0 | wakes 0; turn 2 again" in written
    assert "### toy-paged: error" in written and "exited with code 101 (scheduler crashed)\nlog tail" in written
    assert "````text\nServerExited" in written  # a fence longer than the note's own backticks
    assert "12/12 identical" not in written and "3/4 identical" not in written


def test_summary_of_a_passing_run_has_no_failures_section(tmp_path):
    reports = [{"target": "t", "skipped": None, "facts": {"default": {"backend": "gpu"}},
                "checks": [{"name": "abort", "ok": True, "note": "nothing leaked"}], "wall_s": 2.0}]
    text, code = summary_text(reports, {"backend": "gpu"})
    assert code == 0 and "Failed checks" not in text
    assert "- harness commit: unknown" in text and "- engine under test: kern (this checkout)" in text
    assert "- backend: gpu\n" in text
    assert "wall time: 2.0 s" in text  # without a gate-wide wall time: the targets' sum


def test_commit(tmp_path):
    assert commit(tmp_path) == "unknown"  # not a checkout
    sha = commit()
    assert sha == "unknown" or re.fullmatch(r"[0-9a-f]{40}", sha)


def test_summary_says_where_each_targets_time_went():
    """The summary lists each target's parts largest first, with its servers' start and stop summed."""
    reports = [{"target": "toy-x", "skipped": None, "checks": [], "wall_s": 9.0,
                "times": {"kern_test": 1.5, "default": 4.0, "default start": 0.25, "host stop": 0.5}}]
    text, _ = summary_text(reports, {"zygote_warm_s": 1.25})
    line = next(ln for ln in text.splitlines() if ln.startswith("- toy-x"))
    assert line == "- toy-x (9.0 s; servers' start and stop 0.8 s): default 4.0, kern_test 1.5, host stop 0.5, default start 0.2"
    assert "zygote, warm in 1.2 s" in text


def test_the_summary_leads_with_what_the_first_wrong_answer_was_served_from_and_folds_what_did_not_run():
    first = {"label": "warm 3", "cached": 96, "tier": "host", "prompt": "prompt (104 tokens) 'The lighthouse'",
             "divergence": "first differs at token 0 (got 8 tokens, want 8): got [1] want [2]"}
    unrun = [{"name": n, "ok": False, "note": "not run: step conc1: its step did not complete", "error": True}
             for n in ("repeat_hit", "turn2_hit", "turn2_warm_equals_run", "concurrent", "policy_default")]
    unrun += [{"name": "park_wake", "ok": False, "note": "not run: step host_cold: it needs turn2", "error": True}]
    checks = [{"name": "prefix_cold_warm_restored", "ok": False, "note": "240 requests; warm 31/32 identical; ...",
               "first": first}, *unrun]
    text, _ = summary_text([{"target": "toy-paged", "skipped": None, "checks": checks, "wall_s": 1.0,
                             "case": "/o/toy-paged/case_toy_paged_prefix.json"}])
    assert text.splitlines()[2] == ("**First failure: toy-paged: prefix_cold_warm_restored**: warm 3 was served from "
                                    "cached_tokens 96, tier host: first differs at token 0 (got 8 tokens, want 8): "
                                    "got [1] want [2]; its prompt (104 tokens) 'The lighthouse'")
    assert "- shrunk case of toy-paged: `/o/toy-paged/case_toy_paged_prefix.json`" in text
    body = text.split("### Not run", 1)[1]
    assert body.strip().splitlines() == [
        "- toy-paged, session default: 5 not run (repeat_hit, turn2_hit, turn2_warm_equals_run, concurrent, "
        "policy_default): step conc1: its step did not complete",
        "- toy-paged, session host: 1 not run (park_wake): step host_cold: it needs turn2"]
    assert "### toy-paged: repeat_hit" not in text


def test_failures_lead_with_the_first_cause_and_say_where_to_look():
    # the order a reader needs: verdicts, then the crash, then what it left unrun; each with its log and command
    checks = [{"name": "abort", "ok": False, "note": "not run: step abort: Hung in this step", "error": True},
              {"name": "error", "ok": False, "note": "Hung: request req-3 ...", "error": True},
              {"name": "conc1_equals_run", "ok": False, "note": "11/12 identical; prompt 2: first differs at token 0"},
              {"name": "repeat_hit", "ok": True, "note": "cached [96]"}]
    reports = [{"target": "toy-paged", "skipped": None, "checks": checks, "wall_s": 1.0}]
    text, code = summary_text(reports, {"out": "/tmp/r", "seed": 7, "max_tokens": 16, "backend": "cpu",
                                        "engine": "python e.py --port {port}"})
    assert code == 1
    assert text.splitlines()[2] == "**First failure: toy-paged: conc1_equals_run**: 11/12 identical; prompt 2: first differs at token 0"
    body = text.split("## Failed checks", 1)[1]
    order = [body.index(f"### {n}") for n in ("toy-paged: conc1_equals_run", "toy-paged: error", "Not run")]
    assert order == sorted(order)
    assert "- toy-paged, session default: 1 not run (abort): step abort: Hung in this step" in body
    assert ("server log: `/tmp/r/toy-paged/server-default.log`; reproduce: `e2e --targets toy-paged --scenarios "
            "conc1_equals_run --engine 'python e.py --port {port}' --backend cpu --seed 7 --max-tokens 16`") in body
    assert "reproduce: `e2e --targets toy-paged --scenarios error" not in body  # an error is no check to select
