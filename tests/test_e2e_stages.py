"""Targets served through pipeline stages: the config's `stages` reaches every server command, the
shipped toy-pp.toml names toy-layers through 2 and 3 stages (out of toy.toml, which the Rust kern gate
driver reads and which must keep to its fields), and `stages_equal_single` holds a staged target's
serial answers and hits to its single process's. The last test gates toy-layers and toy-layers-pp3
on the CPU."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

from e2e.config import load_targets
from e2e.gate import Options, Run
from e2e.stages import CHECK, compare, record, twin
from manifests.config import PACKAGED, PACKAGED_PP, resolve
from tests.test_e2e_driver import EXIT_PASS, checks, gate

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "manifests" / "toy"
STAGED = ("toy-layers-pp2", "toy-layers-pp3")
# reference/kern-e2e.md §3: a target table's fields; the driver denies any other (the whole file fails)
RUST_FIELDS = {"manifest", "reference", "kernels", "weights", "tokenizer"}


def _packaged(tmp_path, monkeypatch, names=None):
    monkeypatch.chdir(tmp_path)  # no kern.toml above: the packaged configs
    return load_targets(None, names)[1]


def _argv(cmd: list[str], flag: str) -> str | None:
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def test_the_packaged_targets_include_toy_layers_through_two_and_three_stages(tmp_path, monkeypatch):
    ts = {t.name: t for t in _packaged(tmp_path, monkeypatch)}
    assert {n: (t.stages, t.config) for n, t in ts.items() if t.stages > 1} == {
        "toy-layers-pp2": (2, PACKAGED_PP), "toy-layers-pp3": (3, PACKAGED_PP)}
    single = ts["toy-layers"]
    assert single.stages == 1 and single.config == PACKAGED
    for n in STAGED:
        t = ts[n]
        assert (t.manifest, t.reference, t.weights, t.model, t.skipped) == \
            (single.manifest, single.reference, single.weights, single.model, None)
        assert twin(t, list(ts.values())) == single
    assert twin(single, list(ts.values())) is None
    # `kern serve toy-layers-pp2` (no --config) finds it too
    assert resolve("toy-layers-pp2").stages == 2


def test_toy_toml_keeps_to_the_rust_drivers_fields():
    for name, t in tomllib.loads(PACKAGED.read_text())["targets"].items():
        assert set(t) <= RUST_FIELDS, f"{name}: {sorted(set(t) - RUST_FIELDS)} would make the Rust driver refuse toy.toml"
    assert set(tomllib.loads(PACKAGED_PP.read_text())["targets"]) == set(STAGED)


def test_the_config_stages_key_reaches_every_server_command(tmp_path, monkeypatch):
    ts = {t.name: t for t in _packaged(tmp_path, monkeypatch, ["toy-layers", *STAGED])}
    opts = Options(PACKAGED, tmp_path / "out", backend="cpu", server_flags="--pp-timeout 30")
    for name, n in (("toy-layers", None), ("toy-layers-pp2", "2"), ("toy-layers-pp3", "3")):
        r = Run(ts[name], opts, None, None, None)
        for session, flags in (("default", []), ("host", ["--capacity", "1040", "--host-gib", "2", "--max-seqs", "4"])):
            cmd, _ = r.command(session, flags)
            assert _argv(cmd, "--stages") == n, cmd
            assert _argv(cmd, "--config") == str(PACKAGED_PP if n else PACKAGED), cmd
            assert _argv(cmd, "--pp-timeout") == "30" and cmd[cmd.index("serve") + 1] == name
            assert _argv(cmd, "--capacity") == (flags[1] if flags else "16384")
    # a config of one's own: its `stages` and its own path
    cfg = tmp_path / "kern.toml"
    cfg.write_text(f'[targets.deep]\nmanifest = "{TOY}/toy-layers.json"\nweights = ["{TOY}/salt.safetensors", '
                   f'"{TOY}/layers.safetensors"]\nstages = 4\n')
    (t,) = load_targets(cfg, None)[1]
    cmd, _ = Run(t, Options(cfg, tmp_path / "out"), None, None, None).command("default", [])
    assert (_argv(cmd, "--stages"), _argv(cmd, "--config")) == ("4", str(cfg))


def _report(target: str, served: list[dict], counters: dict, *extra) -> dict:
    return {"target": target, "skipped": None, "checks": [{"name": "conc1_equals_run", "ok": True, "note": ""}, *extra],
            "hits": {"served": served, "counters": counters}}


SERVED = [{"session": "default", "step": "repeat", "request": f"req-{i}", "tokens": 16, "ids": f"d{i}",
           "cached": c, "tier": "device", "snapshot": "kept"} for i, c in enumerate([96, 80, 96, 64])]
COUNTERS = {"host": {"parks": 16, "wakes": 5, "host_hits": 5}}


def test_equal_hits_pass_and_any_difference_fails():
    single = _report("toy-layers", SERVED, COUNTERS)
    ok, note = compare(_report("toy-layers-pp2", copy.deepcopy(SERVED), copy.deepcopy(COUNTERS)), single)
    assert ok and "repeat cached [96, 80, 96, 64]" in note and note.endswith("all equal"), note
    served = copy.deepcopy(SERVED)
    served[2]["cached"] = 80
    ok, note = compare(_report("toy-layers-pp2", served, COUNTERS), single)
    assert not ok and "req-2: cached 80 (toy-layers 96)" in note, note
    served = copy.deepcopy(SERVED)
    served[0]["ids"] = "other"
    assert not compare(_report("toy-layers-pp2", served, COUNTERS), single)[0]
    assert not compare(_report("toy-layers-pp2", SERVED[:3], COUNTERS), single)[0]
    ok, note = compare(_report("toy-layers-pp2", SERVED, {"host": {**COUNTERS["host"], "wakes": 4}}), single)
    assert not ok and "host counters: wakes 4 (toy-layers 5)" in note, note


def test_without_its_single_process_the_check_is_only_reported(tmp_path, monkeypatch):
    ts = {t.name: t for t in _packaged(tmp_path, monkeypatch, ["toy-layers", *STAGED])}
    printed = []
    reports = [_report("toy-layers-pp2", SERVED, COUNTERS), _report("toy-layers-pp3", SERVED, COUNTERS)]
    record([ts["toy-layers-pp2"], ts["toy-layers-pp3"]], reports, None, printed.append)
    assert [c for r in reports for c in r["checks"] if c["name"] == CHECK and c["ok"] is None] and len(printed) == 2
    errored = _report("toy-layers", SERVED, COUNTERS, {"name": "error", "ok": False, "note": "boom"})
    reports = [errored, _report("toy-layers-pp2", SERVED, COUNTERS)]
    record([ts["toy-layers"], ts["toy-layers-pp2"]], reports, None, printed.append)
    assert checks(reports[1])[CHECK]["ok"] is None and "toy-layers ended with an error" in checks(reports[1])[CHECK]["note"]
    reports = [_report("toy-layers", SERVED, COUNTERS), _report("toy-layers-pp2", SERVED, COUNTERS)]
    record([ts["toy-layers"], ts["toy-layers-pp2"]], reports, {"park_wake"}, printed.append)  # not selected
    assert CHECK not in checks(reports[1]) and CHECK not in checks(reports[0])
    record([ts["toy-layers"], ts["toy-layers-pp2"]], reports, None, printed.append)
    assert CHECK not in checks(reports[0]) and checks(reports[1])[CHECK]["ok"] is True


# the checks of the sessions whose sizing a pipeline changes (host tier per stage, host_used_bytes)
SIZED = ("park_wake", "policy_host", "host_churn", "policy_churn", "evict_drops", "policy_drop")


def test_toy_layers_through_one_and_three_stages_answers_and_hits_alike(tmp_path, monkeypatch):
    """The gate on toy-layers served by 1 and 3 stages at 16 tokens, the steps stages_equal_single
    compares (every session, all serial here; plain `e2e` gates the rest, and toy-layers-pp2): 3
    stages, whose host pages differ (16, 32 and 16 KiB), answer and hit as toy-layers, request by
    request, and the host-tier checks pass through the pipeline. About 3 minutes on 2 busy cores."""
    monkeypatch.chdir(tmp_path)
    staged = ("toy-layers-pp3",)
    code, reports = gate(tmp_path, "--targets", "toy-layers", *staged, "--scenarios", CHECK, *SIZED, max_tokens=16)
    got = {n: checks(reports[n]) for n in ("toy-layers", *staged)}
    assert code == EXIT_PASS, {n: [c for c in g.values() if c["ok"] is False] for n, g in got.items()}
    assert set(got["toy-layers"]) == set(SIZED)
    for n in staged:
        assert set(got[n]) == {*SIZED, CHECK} and all(c["ok"] for c in got[n].values()), got[n]
        assert reports[n]["hits"] == reports["toy-layers"]["hits"]
        assert reports[n]["counters"]["host"]["parks"] >= 1 and reports[n]["counters"]["churn"]["host_evictions"] >= 1
    assert reports["toy-layers"]["hits"]["served"] and set(reports["toy-layers"]["hits"]["counters"]) == \
        {"default", "host", "churn", "drop", "wake_room"}  # no concurrent step asked for: default is serial too


def test_only_the_sessions_a_staged_target_does_not_run_are_left_out():
    """The single process's params and explore sessions, the wild workloads (blocks, cold_burst, tight),
    fair admission's long_room and the process layouts split and frontends2 (steps that do not apply to a staged target: its single process runs
    the same cache and admission code, e2e/scenarios/__init__.py says why each) are left out of the
    comparison; a staged target that answered fewer requests in a session it runs still fails."""
    from e2e.config import load_targets
    from e2e.stages import single_only

    _, chosen = load_targets(None, ["toy-layers", "toy-layers-pp2"])
    single, staged = chosen
    assert single_only(staged, single) == {"params", "explore", "blocks", "cold_burst", "tight", "long_room", "recency",
                                             "split", "frontends2", "freed", "generated"}
    extra = [{**SERVED[0], "session": "explore", "step": "explore"}]
    ref = _report("toy-layers", copy.deepcopy(SERVED) + extra, copy.deepcopy(COUNTERS))
    assert compare(_report("toy-layers-pp2", copy.deepcopy(SERVED), COUNTERS), ref, {"explore"})[0]
    assert not compare(_report("toy-layers-pp2", copy.deepcopy(SERVED), COUNTERS), ref)[0]
    assert not compare(_report("toy-layers-pp2", SERVED[:3], COUNTERS), ref, {"explore"})[0]
