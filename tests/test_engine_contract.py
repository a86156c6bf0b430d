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
from e2e.engine import CACHE_SIZE, CAPABILITIES, DEFAULT_TARGETS, KERN_ONLY, NOT_KERN, PLACEHOLDERS, Engine, EngineError
from e2e.scenarios import CHECKS, NEEDS, STEPS, lacking, step_lacking

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
    for s in STEPS:
        assert set(s.needs) <= set(s.checks), f"step {s.name}'s needs name a check it does not add"
    assert set(NEEDS) <= set(CHECKS), f"NEEDS names no check: {set(NEEDS) - set(CHECKS)}"
    for caps in [*(s.runs for s in STEPS), *NEEDS.values()]:
        named = {alt for c in caps for alt in c.split("|")}  # "a|b": either
        assert named <= set(CAPABILITIES) | {CACHE_SIZE}  # cache-size: told by the command, never declared
    for name in PLACEHOLDERS:
        assert name in text, f"docs/engine-contract.md does not name the placeholder {name}"


def test_kern_serve_declares_every_capability_a_server_can_have():
    from serve.api.app import CAPABILITIES as SERVED

    assert set(SERVED) == set(CAPABILITIES) - set(KERN_ONLY) - set(NOT_KERN)


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
    assert {n for n, c in got.items() if c["ok"] is True} == CORE | {"repeat_hit", "turn2_hit", "stream_equals_whole"}
    assert reports["toy-paged"]["engine"]["name"] == "dict-engine"


def test_a_lined_target_through_the_dict_engine(tmp_path, capsys):
    code, _ = gate(tmp_path, "--engine", DICT, "--targets", "toy-stateful")
    assert code == 0, capsys.readouterr().out[-3000:]


def test_stream_alone_gates_streamed_answers_equal_to_whole_ones(tmp_path, capsys):
    code, reports = gate(tmp_path, "--engine", DICT + " --lack text cached-tokens", "--targets", "toy-paged",
                         "--scenarios", "stream_equals_whole")
    assert code == 0, capsys.readouterr().out[-3000:]
    got = {c["name"]: c for c in reports["toy-paged"]["checks"]}
    assert got["stream_equals_whole"]["ok"] is True and got["stream_equals_whole"]["note"].startswith("4/4 identical")
    code, reports = gate(tmp_path, "--engine", DICT + " --lack stream", "--targets", "toy-paged",
                         "--scenarios", "stream_equals_whole", "conc1_equals_run")
    got = {c["name"]: c for c in reports["toy-paged"]["checks"]}
    assert code == 0 and got["stream_equals_whole"]["skipped"] == ["stream"]


def test_the_context_dependent_target_through_the_dict_engine(tmp_path, capsys):
    """toy-attn (docs/engine-contract.md, "Computing toy-attn"): the dict engine caches each prefix's
    running sums, so it is right; the same checks pass as on toy-paged."""
    code, reports = gate(tmp_path, "--engine", DICT, "--targets", "toy-attn")
    assert code == 0, capsys.readouterr().out[-3000:]
    got = {c["name"]: c for c in reports["toy-attn"]["checks"]}
    assert {n for n, c in got.items() if c["ok"] is True} == CORE | {"repeat_hit", "turn2_hit", "stream_equals_whole"}


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
    ("stream-drop-last", "stream_equals_whole"),     # a streamed answer's last token never sent
])
def test_each_planted_bug_in_the_dict_engine_fails_the_gate(tmp_path, capsys, bug, caught):
    """Each bug is gated on the check that catches it (and the steps that check needs), as
    tests/test_paged_engine.py gates its engine's: the whole gate took 9-13 s a bug on the 2-core box."""
    code, reports = gate(tmp_path, "--engine", DICT + f" --bug {bug}", "--targets", "toy-paged", "--scenarios", caught)
    out = capsys.readouterr().out
    assert code == 1, out[-3000:]
    failed = {c["name"] for c in reports["toy-paged"]["checks"] if c["ok"] is False}
    assert caught in failed, f"--bug {bug}: failed {failed}"


def test_kern_run_under_kern_is_that_kerns_own_run(tmp_path, capsys):
    """Under --kern, run_equals_reference runs the --kern command's `run` (its `generated ids:` line),
    not this checkout's runtime: here the command is this checkout's CLI in a process of its own."""
    code, reports = gate(tmp_path, "--kern", f"{sys.executable} -m kern.cli", "--targets", "toy-paged",
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
                    f"sys.exit(subprocess.call([{sys.executable!r}, '-m', 'kern.cli', *sys.argv[1:]]))\n")
    code, reports = gate(tmp_path, "--kern", f"{sys.executable} {fake}", "--targets", "toy-paged",
                         "--scenarios", "run_equals_reference")
    assert code == 1, capsys.readouterr().out[-3000:]
    check = {c["name"]: c for c in reports["toy-paged"]["checks"]}["run_equals_reference"]
    assert check["ok"] is False and "got [1, 2, 3]" in check["note"], check


def _shebang(tmp_path: Path) -> str:
    script = tmp_path / "engine.py"
    script.write_text("#!/nonexistent/venv/bin/python\nprint('never')\n")
    script.chmod(0o755)
    return f"{script} --port {{port}}"


@pytest.mark.parametrize("command", [
    "/nonexistent/venv/bin/python server.py --port {port}",    # a venv that is not there
    "env /nonexistent/engine --port {port}",                    # env's 127: not found
    f"{sys.executable} -c 'import sys; sys.exit(126)' --port {{port}}",  # a shell's "not executable"
    "shebang",                                                  # a script whose interpreter is missing
])
def test_an_engine_command_that_cannot_be_executed_exits_125(tmp_path, capsys, command):
    command = _shebang(tmp_path) if command == "shebang" else command
    code, reports = gate(tmp_path, "--engine", command, "--targets", "toy-paged", "--scenarios", "conc1_equals_run")
    assert code == 125, capsys.readouterr().out[-2000:]
    assert "the engine's command cannot be executed" in reports["toy-paged"]["skipped"]


@pytest.mark.parametrize("command, extra", [
    (f"{sys.executable} -c 'import sys; print(\"up\"); sys.exit(3)' --port {{port}}", []),  # starts, then dies
    (f"{sys.executable} -c 'import time; time.sleep(60)' --port {{port}}", ["--load-timeout", "2"]),  # never ready
])
def test_an_engine_that_starts_and_then_dies_or_never_gets_ready_exits_1(tmp_path, capsys, command, extra):
    code, reports = gate(tmp_path, "--engine", command, "--targets", "toy-paged", "--scenarios", "conc1_equals_run",
                         *extra)
    assert code == 1, capsys.readouterr().out[-2000:]
    assert reports["toy-paged"]["skipped"] is None
    assert [c["name"] for c in reports["toy-paged"]["checks"] if c["ok"] is False][0] == "error"


def test_without_targets_an_engine_is_gated_on_the_default_targets_and_lacked_families_are_skipped(tmp_path, capsys):
    from e2e.config import load_targets

    code, reports = gate(tmp_path, "--engine", DICT, "--scenarios", "conc1_equals_run")
    assert code == 0, capsys.readouterr().out[-3000:]
    _, every = load_targets(None, None)
    assert set(reports) == {t.name for t in every if t.name in DEFAULT_TARGETS} >= {"toy-paged", "toy-stateful"}
    code, reports = gate(tmp_path, "--engine", DICT, "--targets", "toy-paged", "toy-float",
                         "--scenarios", "conc1_equals_run")
    assert code == 0, capsys.readouterr().out[-3000:]
    assert reports["toy-float"]["skipped"].startswith("engine lacks family float (its facts.families: paged, lined, attn)")
    assert reports["toy-paged"]["skipped"] is None


def test_an_engine_learns_its_toy_from_the_manifest_placeholder(tmp_path, capsys):
    command = f"{sys.executable} {ROOT / 'tests' / 'engines' / 'dict_engine.py'} --port {{port}} --manifest {{manifest}}"
    code, reports = gate(tmp_path, "--engine", command, "--targets", "toy-stateful", "--scenarios", "conc1_equals_run")
    assert code == 0, capsys.readouterr().out[-3000:]
    log = (tmp_path / "results" / "toy-stateful" / "server-default.log").read_text()
    assert str(ROOT / "manifests" / "toy" / "toy-stateful.json") in log.splitlines()[0]


def test_the_placeholders_are_one_table():
    e = Engine.foreign("srv --port {port} --host {host} --model {model} --manifest {manifest}", [])
    assert set(PLACEHOLDERS) >= {"port", "host", "model", "manifest"}
    assert e.argv(5, "toy-x", manifest="/m.json") == ["srv", "--port", "5", "--host", "127.0.0.1", "--model", "toy-x",
                                                       "--manifest", "/m.json"]
    assert all(f"`{{{name}}}`" in DOC.read_text() for name in PLACEHOLDERS), "docs/engine-contract.md names each"
    e.facts["families"] = ["paged"]
    assert e.lacks_family("paged") is None and "engine lacks family lined" in e.lacks_family("lined")
    assert Engine.foreign("srv --port {port}", []).lacks_family("lined") is None  # undeclared: every family tried


def test_a_config_engine_whose_families_lack_the_targets_is_skipped_before_it_starts(tmp_path, capsys):
    never = tmp_path / "started"
    starter = tmp_path / "engine.py"
    starter.write_text(f"open({str(never)!r}, 'w')\n")
    cfg = tmp_path / "kern.toml"
    cfg.write_text(f"""[targets.lined]
manifest = "{ROOT / 'manifests' / 'toy' / 'toy-stateful.json'}"
engine = "{sys.executable} {starter} --port {{port}}"
facts = {{ page = 1, families = ["paged"] }}
""")
    code, reports = gate(tmp_path, "--config", str(cfg), "--scenarios", "conc1_equals_run")
    assert code == 125, capsys.readouterr()
    assert reports["lined"]["skipped"].startswith("engine lacks family lined")
    assert not never.exists()


def test_a_step_that_runs_on_either_capability_runs_on_each():
    """abort runs on `stats` (kern's counters.aborted) or `metrics-vllm` (vLLM's own abort counter); an
    engine with neither is told both names."""
    from e2e.scenarios import step_lacking

    assert step_lacking(Engine.foreign("x --port {port}", ["stream", "stats"]), "abort") == []
    assert step_lacking(Engine.foreign("x --port {port}", ["stream", "metrics-vllm"]), "abort") == []
    assert step_lacking(Engine.foreign("x --port {port}", ["stream"]), "abort") == ["stats or metrics-vllm"]


def test_metrics_vllm_judges_the_metrics_checks_in_place_of_metrics():
    assert lacking(Engine.foreign("x --port {port}", ["metrics-vllm"]), "metrics_default") == []
    assert lacking(Engine.foreign("x --port {port}", []), "metrics_default") == ["metrics"]
