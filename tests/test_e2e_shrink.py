"""Shrinking a failing session to a small replayable case (e2e/case.py, `e2e --shrink`, `--replay-case`).

Properties: `ddmin` keeps failing and ends 1-minimal (for a failure that needs a hidden set of
requests, it finds exactly that set); a case survives its file; and end to end, a planted fault's
failure shrinks to a case of at most 3 requests that fails replayed with the fault and passes
without it.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2e.case import Case, ddmin
from e2e.cli import main


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.data())
def test_ddmin_finds_exactly_the_requests_a_failure_needs(n, data):
    items = list(range(n))
    needed = set(data.draw(st.sets(st.sampled_from(items), min_size=1, max_size=min(n, 4))))
    calls = []

    def fails(xs):
        calls.append(len(xs))
        return needed <= set(xs)

    got = ddmin(items, fails)
    assert set(got) == needed and got == sorted(got)  # order kept
    assert len(calls) <= 4 * n * max(len(needed), 1) + 8


def test_a_case_survives_its_file_and_a_bad_file_is_named(tmp_path):
    c = Case("toy-paged", "drop", "policy_drop", ["--capacity", "384"],
             [{"kind": "request", "path": "/v1/completions", "body": {"prompt": [1, 2], "max_tokens": 3}},
              {"kind": "burst", "calls": [[[5], 2], ["hi", 4]]}], seed=3)
    p = tmp_path / "c.json"
    p.write_text(c.to_json())
    assert Case.load(p) == c and c.size() == (3, 5, 9)
    p.write_text(json.dumps({"target": "x"}))
    with pytest.raises(ValueError, match="not a case file"):
        Case.load(p)


def test_shrink_turns_a_faults_failure_into_a_case_of_at_most_three_requests(tmp_path, capsys):
    out = tmp_path / "results"
    argv = ["--out", str(out), "--backend", "cpu", "--max-tokens", "12", "--targets", "toy-paged",
            "--scenarios", "conc1_equals_run", "--server-flags", "--fault wrong-token", "--shrink"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 1
    cases = list((out / "toy-paged").glob("case_*.json"))
    assert len(cases) == 1, capsys.readouterr().out
    case = Case.load(cases[0])
    assert case.check == "conc1_equals_run" and 1 <= case.size()[0] <= 3, case
    assert "--fault" in case.flags and (out / "toy-paged" / f"test_{cases[0].stem}.py").is_file()
    with pytest.raises(SystemExit) as exc:  # the fault is in the case's flags: it still fails
        main(["--replay-case", str(cases[0]), "--out", str(tmp_path / "r1"), "--backend", "cpu"])
    assert exc.value.code == 1
    fixed = Case(**{**case.__dict__, "flags": [f for f in case.flags if f not in ("--fault", "wrong-token")]})
    p = tmp_path / "fixed.json"
    p.write_text(fixed.to_json())
    with pytest.raises(SystemExit) as exc:  # the same requests on a server without the bug pass
        main(["--replay-case", str(p), "--out", str(tmp_path / "r2"), "--backend", "cpu"])
    assert exc.value.code == 0
