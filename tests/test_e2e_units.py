"""e2e's pure parts: log kv parsing, server flags, config, step planning, cache identity, reports."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from e2e.checks import Checks
from e2e.cli import _greedy
from e2e.config import ConfigError, load_targets
from e2e.log import Log, kv
from e2e.prompts import PROMPTS, SUFFIX, variant
from e2e.report import junit, write_report, write_summary
from e2e.scenarios import CHECKS, plan
from e2e.session import merge_flags, split_flags
from oracle.cache import Cache, identity, kern_run_identity, key, reference_identity
from oracle.reference import Reference, ReferenceError, load_model
from verdicts import Same

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "manifests" / "toy"


# log lines

@pytest.mark.parametrize("line, want", [
    pytest.param('2026 INFO scheduler ready ranks=1 pages=1024 page=16 checkpoints="every page" rows=4',
                 {"ranks": 1, "pages": 1024, "page": 16, "checkpoints": "every page", "rows": 4}, id="ready"),
    pytest.param("admitted request=req-3 woken=true prefix_hit=117", {"request": "req-3", "woken": "true", "prefix_hit": 117},
                 id="strings-stay-strings"),
    pytest.param("stats step_ms=1.25 accept_pct=50.0 tok_s=12", {"step_ms": 1.25, "accept_pct": 50.0, "tok_s": 12},
                 id="floats"),
    pytest.param(r'x msg="a \"quoted\" word" n=-3', {"msg": r'a \"quoted\" word', "n": -3}, id="quoted-not-unescaped"),
    pytest.param("no pairs here", {}, id="none"),
])
def test_kv(line, want):
    assert kv(line) == want


def test_log_lines_match_the_event_between_spaces(tmp_path):
    p = tmp_path / "server.log"
    p.write_text("INFO parked tokens=117\nDEBUG not kept request=req-2\nINFO unparked tokens=5\n"
                 "INFO serving\nINFO stats steps=3 parks=1\n")
    log = Log(p)
    assert log.lines("parked") == [{"tokens": 117}]
    assert log.lines("not kept") == [{"request": "req-2"}]
    assert log.count("serving") == 1  # an event at the end of its line counts too
    assert log.lines("stats") == [{"steps": 3, "parks": 1}]
    assert Log(tmp_path / "absent").lines("stats") == []


def test_server_flags_group_and_override():
    assert split_flags("--fault no-park --eager --capacity 64") == [
        ("--fault", ["no-park"]), ("--eager", []), ("--capacity", ["64"])]
    base = [("--backend", ["cpu"]), ("--capacity", ["16384"])]
    user = split_flags("--fault a --fault b --capacity 99")
    session = split_flags(["--capacity", "320", "--host-gib", "2"])
    assert merge_flags(base, user, session) == [
        "--backend", "cpu", "--fault", "a", "--fault", "b", "--capacity", "320", "--host-gib", "2"]


def test_greedy_names():
    assert _greedy(["--targets", "a", "b", "--scenarios", "x", "--out", "o"]) == [
        "--targets", "a,b", "--scenarios", "x", "--out", "o"]


# fixed inputs

def test_fixed_inputs():
    assert len(PROMPTS) == 12 and len(set(PROMPTS)) == 12
    assert [len(p.encode()) for p in PROMPTS[:4]] == [110, 90, 104, 80]
    assert SUFFIX == "\n\nNow explain that again for a ten-year-old, in two sentences."
    assert variant(3) == PROMPTS[3] and variant(13) == "13. " + PROMPTS[1]


# config

def _config(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "kern.toml"
    p.write_text(body)
    return p


def test_config_targets_resolve_relative_to_the_file(tmp_path):
    cfg = _config(tmp_path, f'[targets.a]\nmanifest = "{TOY}/toy-stateful-spec.json"\n'
                            f'reference = "{TOY}/toy-stateful-spec-ref.json"\n'
                            '[targets.b]\nmanifest = "sub/missing.json"\n')
    path, ts = load_targets(cfg, None)
    a, b = ts
    assert (a.name, a.lined, a.widest, a.spec, a.ranks, a.model, a.skipped) == (
        "a", True, 4, True, 1, "toy-stateful-spec", None)
    assert a.weights == tuple(sorted(TOY.glob("*.safetensors"))) and TOY / "salt.safetensors" in a.weights  # every *.safetensors beside the manifest
    assert b.manifest == tmp_path / "sub" / "missing.json" and "missing" in b.skipped
    assert [t.name for t in load_targets(cfg, ["b", "a"])[1]] == ["b", "a"]


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown target"):
        load_targets(_config(tmp_path, '[targets.a]\nmanifest = "x.json"\n'), ["a", "zz"])
    with pytest.raises(ConfigError, match="unknown key"):
        load_targets(_config(tmp_path, '[targets.a]\nmanifest = "x.json"\nbogus = 1\n'), None)
    _, ts = load_targets(_config(tmp_path, f'[targets.a]\nmanifest = "{TOY}/toy-paged.json"\nweights = ["nope.safetensors"]\n'), None)
    assert "weights" in ts[0].skipped


def test_packaged_config_has_the_eight_toys():
    _, ts = load_targets(ROOT / "manifests" / "toy.toml", None)
    got = {t.name: (t.lined, t.widest, t.floats) for t in ts}
    want = {"toy-paged": (False, 1, False), "toy-stateful": (True, 1, False), "toy-spec": (False, 4, False),
            "toy-stateful-spec": (True, 4, False), "toy-big": (False, 1, False), "toy-float": (False, 1, True),
            "toy-layers": (False, 1, False), "toy-attn": (False, 1, False)}
    assert got == want


# planning

def _target(name):
    return {t.name: t for t in load_targets(ROOT / "manifests" / "toy.toml", None)[1]}[name]


def test_plan_all_steps_in_session_order():
    names = [s.name for s in plan(_target("toy-stateful-spec"), None, True)]
    assert names == ["kern_test", "conc1", "run_equals_reference", "repeat", "turn2", "concurrent",
                     "spec_acceptance", "abort", "host_cold", "park_wake", "host_churn", "evict_drops", "ties", "host_frag",
                     "slot_growth", "rows1",
                     "wake_room", "params", "explore", "split", "frontends2", "moved", "reparented", "edges",
                     "stop_hit", "cold_burst", "evict_proof", "refcount", "preempt", "freed"]
    paged = [s.name for s in plan(_target("toy-paged"), None, False)]
    assert "slot_growth" not in paged and "rows1" not in paged and "spec_acceptance" not in paged
    assert "run_equals_reference" not in paged and "stage_loss" not in paged


@pytest.mark.parametrize("wanted, steps", [
    ({"park_wake"}, ["conc1", "repeat", "turn2", "host_cold", "park_wake"]),
    ({"abort"}, ["conc1", "abort"]),
    ({"spec_acceptance"}, ["conc1", "concurrent", "spec_acceptance"]),
    ({"wake_room", "kern_test"}, ["kern_test", "conc1", "repeat", "turn2", "wake_room"]),
    ({"policy_default"}, ["conc1", "repeat", "turn2"]),
    ({"policy_churn"}, ["conc1", "repeat", "turn2", "host_churn"]),
])
def test_plan_runs_dependencies(wanted, steps):
    assert [s.name for s in plan(_target("toy-spec"), wanted, True)] == steps


def test_every_check_is_named_once():
    assert len(CHECKS) == len(set(CHECKS))
    assert {"kern_test", "conc1_equals_run", "run_equals_reference", "repeat_hit", "turn2_hit",
            "turn2_warm_equals_run", "concurrent", "spec_acceptance", "abort", "turn2_warm_equals_cold",
            "park_wake", "slot_growth", "rows1_equals_run", "wake_room", "host_churn", "policy_default",
            "policy_host", "policy_churn", "policy_drop", "policy_slots", "policy_rows1", "policy_wake_room",
            "evict_drops"} <= set(CHECKS)


def test_checks_report_only_what_was_named():
    printed = []
    c = Checks({"abort"}, echo=printed.append)
    c.add("conc1_equals_run", True, "12/12")
    c.add("abort", False, "leaked")
    c.add("error", False, "boom")
    assert [x["name"] for x in c.list] == ["abort", "error"]
    assert printed == ["  [FAIL] abort: leaked", "  [FAIL] error: boom"]
    assert c.failed() == ["abort", "error"]


# the cache and its identity

def test_cache_round_trip_and_identity(tmp_path):
    p = tmp_path / "oracle.json"
    c = Cache(p, "id-1")
    assert c.get([1, 2], 8, 1) is None
    c.put([1, 2], 8, 1, [5, 6])
    assert json.loads(p.read_text()) == {"identity": "id-1", "answers": {key([1, 2], 8, 1): [5, 6]}}
    assert Cache(p, "id-1").get([1, 2], 8, 1) == [5, 6]
    assert Cache(p, "id-1").get([1, 2], 8, 4) is None  # rows are part of the key
    fresh = Cache(p, "id-2")  # another identity: thrown away whole
    assert fresh.discarded and fresh.answers == {}
    fresh.put([3], 1, 1, [7])
    assert Cache(p, "id-1").answers == {}


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for d in ("runtime", "toy", "manifests", "oracle", "kern"):
        (root / d).mkdir(parents=True)
        (root / d / "a.py").write_text(f"# {d}\n")
    (root / "m.json").write_text(json.dumps({"modules": {"toy": {"sha256": "aa"}}}))
    (root / "w.safetensors").write_bytes(b"\0" * 16)
    return root


def test_kern_run_identity_changes_with_each_input(tmp_path):
    root = _tree(tmp_path)
    ident = lambda backend="cpu": kern_run_identity(root / "m.json", [root / "w.safetensors"], backend, root=root)  # noqa: E731
    base = ident()
    assert ident() == base
    assert ident("gpu") != base
    (root / "runtime" / "a.py").write_text("# changed\n")
    changed_source = ident()
    assert changed_source != base
    (root / "runtime" / "b.py").write_text("")  # a new file counts too
    assert ident() != changed_source
    before = ident()
    (root / "kern" / "a.py").write_text("# changed\n")  # kern/tokens.py's EOS ends the runtime's answers
    assert ident() != before
    before = ident()
    (root / "w.safetensors").write_bytes(b"\1" * 16)
    assert ident() != before
    before = ident()
    (root / "m.json").write_text(json.dumps({"modules": {"toy": {"sha256": "bb"}}}))
    assert ident() != before
    before = ident()
    (root / "elsewhere.py").write_text("x = 1\n")  # outside the source dirs: irrelevant
    assert ident() == before


def test_reference_identity_and_kinds(tmp_path):
    m = tmp_path / "model.py"
    m.write_text("def generate(ids, n, manifest):\n    return [1] * n\n")
    a = reference_identity(m)
    m.write_text("def generate(ids, n, manifest):\n    return [2] * n\n")
    assert reference_identity(m) != a
    assert identity("reference", [b"x"]) != identity("kern run", [b"x"])
    assert identity("k", [b"ab", b"c"]) != identity("k", [b"a", b"bc"])


# the reference oracle

def test_reference_is_exact_and_excuses_nothing():
    ref = Reference(ROOT / "toy" / "model.py", TOY / "toy-stateful.json")
    assert ref.exact and ref.available and ref.accept_pct == (40, 60)
    ids = list(PROMPTS[0].encode())
    want = ref.run(ids, 16, 4)
    assert len(want) >= 6 and ref.run(ids, 16, 1) == want
    assert ref.near_tie(ids, 1, 2, 1) == ""  # exact: no near-tie to judge, nothing said but the tokens
    same = Same(ref, 1)
    assert not same.add("p", ids, want[:5] + [(want[5] + 1) % 256] + want[6:], want)
    assert same.excused == 0 and "first differs at token 5" in str(same) and "confident flip" not in str(same)


def test_reference_cache_and_load_errors(tmp_path):
    c = Cache(tmp_path / "o.json", "x")
    ref = Reference(ROOT / "toy" / "model.py", TOY / "toy-paged.json", cache=c)
    got = ref.run([1, 2, 3], 8)
    assert c.get([1, 2, 3], 8, 1) == got
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    with pytest.raises(ReferenceError, match="no generate"):
        load_model(bad)
    with pytest.raises(ReferenceError, match="cannot read"):
        load_model(tmp_path / "absent.py")
    boom = tmp_path / "boom.py"
    boom.write_text("raise RuntimeError('nope')\n")
    with pytest.raises(ReferenceError, match="import failed"):
        load_model(boom)


# reports

def _reports():
    return [
        {"target": "a", "skipped": None, "facts": {}, "counters": {"host": {"parked_lengths": {3, 1}}},
         "checks": [{"name": "conc1_equals_run", "ok": True, "note": "12/12 identical"},
                    {"name": "rows1_vs_spec", "ok": None, "note": "4/4"},
                    {"name": "abort", "ok": False, "note": "leaked: leases=1 <&>"}], "wall_s": 3.0},
        {"target": "b", "skipped": "manifest x missing", "facts": {}, "counters": {}, "checks": [], "wall_s": 0.0},
    ]


def test_report_summary_and_junit(tmp_path):
    reports = _reports()
    p = write_report(tmp_path, reports[0])
    assert json.loads(p.read_text())["counters"]["host"]["parked_lengths"] == [1, 3]
    table, code = write_summary(tmp_path, reports)
    assert code == 1 and "| a | 2 gated, 1 reported | FAIL: abort |" in table
    assert "| b | — | skipped: manifest x missing |" in (tmp_path / "summary.md").read_text()
    root = ET.fromstring(junit(reports).split("\n", 1)[1])
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["a", "b"]
    assert suites[0].get("failures") == "1" and suites[0].get("tests") == "3"
    fail = suites[0].findall("testcase")[2].find("failure")
    assert fail is not None and "leases=1 <&>" in fail.text
    assert suites[1].find("testcase/skipped").get("message") == "manifest x missing"


@pytest.mark.parametrize("checks, code", [
    pytest.param([[]], 0, id="ran-nothing-gated"),
    pytest.param([[{"name": "x", "ok": True, "note": ""}, {"name": "y", "ok": None, "note": ""}]], 0, id="pass"),
    pytest.param([[{"name": "x", "ok": True, "note": ""}], [{"name": "y", "ok": False, "note": ""}]], 1, id="fail"),
    pytest.param([None, None], 125, id="all-skipped"),
])
def test_exit_codes(tmp_path, checks, code):
    reports = [{"target": f"t{i}", "skipped": "why" if c is None else None, "checks": c or []}
               for i, c in enumerate(checks)]
    assert write_summary(tmp_path, reports)[1] == code


class _StatsClient:
    """A client whose server has (`raw` a dict) or lacks (`raw` None) ``/stats``; counts completions."""

    def __init__(self, raw):
        self.raw, self.completions = raw, 0

    def stats(self):
        return self.raw

    def complete(self, prompt, max_tokens):
        self.completions += 1


def test_flush_waits_out_the_log_window_only_for_a_server_without_stats(monkeypatch, tmp_path):
    """Property: `Stats.flush` before any read asks ``/stats`` first; a server that answers it costs
    no sleep and no request, and only one without it gets the 5 s window and the closing request."""
    import e2e.stats as stats_mod

    slept: list[float] = []
    monkeypatch.setattr(stats_mod.time, "sleep", slept.append)
    log = Log(tmp_path / "server.log")
    with_endpoint = _StatsClient({"counters": {}, "gauges": {}, "facts": {}})
    stats_mod.Stats(with_endpoint, log).flush()
    assert (slept, with_endpoint.completions) == ([], 0)
    without = _StatsClient(None)
    stats_mod.Stats(without, log).flush()
    assert sum(slept) > 5 and without.completions == 1


def test_the_explore_workload_is_the_seeds_and_reaches_its_kinds():
    """A seed gives one workload, drawn the same each time (so `--seed` replays it); other seeds give
    others; over a few seeds every kind of request (fresh, a conversation's next turn, a repeat) and
    both pool shapes (with and without a host tier) are drawn."""
    import types

    from e2e.scenarios import explore

    def run(seed):
        facts = {"page": 16, "rows": 1}
        r = types.SimpleNamespace(opts=types.SimpleNamespace(seed=seed), target=types.SimpleNamespace(model="toy-paged"),
                                  page=16, rows=1, facts={"default": facts}, host_page_bytes=lambda: 4096)
        rng = explore.rng_of(r)
        flags = explore.draw_flags(r, rng)
        return flags, explore.workload(r, rng)

    assert run(7) == run(7)
    seen = [run(s) for s in range(12)]
    assert len({str(w) for _, w in seen}) == 12
    kinds = {q["kind"] for _, w in seen for q in w}
    assert kinds == {"new", "turn", "repeat"}, kinds
    assert {("--host-gib" in f) for f, _ in seen} == {True, False}
    for flags, _ in seen:
        assert int(flags[flags.index("--capacity") + 1]) % 16 == 0


def test_a_session_told_warn_is_quiet_and_gets_a_port_never_picked_twice():
    """`--log-level warn|error` writes no ready or serving line: such a session picks its own port
    (`--port 0` replaced), one no other quiet session of the gate got."""
    from e2e.session import Session, unused_port, _with_port

    def s(*flags: str) -> Session:
        return Session("x", ["kern", "serve", "toy", "--port", "0", *flags], 0, "/tmp/x.log")

    assert s("--log-level", "warn").quiet() and s("--log-level", "ERROR").quiet() and s("--log-level=warn").quiet()
    assert not s().quiet() and not s("--log-level", "info").quiet() and not s("--log-level", "debug").quiet()
    assert _with_port(["a", "--port", "0", "b"], 4321) == ["a", "--port", "4321", "b"]
    picked = [unused_port() for _ in range(20)]
    assert len(set(picked)) == 20


def test_a_free_port_is_below_the_ephemeral_range_and_bindable():
    """`free_port` hands out ports a process started next can bind and that the kernel gives no `--port 0`
    server or outgoing connection meanwhile: below the ephemeral range (where it starts above 20001),
    at or over 20000 (clear of Ray's worker ports), each one free when picked."""
    import socket

    from e2e.session import _ephemeral_low, free_port

    low = _ephemeral_low()
    for _ in range(20):
        port = free_port()
        if low > 20001:
            assert 20000 <= port < low, (port, low)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_session_ports_are_one_block_per_target():
    """`e2e --port P`: session offsets are exactly 0 .. n-1 for n sessions, every session of the plan has one,
    and target i of --jobs adds n * i (e2e/cli.py), so no two targets' sessions share a port."""
    from e2e.scenarios import SESSION_PORTS, STEPS

    assert sorted(SESSION_PORTS.values()) == list(range(len(SESSION_PORTS)))
    assert {s.session for s in STEPS if s.session} == set(SESSION_PORTS)


def test_a_session_port_is_declared_once_on_its_first_row():
    """`session_ports` reads each session's offset from its first `Step` row and refuses rows that
    leave a session without one, give a second row of a session a port, or leave a gap in the offsets."""
    import dataclasses

    from e2e.scenarios import SESSION_PORTS, STEPS, session_ports

    assert session_ports(STEPS) == SESSION_PORTS
    first = next(i for i, s in enumerate(STEPS) if s.session == "host")
    unported = (*STEPS[:first], dataclasses.replace(STEPS[first], port=None), *STEPS[first + 1:])
    with pytest.raises(ValueError, match="session host gives no port"):
        session_ports(unported)
    second = next(i for i, s in enumerate(STEPS) if s.session == "host" and i > first)
    twice = (*STEPS[:second], dataclasses.replace(STEPS[second], port=1), *STEPS[second + 1:])
    with pytest.raises(ValueError, match="does not open a session"):
        session_ports(twice)
    gap = (*STEPS[:first], dataclasses.replace(STEPS[first], port=len(SESSION_PORTS)), *STEPS[first + 1:])
    with pytest.raises(ValueError, match="exactly 0 .."):
        session_ports(gap)


def test_a_gate_picked_port_taken_before_the_server_bound_it_is_picked_again():
    """`Run.open`: a session whose server exited saying its port is in use is started again on a new
    port when the gate picked the port (--port 0), up to `PORT_TRIES` times; a fixed --port is not
    retried (the user named it)."""
    from types import SimpleNamespace

    from e2e.gate import PORT_TRIES, Run
    from e2e.session import PortTaken

    def fake(port: int, fail: int):
        calls = []

        def _open(name, flags, cache):
            calls.append(name)
            if len(calls) <= fail:
                raise PortTaken(f"server {name}: port 1 is in use")
            return "live"

        return SimpleNamespace(opts=SimpleNamespace(port=port), close=lambda: None, _open=_open), calls

    run, calls = fake(0, PORT_TRIES - 1)
    assert Run.open(run, "tight", []) == "live" and len(calls) == PORT_TRIES
    run, calls = fake(0, PORT_TRIES)
    with pytest.raises(PortTaken):
        Run.open(run, "tight", [])
    assert len(calls) == PORT_TRIES
    run, calls = fake(9000, 1)
    with pytest.raises(PortTaken):
        Run.open(run, "tight", [])
    assert len(calls) == 1


def test_every_e2e_flag_is_a_gate_flags_field_with_its_default():
    """`e2e`'s click command builds one `GateFlags` from what it parsed: each option is a field, and the
    field's default is the option's (a flag added to one and not the other, or a default changed in one,
    fails here)."""
    import dataclasses

    from e2e.cli import cli
    from e2e.flags import GateFlags

    fields = {f.name: f.default for f in dataclasses.fields(GateFlags)}
    options = {p.name: p for p in cli.params if p.name not in ("help", "version")}
    assert set(options) == set(fields)
    for name, p in options.items():
        default = (tuple(p.default) if isinstance(p.default, (list, tuple)) else ()) if p.multiple else p.default
        assert default == fields[name], name
