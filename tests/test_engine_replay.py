"""A shrunk case replays against the engine that failed (issue 39 item 3).

`e2e --shrink` under `--engine` records the engine's command, capabilities, facts and working folder in
the case; `e2e --replay-case` and the generated pytest file start that engine, so a case shrunk from a
planted dict-engine bug fails (exit 1) with the bug in and passes (exit 0) when the same engine command
without its bug switch stands in (`--engine` at the replay, `E2E_REPLAY_ENGINE` for the pytest file).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from e2e.case import Case, replay_file
from e2e.cli import main

ROOT = Path(__file__).resolve().parent.parent
DICT = f"{sys.executable} {ROOT / 'tests' / 'engines' / 'dict_engine.py'} --port {{port}} --model {{model}}"
BUGGY = DICT + " --bug off-by-one"  # a resumed prefix's last token fed twice: conc1_equals_run fails


def e2e(*args: str) -> int:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    return exc.value.code


@pytest.fixture(scope="module")
def shrunk(tmp_path_factory) -> Path:
    """The dict engine's off-by-one bug, gated on toy-paged and shrunk: the case file."""
    out = tmp_path_factory.mktemp("shrink") / "results"
    code = e2e("--engine", BUGGY, "--targets", "toy-paged", "--scenarios", "conc1_equals_run", "--max-tokens", "2",
               "--jobs", "1", "--shrink", "--out", str(out))
    assert code == 1
    cases = sorted((out / "toy-paged").glob("case_*.json"))
    assert len(cases) == 1, list((out / "toy-paged").iterdir())
    return cases[0]


def test_the_case_records_the_engine_that_failed(shrunk):
    case = Case.load(shrunk)
    assert case.engine is not None and case.engine["command"] == BUGGY
    assert case.engine["name"] == "dict-engine" and "cached-tokens" in case.engine["capabilities"]
    assert case.engine["facts"]["page"] == 1 and Path(case.engine["cwd"]).is_dir()
    assert case.gate["backend"] == "cpu" and case.size()[0] < 12
    summary = (shrunk.parent.parent / "summary.md").read_text()
    assert f"e2e --replay-case {shrunk}" in summary  # the summary names the case file


def test_the_replay_fails_against_the_buggy_engine_and_passes_without_the_bug(shrunk, tmp_path, capsys):
    assert e2e("--replay-case", str(shrunk), "--out", str(tmp_path / "a")) == 1
    out = capsys.readouterr().out
    assert "--bug off-by-one" in out and "FAIL: answers" in out
    assert e2e("--replay-case", str(shrunk), "--engine", DICT, "--out", str(tmp_path / "b")) == 0
    assert "pass" in capsys.readouterr().out


def test_the_generated_pytest_starts_the_engine_that_failed(shrunk, monkeypatch):
    test_file = shrunk.with_name(f"test_{shrunk.stem}.py")
    spec = importlib.util.spec_from_file_location("generated_case", test_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    test = getattr(module, f"test_{shrunk.stem}")
    with pytest.raises(AssertionError, match="answers"):
        test()
    monkeypatch.setenv("E2E_REPLAY_ENGINE", DICT)
    test()
    failed, _ = replay_file(shrunk, engine=DICT)
    assert failed == []


def test_a_case_from_before_engines_were_recorded_still_loads(tmp_path):
    d = json.loads(Case("toy-paged", "default", "conc1_equals_run", [], []).to_json())
    for key in ("engine", "config", "gate"):
        del d[key]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(d))
    case = Case.load(path)
    assert case.engine is None and case.gate == {}


def test_the_failure_says_what_the_first_wrong_answer_was_served_from(shrunk):
    out = shrunk.parent.parent
    report = json.loads((out / "toy-paged" / "report.json").read_text())
    check = next(c for c in report["checks"] if c["name"] == "conc1_equals_run")
    first = check["first"]
    assert first["cached"] > 0 and first["prompt"].startswith("prompt (") and first["label"] in check["note"]
    assert f"[served from cached_tokens {first['cached']}; prompt (" in check["note"]
    lead = (out / "summary.md").read_text().splitlines()[2]
    assert lead.startswith(f"**First failure: toy-paged: conc1_equals_run**: {first['label']} was served from "
                           f"cached_tokens {first['cached']}: first differs at token ")
