"""The e2e driver against real `kern serve` processes on the CPU, and each fault it must catch.

Every gated check is shown able to fail: the server is started with `--fault NAME` (through
``--server-flags``) and the check that guards that behaviour fails, with exit code 1. Sessions use
ephemeral ports (``--port 0``) and are always torn down.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from e2e.cli import main

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "manifests" / "toy"
EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_NOTHING_RAN = 0, 1, 2, 125


def gate(tmp_path: Path, *args: str, max_tokens: int = 12) -> tuple[int, dict[str, dict]]:
    out = tmp_path / "results"
    argv = ["--out", str(out), "--backend", "cpu", "--port", "0", "--max-tokens", str(max_tokens), *args]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    reports = {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/report.json")}
    return exc.value.code, reports


def checks(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def test_first_come_admission_never_passes_long_beside_short(tmp_path):
    """`--admission fifo` locks the short requests out behind the waiting long one: the check fails
    (or, on a machine so loaded that the shorts reached the core only after a long one ended, is
    reported not judged), never passes."""
    code, reports = gate(tmp_path, "--targets", "toy-paged", "--scenarios", "long_beside_short",
                         "--server-flags", "--admission fifo")
    got = checks(reports["toy-paged"])["long_beside_short"]
    assert got["ok"] is not True, got
    assert code == (1 if got["ok"] is False else EXIT_PASS), (code, got)


def test_passing_gate_on_toy_paged(tmp_path):
    code, reports = gate(tmp_path, "--targets", "toy-paged", "--junit", str(tmp_path / "junit.xml"))
    r = reports["toy-paged"]
    got = checks(r)
    assert code == EXIT_PASS, r["checks"]
    assert set(got) == {"kern_test", "conc1_equals_run", "run_equals_reference", "repeat_hit", "turn2_hit",
                        "turn2_warm_equals_run", "concurrent", "abort", "turn2_warm_equals_cold", "park_wake",
                        "wake_room", "host_churn", "evict_drops", "policy_default", "policy_host", "policy_churn",
                        "policy_drop", "policy_wake_room", "index_ties", "policy_ties", "params_stop", "params_ids",
                        "params_prompt", "policy_params", "explore_equals_run", "policy_explore",
                        "long_beside_short", "policy_long_room", "recency_after_growth", "policy_recency",
                        "split_equals_run", "policy_split",
                        "frontends2_equals_run", "policy_frontends2"} | {
                        f"metrics_{s}" for s in ("default", "host", "churn", "drop", "ties", "wake_room", "params",
                                                 "explore", "long_room", "recency", "blocks", "cold_burst", "tight",
                                                 "split", "frontends2", "freed")} | {
                        "blocks_moved", "blocks_reparented", "block_edges", "stop_after_hit", "cold_prefix_burst",
                        "eviction_proven", "refcount_stress", "preempt_recompute", "policy_blocks", "policy_cold_burst",
                        "policy_tight", "freed_while_read", "policy_freed"}
    at_once = ("policy_long_room", "policy_recency", "policy_split", "policy_frontends2", "policy_freed")
    # long_beside_short is reported, not judged, when the machine is so loaded that every short request
    # reached the core after a long one ended (its note says so); it never fails a good server
    assert all(c["ok"] for name, c in got.items() if name not in at_once + ("long_beside_short",))
    assert got["long_beside_short"]["ok"] in (True, None), got["long_beside_short"]
    assert all(got[n]["ok"] is None for n in at_once)  # their requests run at once: nothing predicted
    assert "cached [96, 80, 96, 64]" in got["repeat_hit"]["note"]
    assert r["counters"]["host"]["parks"] >= 1 and r["facts"]["default"]["page"] == 16
    out = tmp_path / "results"
    assert "| target | checks | result |" in (out / "summary.md").read_text()
    for name in ("server-default.log", "server-host.log", "server-wake_room.log", "kern-test.log", "oracle.json"):
        assert (out / "toy-paged" / name).is_file(), name
    assert 'name="toy-paged"' in (tmp_path / "junit.xml").read_text()


def test_a_server_that_logs_nothing_below_warning_passes_from_its_api_alone(tmp_path):
    """Tiers, wakes, not-kept snapshots, aborts, the port and the facts are read from the API (`kern`,
    /stats): a server writing no line at all below warning (no ready line, no `serving`) passes every
    check of every session (and a server whose API omits its tier fails: the next test)."""
    code, reports = gate(tmp_path, "--targets", "toy-stateful", "--server-flags", "--log-level warn")
    got = checks(reports["toy-stateful"])
    assert code == EXIT_PASS, got
    assert "woken 4" in got["park_wake"]["note"] and "(abort, " in got["abort"]["note"], got
    assert all(c["ok"] for n, c in got.items() if n.startswith("metrics_")) and len(got) > 30, got
    logs = list((tmp_path / "results" / "toy-stateful").glob("server-*.log"))
    assert len(logs) >= 8
    for p in logs:  # the gate's own "$ command" line, and not one line of the server's
        assert [ln for ln in p.read_text().splitlines() if not ln.startswith("$ ")] == [], p


def test_a_quiet_server_whose_kern_object_omits_the_tier_fails(tmp_path):
    """`--fault untold-tier`: the response's kern object has no cache_tier. A server with /stats must
    tell it through the API; its log (here: nothing below warning) cannot stand in: the target fails."""
    code, reports = gate(tmp_path, "--targets", "toy-paged", "--scenarios", "repeat_hit",
                         "--server-flags", "--log-level warn --fault untold-tier")
    got = checks(reports["toy-paged"])
    assert code == EXIT_FAIL, got
    assert got["error"]["ok"] is False and "Untold" in got["error"]["note"], got
    assert "lacks cache_tier" in got["error"]["note"], got


def test_explore_gates_fresh_seeds_and_seed_replays_one(tmp_path, capsys):
    """`--explore 2` gates two fresh seeds' generated sessions, each under its own folder and printed;
    `--seed S` then replays one seed's draws exactly (the same notes, request for request)."""
    code, _ = gate(tmp_path, "--targets", "toy-paged", "--explore", "2")
    out = capsys.readouterr().out
    assert code == EXIT_PASS, out
    seeds = [int(s) for s in re.findall(r"== explore \d/2: seed (\d+)", out)]
    assert len(seeds) == 2 and "explore: 2/2 seeds pass" in out
    first = json.loads((tmp_path / "results" / f"seed-{seeds[0]}" / "toy-paged" / "report.json").read_text())
    assert {c["name"] for c in first["checks"]} >= {"explore_equals_run", "params_stop", "metrics_explore"}
    code, reports = gate(tmp_path / "again", "--targets", "toy-paged", "--seed", str(seeds[0]),
                         "--scenarios", "explore_equals_run", "params_stop")
    again = checks(reports["toy-paged"])
    assert code == EXIT_PASS
    for name in ("explore_equals_run", "params_stop"):
        assert again[name]["note"] == checks(first)[name]["note"], name


def test_params_session_passes_every_request_predicted(tmp_path):
    """The params session on the shipped code, a lined target, a seed of its own: every parameter's
    answer exact, and policy_params predicts every request, the ignore_eos ones past EOS included."""
    names = ("params_stop", "params_ids", "params_prompt", "policy_params", "metrics_params")
    code, reports = gate(tmp_path, "--targets", "toy-stateful", "--seed", "3", "--scenarios", *names)
    got = checks(reports["toy-stateful"])
    assert code == EXIT_PASS, got
    assert set(got) == set(names) and all(c["ok"] for c in got.values())
    for name in names[:3]:
        assert "(seed '3:toy-stateful:params')" in got[name]["note"], got[name]["note"]
    note = got["policy_params"]["note"]
    assert "predictions stopped" not in note and re.match(r"2[5-9] requests and 3 counter reads", note), note


def test_passing_gate_on_a_lined_spec_target(tmp_path):
    code, reports = gate(tmp_path, "--targets", "toy-stateful-spec", "--scenarios", "repeat_hit", "turn2_hit",
                         "turn2_warm_equals_run", "spec_acceptance", "slot_growth", "rows1_equals_run", "wake_room")
    got = checks(reports["toy-stateful-spec"])
    assert code == EXIT_PASS, got
    assert set(got) == {"repeat_hit", "turn2_hit", "turn2_warm_equals_run", "spec_acceptance", "slot_growth",
                        "rows1_equals_run", "wake_room"}
    assert "cached [0, 0, 0, 0]" in got["repeat_hit"]["note"]


# each fault, and the check that catches it

# keep-overshoot needs a first turn whose last round overshoots: at 32 tokens prompt 4's does on
# toy-stateful-spec (its turn 2 then hits a snapshot that folded tokens the client never got)
FAULTS = [
    pytest.param("wrong-token", "toy-paged", ["conc1_equals_run"], "conc1_equals_run", 12, id="wrong-token"),
    pytest.param("no-checkpoint", "toy-paged", ["repeat_hit", "turn2_hit"], "repeat_hit", 12, id="no-checkpoint"),
    pytest.param("no-park", "toy-stateful", ["park_wake"], "park_wake", 12, id="no-park"),
    pytest.param("drop-wake", "toy-paged", ["park_wake"], "park_wake", 12, id="drop-wake"),
    pytest.param("leak-lease", "toy-paged", ["abort"], "abort", 12, id="leak-lease"),
    # a server that never aborts: 3 chunks come all the same, the next answer is right, nothing leaks
    pytest.param("ignore-hang-up", "toy-paged", ["abort"], "abort", 12, id="ignore-hang-up"),
    pytest.param("keep-overshoot", "toy-stateful-spec", ["turn2_warm_equals_run"], "turn2_warm_equals_run", 32,
                 id="keep-overshoot"),
    pytest.param("raise-in-scheduler", "toy-paged", ["conc1_equals_run"], "error", 12, id="raise-in-scheduler"),
    # one at a time it answers right: only the burst's batched steps disturb each other
    pytest.param("wrong-token-batched", "toy-paged", ["conc1_equals_run", "concurrent"], "concurrent", 12,
                 id="wrong-token-batched"),
    # the answers stay right (every drafted row is the greedy token); only the acceptance drops
    pytest.param("reject-drafts", "toy-spec", ["concurrent", "spec_acceptance"], "spec_acceptance", 12,
                 id="reject-drafts"),
    pytest.param("no-remap", "toy-stateful", ["slot_growth"], "slot_growth", 12, id="no-remap"),
    pytest.param("skip-restore-copy", "toy-stateful", ["turn2_warm_equals_run", "turn2_warm_equals_cold"],
                 "turn2_warm_equals_cold", 12, id="skip-restore-copy"),
    # an existing fault shows rows1_equals_run can fail (its server runs plain decode, --rows 1)
    pytest.param("wrong-token", "toy-spec", ["rows1_equals_run"], "rows1_equals_run", 12, id="wrong-token-rows1"),
    # blocks of a hit written after another first block: toy-attn's entries depend on the prefix
    # (toy-paged passes under the same fault: test_foreign_parent_is_invisible_on_toy_paged)
    pytest.param("foreign-parent", "toy-attn", ["repeat_hit", "turn2_warm_equals_run"], "repeat_hit", 12,
                 id="foreign-parent"),
]

# checks that must still pass under the fault: each fault is caught by its own check, not by a
# neighbour (what the note of the failing check says is asserted too)
STILL_PASS = {
    "wrong-token-batched": ["conc1_equals_run"],
    "reject-drafts": ["concurrent"],
}
NOTES = {
    "ignore-hang-up": "ended by counters.aborted +0, not by abort",
    "reject-drafts": "serial 0.0%, burst 0.0%",
    "no-remap": "0 remaps",
}


@pytest.mark.parametrize("fault, target, scenarios, caught, max_tokens", FAULTS)
def test_each_fault_fails_its_check(tmp_path, fault, target, scenarios, caught, max_tokens):
    code, reports = gate(tmp_path, "--targets", target, "--scenarios", *scenarios,
                         "--server-flags", f"--fault {fault}", max_tokens=max_tokens)
    got = checks(reports[target])
    assert code == EXIT_FAIL, got
    assert got[caught]["ok"] is False, got
    for name in STILL_PASS.get(fault, []):
        assert got[name]["ok"] is True, got
    if fault in NOTES:
        assert NOTES[fault] in got[caught]["note"], got
    if fault == "raise-in-scheduler":
        assert "code 101" in got["error"]["note"]
    if fault == "reject-drafts":
        c = reports[target]["counters"]["default"]
        assert c["rounds"] > 0 and c["drafted_rows"] > 0 and c["accepted_rows"] == 0, c
    if fault == "no-remap":
        c = reports[target]["counters"]["slots"]
        assert c["remaps"] == 0 and c["slots"] == int(reports[target]["facts"]["slots"]["seq_slots"]), c
        assert c["leases"] == 0 and c["waiting"] == 0, c  # every request was seated and finished


def test_foreign_parent_is_invisible_on_toy_paged(tmp_path):
    """The fault toy-attn exists for: a hit's blocks written after another first block (the right
    tokens at the right positions) leave toy-paged's slots exactly as they were, so its gate passes
    while the hits are real (whole pages, two or more); on toy-attn repeat_hit fails (FAULTS)."""
    code, reports = gate(tmp_path, "--targets", "toy-paged", "--scenarios", "repeat_hit", "turn2_warm_equals_run",
                         "--server-flags", "--fault foreign-parent")
    got = checks(reports["toy-paged"])
    assert code == EXIT_PASS, got
    assert got["repeat_hit"]["ok"] is True and got["turn2_warm_equals_run"]["ok"] is True, got
    cached = [int(n) for n in got["repeat_hit"]["note"].split("cached [", 1)[1].split("]", 1)[0].split(", ")]
    assert min(cached) >= 32, got["repeat_hit"]["note"]  # every repeat hit two pages or more: the fault ran


def test_pad_in_limit_fails_wake_room_without_hanging(tmp_path):
    # the exact-fill request is neither rejected nor seated: it waits for room forever while the
    # scheduler idles. The watch (e2e/watch.py) names it within seconds, long before the scenario's
    # 60 s bound, and the server holding it is stopped without waiting out its drain
    t0 = time.monotonic()
    code, reports = gate(tmp_path, "--targets", "toy-paged", "--scenarios", "wake_room",
                         "--server-flags", "--fault pad-in-limit")
    took = time.monotonic() - t0
    got = checks(reports["toy-paged"])
    assert code == EXIT_FAIL and got["wake_room"]["ok"] is False, got
    note = got["wake_room"]["note"]
    assert "the exact-fill request" in note and "hung" in note, note
    assert "turn 2 1/1 identical" in note and "did not complete" not in note, note
    assert re.search(r"request req-\d+ \(\d+ prompt tokens", note), note  # named
    assert "waiting=1 ['req-" in note and "server-wake_room.log" in note, note  # its state, its log
    assert took < 30, took


def test_a_hang_in_a_step_fails_fast_and_its_checks_are_errors(tmp_path, capsys):
    """A request that hangs inside a step ends the step within seconds (`Hung`, naming the request,
    its state from /stats and the server's log); every check that step and the steps after it would
    have judged is reported as an error on the console, in report.json, summary.md and JUnit, none
    dropped. The hang: a leaked lease. At --capacity 4096 the hung-up stream's room is the whole pool,
    and `leak-lease` keeps it, so the next request waits forever while the scheduler idles."""
    t0 = time.monotonic()
    junit = tmp_path / "junit.xml"
    code, reports = gate(tmp_path, "--targets", "toy-paged", "--scenarios", "abort", "repeat_hit",
                         "metrics_default", "--capacity", "4096", "--server-flags", "--fault leak-lease",
                         "--junit", str(junit))
    took = time.monotonic() - t0
    console = capsys.readouterr().out
    got = checks(reports["toy-paged"])
    assert code == EXIT_FAIL, got
    assert took < 30, took
    note = got["error"]["note"]
    assert note.startswith("Hung: request req-"), note  # the request, named
    rid = re.match(r"Hung: request (req-\d+) ", note).group(1)
    assert f"waiting=1 ['{rid}']" in note and "leases=1" in note, note  # its state from /stats
    log = tmp_path / "results" / "toy-paged" / "server-default.log"
    assert f"server log: {log}" in note and log.is_file(), note  # where to look
    errors = {n for n, c in got.items() if c.get("error")}
    # abort (the hung step's own check) and the default session's metrics check, saying why
    assert {"abort", "metrics_default"} <= errors and got["repeat_hit"]["ok"] is True, got
    assert all(got[n]["ok"] is False and got[n]["note"].startswith("not run: ") for n in errors), got
    assert got["abort"]["note"].startswith("not run: step abort: Hung"), got["abort"]
    assert got["metrics_default"]["note"].startswith("not run: its session ended at step abort: Hung"), got
    summary = (tmp_path / "results" / "summary.md").read_text()
    xml = junit.read_text()
    assert "### toy-paged: error" in summary  # the hang itself has its section
    # the checks it kept from running are folded into one line for their session, each named
    folded = next(line for line in summary.splitlines() if "session default:" in line and " not run (" in line)
    assert f"{len(errors)} not run (" in folded and "step abort: Hung" in folded, folded
    for n in errors | {"error"}:
        assert f"[ERR ] {n}: not run: " in console or n == "error", (n, console)
        assert n in folded or n == "error", (n, folded)
        assert f'name="{n}"' in xml, n
    assert xml.count("<error ") == len(errors), xml


def test_a_wedged_scheduler_is_named_once_stats_stays_silent(tmp_path, monkeypatch):
    """A step that never returns (`--fault wedge-step`) holds /stats, which waits for the scheduler;
    past the stall bound (lowered here from 180 s) that is a hang naming the request, and the note
    says what /stats/live (answered off the scheduler's thread) saw: the scheduler in a runtime step."""
    from e2e import watch

    monkeypatch.setattr(watch, "STALL_S", 6.0)
    t0 = time.monotonic()
    code, reports = gate(tmp_path, "--targets", "toy-paged", "--scenarios", "conc1_equals_run",
                         "--server-flags", "--fault wedge-step")
    took = time.monotonic() - t0
    got = checks(reports["toy-paged"])
    assert code == EXIT_FAIL and took < 30, (took, got)
    note = got["error"]["note"]
    assert re.match(r"Hung: request req-1 \(\d+ prompt tokens", note), note
    assert "has not answered /stats for" in note and "in a runtime step for" in note, note
    assert "server-default.log" in note, note
    assert got["conc1_equals_run"]["ok"] is False and got["conc1_equals_run"]["error"], got


def test_a_step_longer_than_the_still_bound_is_not_a_hang(tmp_path):
    """Legitimate slowness passes: the first step takes 12 s (`--fault long-first-step`, as numba
    compiling on first use does), longer than the 2 + 5 s the watch needs to call an idle scheduler
    hung; /stats waits behind the step, so the watch never sees it idle and the gate passes."""
    t0 = time.monotonic()
    code, reports = gate(tmp_path, "--targets", "toy-paged", "--scenarios", "conc1_equals_run",
                         "--server-flags", "--fault long-first-step")
    got = checks(reports["toy-paged"])
    assert code == EXIT_PASS and got["conc1_equals_run"]["ok"] is True, got
    assert time.monotonic() - t0 > 12  # the long step happened


def test_a_broken_build_fails_run_equals_reference(tmp_path):
    # kern run (no server) on a build whose write kernel fills half of each token slot, held to the reference
    raw = json.loads((TOY / "toy-paged.json").read_text())
    launch = raw["ops"]["write"]["impl"]["launches"][0]
    launch["args"][-1] = {"i64": raw["states"]["kv"]["bytes_per_token"] // 2}
    (tmp_path / "broken.json").write_text(json.dumps(raw))
    shutil.copy(TOY / "salt.safetensors", tmp_path / "salt.safetensors")
    cfg = tmp_path / "kern.toml"
    cfg.write_text('[targets.broken]\nmanifest = "broken.json"\n')
    code, reports = gate(tmp_path, "--config", str(cfg), "--scenarios", "run_equals_reference")
    got = checks(reports["broken"])
    assert code == EXIT_FAIL and got["run_equals_reference"]["ok"] is False, got
    assert got["run_equals_reference"]["note"].startswith("0/12 identical"), got
    assert not list((tmp_path / "results" / "broken").glob("server-*.log"))  # no server needed


def test_no_checkpoint_also_fails_turn2_hit(tmp_path):
    code, reports = gate(tmp_path, "--targets", "toy-stateful", "--scenarios", "turn2_hit",
                         "--server-flags", "--fault no-checkpoint")
    assert code == EXIT_FAIL and checks(reports["toy-stateful"])["turn2_hit"]["ok"] is False


# usage and nothing-ran

@pytest.mark.parametrize("args", [
    pytest.param(["--targets", "toy-paged", "no-such-target"], id="unknown-target"),
    pytest.param(["--scenarios", "conc1_equals_run", "no_such_check"], id="unknown-scenario"),
    pytest.param(["--config", "/nonexistent/kern.toml"], id="unreadable-config"),
    pytest.param(["--reference", "/nonexistent/model.py"], id="missing-reference"),
])
def test_usage_errors_exit_2(tmp_path, args):
    code, reports = gate(tmp_path, *args)
    assert code == EXIT_USAGE and reports == {}


def test_every_target_skipped_exits_125(tmp_path):
    cfg = tmp_path / "kern.toml"
    cfg.write_text('[targets.gone]\nmanifest = "gone/missing.json"\n')
    code, reports = gate(tmp_path, "--config", str(cfg))
    assert code == EXIT_NOTHING_RAN
    assert reports["gone"]["skipped"].startswith("manifest") and reports["gone"]["checks"] == []
    assert "nothing ran" in (tmp_path / "results" / "summary.md").read_text()


def test_a_failing_kern_test_exits_1_without_a_server(tmp_path):
    cfg = tmp_path / "kern.toml"
    cfg.write_text(f'[targets.mixed]\nmanifest = "{TOY}/toy-paged.json"\nreference = "{TOY}/toy-stateful-ref.json"\n')
    code, reports = gate(tmp_path, "--config", str(cfg), "--scenarios", "kern_test")
    got = checks(reports["mixed"])
    # gated on exit 0: FAIL and INCONCLUSIVE (these builds share no case) both fail it
    assert code == EXIT_FAIL and got["kern_test"]["ok"] is False
    assert got["kern_test"]["note"].startswith(("FAIL", "INCONCLUSIVE"))
    assert not list((tmp_path / "results" / "mixed").glob("server-*.log"))


def test_jobs_gates_several_targets_at_once(tmp_path, capsys):
    """--jobs 2: both targets gated concurrently, reports in the order asked, progress lines tagged."""
    code, reports = gate(tmp_path, "--targets", "toy-big", "toy-paged", "--scenarios", "conc1_equals_run",
                         "repeat_hit", "--jobs", "2")
    assert code == EXIT_PASS, reports
    assert set(reports) == {"toy-big", "toy-paged"}
    for r in reports.values():
        assert {c["name"] for c in r["checks"]} == {"conc1_equals_run", "repeat_hit"}
        assert all(c["ok"] for c in r["checks"])
    out = capsys.readouterr().out
    assert "[toy-paged] [ok  ] repeat_hit" in out and "[toy-big] [ok  ] conc1_equals_run" in out
    table = (tmp_path / "results" / "summary.md").read_text()
    assert table.index("toy-big") < table.index("toy-paged")  # the order asked, not the finishing order
