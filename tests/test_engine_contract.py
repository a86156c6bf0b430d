"""`e2e --engine`: engines other than ours gated from docs/engine-contract.md alone.

The contract's page and `e2e/engine.py` are held to each other; `examples/tiny_engine.py` (core only,
no cache) passes with every other check `skipped (engine lacks X)`; declarations the gate cannot use
are usage errors (exit 2); an engine with no readiness route fails at once, not after the load
timeout; `kern serve` declares every capability a server can have.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from e2e.cli import main
from e2e.engine import CACHE_SIZE, CAPABILITIES, PLACEHOLDERS, KERN_ONLY, NEEDS, RUNS, Engine, EngineError, lacking, step_lacking
from e2e.scenarios import CHECKS, STEPS

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "engine-contract.md"
TINY = f"{sys.executable} {ROOT / 'examples' / 'tiny_engine.py'} --port {{port}}"
CORE = {"conc1_equals_run", "turn2_warm_equals_run", "concurrent", "prefix_cold_warm_restored",
        "blocks_moved", "blocks_reparented", "block_edges", "cold_prefix_burst"}  # the wild workloads need only the core


def gate(tmp_path: Path, *args: str, max_tokens: int = 12) -> tuple[int, dict]:
    out = tmp_path / "results"
    argv = ["--out", str(out), "--max-tokens", str(max_tokens), "--jobs", "1", *args]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    reports = {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/report.json")}
    return exc.value.code, reports


def test_the_page_documents_every_capability_and_the_table_names_real_checks():
    text = DOC.read_text()
    table = text.split("\n## Capabilities\n", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `([a-z-]+)` \|", table, flags=re.M))
    assert rows == set(CAPABILITIES) - {"kern-runtime"}, "docs/engine-contract.md's table vs e2e.engine.CAPABILITIES"
    assert "`kern-runtime`" in text
    steps = {s.name for s in STEPS}
    assert set(RUNS) <= steps, f"RUNS names no step: {set(RUNS) - steps}"
    assert set(NEEDS) <= set(CHECKS), f"NEEDS names no check: {set(NEEDS) - set(CHECKS)}"
    for caps in [*RUNS.values(), *NEEDS.values()]:
        assert set(caps) <= set(CAPABILITIES) | {CACHE_SIZE}  # cache-size: told by the command, never declared
    for name in PLACEHOLDERS:
        assert name in text, f"docs/engine-contract.md does not name the placeholder {name}"


def test_kern_serve_declares_every_capability_a_server_can_have():
    from serve.app import CAPABILITIES as SERVED

    assert set(SERVED) == set(CAPABILITIES) - set(KERN_ONLY)


def test_lacking_names_what_a_check_needs():
    core = Engine.foreign("x --port {port}", [])
    assert lacking(core, "conc1_equals_run") == []
    assert lacking(core, "repeat_hit") == ["cached-tokens"]
    assert lacking(core, "policy_default") == ["kern-policy"]
    assert step_lacking(core, "params") == ["params", "text", "stream"] and step_lacking(core, "repeat") == []
    assert lacking(Engine.own(), "policy_default") == []


@pytest.mark.parametrize("caps, wrong", [(["cached-tokenz"], "cached-tokenz"), (["kern-cli"], "only a kern")])
def test_a_declaration_the_gate_cannot_use_is_refused(caps, wrong):
    with pytest.raises(EngineError, match=wrong):
        Engine.foreign("x --port {port}", caps)


@pytest.mark.parametrize("args, says", [
    (["--engine", "python server.py", "--targets", "toy-paged"], "{port}"),
    (["--engine", "python server.py --port {port}", "--capabilities", "streams"], "unknown capability 'streams'"),
    (["--capabilities", "stream"], "give --engine too"),
    (["--engine", "python s.py --port {port}", "--kern", "kern"], "give one"),
])
def test_usage_errors_exit_2_and_say_what_was_wrong(tmp_path, capsys, args, says):
    code, _ = gate(tmp_path, *args)
    assert code == 2
    assert says in capsys.readouterr().err


def test_the_tiny_engine_passes_its_core_and_everything_else_is_skipped(tmp_path, capsys):
    code, reports = gate(tmp_path, "--engine", TINY, "--targets", "toy-paged", "--junit", str(tmp_path / "j.xml"))
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    got = {c["name"]: c for c in reports["toy-paged"]["checks"]}
    assert {n for n, c in got.items() if c["ok"] is True} == CORE
    skipped = {n: c for n, c in got.items() if c.get("skipped")}
    assert skipped and all(c["ok"] is None and c["note"].startswith("skipped (engine lacks ") for c in skipped.values())
    assert got["repeat_hit"]["skipped"] == ["cached-tokens"] and got["kern_test"]["skipped"] == ["kern-cli"]
    assert not [n for n, c in got.items() if c["ok"] is False]
    assert "Traceback" not in out and "KeyError" not in out
    assert "engine under test: " + TINY.split(" --port")[0] in (tmp_path / "results" / "summary.md").read_text()
    junit = (tmp_path / "j.xml").read_text()
    assert "<skipped message=\"skipped (engine lacks cached-tokens)\"" in junit and 'name="engine.command"' in junit
    assert reports["toy-paged"]["engine"]["command"] == TINY


def test_an_engine_with_no_health_route_fails_at_once(tmp_path):
    # python's own file server: it answers HTTP, but GET /health is a 404
    t0 = time.monotonic()
    code, reports = gate(tmp_path, "--engine", f"{sys.executable} -m http.server {{port}} --bind 127.0.0.1",
                         "--targets", "toy-paged", "--scenarios", "conc1_equals_run", "--load-timeout", "120")
    assert code == 1 and time.monotonic() - t0 < 60
    error = next(c for c in reports["toy-paged"]["checks"] if c["name"] == "error")
    assert "GET /health answers 404" in error["note"]


DICT = f"{sys.executable} {ROOT / 'tests' / 'engines' / 'dict_engine.py'} --port {{port}} --model {{model}}"


def test_the_dict_engine_written_from_the_contract_passes_every_check_it_can_be_judged_on(tmp_path, capsys):
    code, reports = gate(tmp_path, "--engine", DICT, "--targets", "toy-paged")
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    got = {c["name"]: c for c in reports["toy-paged"]["checks"]}
    assert {n for n, c in got.items() if c["ok"] is True} == CORE | {"repeat_hit", "turn2_hit"}
    assert reports["toy-paged"]["engine"]["name"] == "dict-engine"


def test_a_lined_target_through_the_dict_engine(tmp_path, capsys):
    code, _ = gate(tmp_path, "--engine", DICT, "--targets", "toy-stateful")
    assert code == 0, capsys.readouterr().out[-3000:]


def test_a_capability_the_engine_drops_turns_its_checks_into_skips(tmp_path, capsys):
    code, reports = gate(tmp_path, "--engine", DICT + " --lack cached-tokens", "--targets", "toy-paged",
                         "--scenarios", "repeat_hit", "turn2_hit", "conc1_equals_run")
    assert code == 0, capsys.readouterr().out[-3000:]
    got = {c["name"]: c for c in reports["toy-paged"]["checks"]}
    assert got["repeat_hit"]["skipped"] == ["cached-tokens"] and got["turn2_hit"]["ok"] is None
    assert got["conc1_equals_run"]["ok"] is True


@pytest.mark.parametrize("bug, caught", [
    ("short-key", "turn2_warm_equals_run"),          # two prefixes with the same last 16 tokens share a state
    ("off-by-one", "conc1_equals_run"),              # a resumed prefix's last token fed twice
    ("stale-evict", "prefix_cold_warm_restored"),    # an evicted sequence's last state "restored" from its first
    ("race", "prefix_cold_warm_restored"),           # the running state shared by requests in flight
    ("cached-lie", "repeat_hit"),                    # cached_tokens says the whole prompt
])
def test_each_planted_bug_in_the_dict_engine_fails_the_gate(tmp_path, capsys, bug, caught):
    code, reports = gate(tmp_path, "--engine", DICT + f" --bug {bug}", "--targets", "toy-paged")
    out = capsys.readouterr().out
    assert code == 1, out[-3000:]
    failed = {c["name"] for c in reports["toy-paged"]["checks"] if c["ok"] is False}
    assert caught in failed, f"--bug {bug}: failed {failed}"


def test_kern_run_under_kern_is_that_kerns_own_run(tmp_path, capsys):
    """Under --kern, run_equals_reference runs the --kern command's `run` (its `generated ids:` line),
    not this checkout's runtime: here the command is this checkout's CLI in a process of its own."""
    code, reports = gate(tmp_path, "--kern", f"{sys.executable} -m oracle.cli", "--targets", "toy-paged",
                         "--scenarios", "run_equals_reference")
    assert code == 0, capsys.readouterr().out[-3000:]
    note = {c["name"]: c for c in reports["toy-paged"]["checks"]}["run_equals_reference"]["note"]
    assert "kern run (the --kern command) vs reference" in note, note


def test_kern_run_under_kern_fails_when_that_kerns_run_is_wrong(tmp_path, capsys):
    # a --kern whose `run` answers other ids than its server: the check must see the command's answers
    fake = tmp_path / "fakekern.py"
    fake.write_text("import sys, subprocess\n"
                    "if 'run' in sys.argv:\n"
                    "    print('generated ids: [1, 2, 3]', file=sys.stderr); sys.exit(0)\n"
                    f"sys.exit(subprocess.call([{sys.executable!r}, '-m', 'oracle.cli', *sys.argv[1:]]))\n")
    code, reports = gate(tmp_path, "--kern", f"{sys.executable} {fake}", "--targets", "toy-paged",
                         "--scenarios", "run_equals_reference")
    assert code == 1, capsys.readouterr().out[-3000:]
    check = {c["name"]: c for c in reports["toy-paged"]["checks"]}["run_equals_reference"]
    assert check["ok"] is False and "got [1, 2, 3]" in check["note"], check
