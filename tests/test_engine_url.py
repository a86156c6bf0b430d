"""`e2e --engine-url URL`: an engine the user already runs, gated without the gate starting anything.

The dict engine (tests/engines/dict_engine.py) is started here, on a port of its own, as a user would
start theirs. Without a cache reset the sessions that need a fresh engine are `skipped (needs a fresh
engine)`; with one (`--reset`: facts.reset) the gate POSTs it before each session and runs them; a
planted bug fails the gate; nothing listening is exit 125. And `--server-flags` reach an engine the
gate starts (`--engine CMD`): a bug planted through them fails the gate.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from e2e.cli import main
from e2e.engine import Engine
from e2e.scenarios import FRESH_SESSIONS, STEPS, fresh_lacking, session_ports
from e2e.session import free_port

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "tests" / "engines" / "dict_engine.py"
DEFAULT = {"conc1_equals_run", "repeat_hit", "turn2_hit", "turn2_warm_equals_run", "concurrent", "stream_equals_whole"}
FRESH = ("prefix_cold_warm_restored", "policy_prefix", "metrics_prefix")


def gate(tmp_path: Path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "results"
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(out), "--max-tokens", "12", *args])
    reports = {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/report.json")}
    return exc.value.code, reports


class Running:
    """The dict engine started as a user would, its output in a file; stopped by `stop`."""

    def __init__(self, tmp_path: Path, *flags: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / "engine.log"
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen([sys.executable, str(ENGINE), "--port", str(self.port), *flags],
                                         stdout=f, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, self.log.read_text()
            time.sleep(0.1)
        self.stop()
        raise AssertionError("the dict engine never got ready: " + self.log.read_text())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def running(tmp_path):
    started: list[Running] = []

    def start(*flags: str) -> Running:
        started.append(Running(tmp_path, *flags))
        return started[-1]

    yield start
    for r in started:
        r.stop()


def checks(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def test_a_running_engine_without_a_reset_is_gated_and_its_fresh_sessions_skipped(tmp_path, running, capsys):
    r = running("--model", "toy-paged")
    code, reports = gate(tmp_path, "--engine-url", r.url, "--targets", "toy-paged")
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    got = checks(reports["toy-paged"])
    assert DEFAULT <= {n for n, c in got.items() if c["ok"] is True} and not any(c["ok"] is False for c in got.values())
    for name in FRESH:
        assert got[name]["ok"] is None and got[name]["note"] == "skipped (needs a fresh engine)", got[name]
    fresh = {st.session for st in STEPS if fresh_lacking(Engine.running(r.url), st)}
    for name in (c for st in STEPS if st.session in fresh for c in st.checks if c in got):
        assert got[name]["ok"] is None, got[name]  # skipped: for a fresh engine, or for what it lacks
    assert "prefix cache reset" not in r.log.read_text()
    assert r.proc.poll() is None, "the gate stopped an engine it did not start"


def test_a_declared_reset_is_posted_before_each_session_and_the_fresh_sessions_run(tmp_path, running, capsys):
    r = running("--model", "toy-paged", "--reset")
    code, reports = gate(tmp_path, "--engine-url", r.url)  # the target: the one whose model /v1/models lists
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    got = checks(reports["toy-paged"])
    assert DEFAULT | {"prefix_cold_warm_restored"} <= {n for n, c in got.items() if c["ok"] is True}
    assert not any(c["ok"] is False or "fresh" in c["note"] for c in got.values())
    logs = [p.read_text() for p in (tmp_path / "results" / "toy-paged").glob("server-*.log")]
    assert len(logs) >= 2 and all("POST /reset_prefix_cache: 200" in t for t in logs)  # before every session
    assert r.log.read_text().count("prefix cache reset") == len(logs)


def test_a_planted_bug_in_a_running_engine_fails_the_gate(tmp_path, running, capsys):
    r = running("--model", "toy-paged", "--bug", "off-by-one")
    code, reports = gate(tmp_path, "--engine-url", r.url, "--targets", "toy-paged", "--scenarios", "conc1_equals_run")
    assert code == 1, capsys.readouterr().out[-3000:]
    assert checks(reports["toy-paged"])["conc1_equals_run"]["ok"] is False


def test_nothing_listening_is_exit_125_with_one_clear_line(tmp_path, capsys):
    url = f"http://127.0.0.1:{free_port()}"
    code, reports = gate(tmp_path, "--engine-url", url, "--targets", "toy-paged")
    err = capsys.readouterr().err
    assert code == 125 and reports == {}
    assert f"e2e: nothing answers at {url}" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args, says", [
    (("--targets", "toy-paged,toy-attn"), "--engine-url gates one target"),
    (("--targets", "toy-attn"), "serves 'toy-paged'"),
    (("--server-flags", "--keep 2"), "the gate starts no server under --engine-url"),
    (("--engine", "x --port {port}"), "--engine-url and --engine: give one"),
])
def test_what_cannot_be_gated_on_a_running_engine_is_a_usage_error(tmp_path, running, capsys, args, says):
    r = running("--model", "toy-paged")
    code, _ = gate(tmp_path, "--engine-url", r.url, *args)
    assert code == 2 and says in capsys.readouterr().err


def test_a_step_needs_a_fresh_engine_only_where_it_starts_its_own_or_reads_an_empty_cache():
    e = Engine.running("http://127.0.0.1:1")
    fresh = {st.session for st in STEPS if fresh_lacking(e, st)}
    assert FRESH_SESSIONS == {"prefix", "blocks", "cold_burst", "tight", "freed", "generated"}  # the rows' own `fresh`
    assert fresh == FRESH_SESSIONS | {st.session for st in STEPS if st.flags is not None or st.cache is not None}
    assert "default" not in fresh  # reads what the gate sent it: a running engine's cache does no harm
    e.facts["reset"] = "/reset_prefix_cache"
    assert not any(fresh_lacking(e, st) for st in STEPS)
    assert not any(fresh_lacking(Engine.foreign("x --port {port}"), st) for st in STEPS)


def test_fresh_is_told_on_a_sessions_first_row_only():
    from dataclasses import replace
    rows = list(STEPS)
    i = next(i for i, st in enumerate(rows) if st.session == "blocks" and st.port is None)
    rows[i] = replace(rows[i], fresh=True)
    with pytest.raises(ValueError, match=f"step {rows[i].name}: fresh on a row that does not open a session"):
        session_ports(tuple(rows))


def test_server_flags_reach_an_engine_the_gate_starts(tmp_path, capsys):
    cmd = f"{sys.executable} {ENGINE} --port {{port}} --model {{model}}"
    code, reports = gate(tmp_path, "--engine", cmd, "--targets", "toy-paged", "--scenarios", "conc1_equals_run",
                         "--server-flags", "--bug off-by-one")
    assert code == 1, capsys.readouterr().out[-3000:]
    assert checks(reports["toy-paged"])["conc1_equals_run"]["ok"] is False
    log = (tmp_path / "results" / "toy-paged" / "server-default.log").read_text().splitlines()[0]
    assert log.endswith("--bug off-by-one"), log


def test_a_target_in_the_config_describes_an_engine_without_kern_capabilities():
    from e2e.config import load_targets
    from e2e.running import declared

    _, (vllm, paged) = load_targets(str(ROOT / "examples" / "vllm_toy" / "kern.toml"), None)
    assert (vllm.model, paged.model) == ("kern-toy-vllm", "kern-toy-vllm-paged")
    e = declared(Engine.running("http://127.0.0.1:1"), vllm)
    assert e.capabilities == frozenset(vllm.capabilities) and e.declared and e.name == "vLLM"
    assert e.reset == "/reset_prefix_cache" and e.facts["page"] == 32
    given = declared(Engine.running("http://127.0.0.1:1", ["stream"]), vllm)  # --capabilities wins
    assert given.capabilities == frozenset({"stream"})
