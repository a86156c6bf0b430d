"""The sessions of the configurations kern ships beyond one process (e2e/scenarios/configs.py): each
passes on the shipped code and fails against a server broken only there, a mutant of the catalogue
planted in a copy of the tree (bench/mutants.py): a whole answer's tokens held in the engine core cut
to the last step's (`split_equals_run`), request ids that collide across two front ends
(`frontends2_equals_run`), a request resumed after a stage loss re-feeding one token too many
(`stage_loss_resumed`). An engine under the contract, or another kern, skips them."""

from __future__ import annotations

import re
import threading
import time

from e2e.engine import Engine
from e2e.scenarios import configs
from e2e.scenarios import step_lacking
from test_e2e_driver import EXIT_PASS, checks, gate
from conftest import bench_module



def _mutants():
    return bench_module("mutants")


def _killed(name: str, check: str) -> str:
    """Gate mutant `name` as bench/mutants.py does; it must be killed by `check` failing. Its note."""
    m = _mutants()
    mutant = next(x for x in m.CATALOGUE if x.name == name)
    result, detail, _ = m.gate(mutant, 16, 600.0)
    assert result == "killed", (name, result, detail)
    assert f"[FAIL] {check}:" in detail, detail
    return detail


def test_split_and_two_front_ends_pass_on_the_shipped_code(tmp_path):
    names = ("split_equals_run", "frontends2_equals_run", "metrics_split", "metrics_frontends2")
    code, reports = gate(tmp_path, "--targets", "toy-paged", "--scenarios", *names)
    got = checks(reports["toy-paged"])
    assert code == EXIT_PASS, got
    assert all(got[n]["ok"] for n in names), got
    assert "96/96 identical" in got["frontends2_equals_run"]["note"], got["frontends2_equals_run"]


def test_a_split_whose_core_drops_a_whole_answers_held_tokens_fails():
    _killed("core-held-answer-cut", "split_equals_run")


def test_two_front_ends_whose_request_ids_collide_fail():
    detail = _killed("frontend-ids-collide", "frontends2_equals_run")
    assert "request id(s) req-" in detail, detail  # told to more than one answer (the note, cut)


def test_a_stage_killed_under_load_resumes_every_answer_identically(tmp_path):
    names = ("stage_loss_resumed", "metrics_stage_loss")
    code, reports = gate(tmp_path, "--targets", "toy-layers-pp2", "--scenarios", *names, max_tokens=16)
    got = checks(reports["toy-layers-pp2"])
    assert code == EXIT_PASS, got
    assert all(got[n]["ok"] for n in names), got
    assert re.search(r"\b(24|48)/\1 identical", got["stage_loss_resumed"]["note"]), got["stage_loss_resumed"]


def test_the_gate_kills_where_the_server_stalls():
    """stage_loss's trigger (KILL_AT steps into the load) is where the server's stall-until-loss fault
    holds it: a gate that waited for more steps would never see them, the stall would run out, and the
    load would end with nothing killed."""
    from serve.core import faults

    assert configs.KILL_AT == faults.STALL_AT
    assert configs.STALL_FAULT in faults.FAULTS
    assert configs.stage_loss_flags(None) == ["--fault", configs.STALL_FAULT]


def test_a_starved_gate_still_kills_mid_answer(tmp_path, monkeypatch):
    """The race CI lost on 3727287: the gate's reads of /stats/live starved while the whole load went out.
    Here every read the kill watcher makes first sleeps 1.5 s (the load, unstalled, takes about 0.3 s):
    the stall holds the server at the trigger, so the kill still lands mid-answer and the check is judged."""
    from e2e.client import Client

    real = Client.live
    watcher = "stage-loss-kill"

    def starved(self, *args, **kwargs):
        if threading.current_thread().name == watcher:
            time.sleep(1.5)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Client, "live", starved)
    code, reports = gate(tmp_path, "--targets", "toy-layers-pp2", "--scenarios", "stage_loss_resumed", max_tokens=16)
    got = checks(reports["toy-layers-pp2"])["stage_loss_resumed"]
    assert code == EXIT_PASS and got["ok"] is True, got
    assert re.search(r"resumed mid-answer", got["note"]) and "0 of them resumed" not in got["note"], got["note"]


def test_a_resume_that_feeds_one_token_too_many_fails():
    _killed("resume-feeds-one-more", "stage_loss_resumed")


def test_only_this_checkouts_kern_runs_them():
    """Another engine (or `--kern`) lacks this checkout's runtime: the three sessions are skipped."""
    for engine in (Engine.own(["kern"]), Engine.foreign("my-engine --port {port}", ["stream", "stats"])):
        for step in ("split", "frontends2", "stage_loss"):
            assert step_lacking(engine, step) == ["kern-runtime"], (engine, step)
    assert all(step_lacking(Engine.own(), s) == [] for s in ("split", "frontends2", "stage_loss"))
