"""The gate on the float toy (toy-float): near-ties excused on probe evidence, and its negative
controls, each failing the gate.

The runtime adds in another order than toy/model.py, so a few steps in a thousand are true
near-ties whose argmax differs. At 20 tokens prompt 1's answer diverges from the reference at
token 17 by a bf16 tie: the probe (kern run's logits at that step) agrees with the reference's
logits and puts both tokens within 4 ULPs of the top, so it is excused. A token flipped that is
no near-tie, more than three excuses in one answer, and a probe that disagrees with the
reference's logits each fail the check.
"""

from __future__ import annotations

from pathlib import Path

from tests.test_e2e_driver import EXIT_FAIL, EXIT_PASS, checks, gate

ROOT = Path(__file__).resolve().parent.parent
T = "toy-float"


def test_the_gate_excuses_a_near_tie_on_probe_evidence(tmp_path):
    code, reports = gate(tmp_path, "--targets", T, "--scenarios", "conc1_equals_run", "run_equals_reference",
                         max_tokens=20)
    r = reports[T]
    got = checks(r)
    assert code == EXIT_PASS, got
    for name in ("conc1_equals_run", "run_equals_reference"):
        assert r["near_ties"][name] >= 1, r["near_ties"]
        note = got[name]["note"]
        assert "after" in note and "(near-tie: top " in note, note
    assert list((tmp_path / "results" / T / "probes").glob("probe-*/decode0.logits.bin"))


def test_a_flipped_token_that_is_no_near_tie_fails(tmp_path):
    code, reports = gate(tmp_path, "--targets", T, "--scenarios", "conc1_equals_run",
                         "--server-flags", "--fault wrong-token", max_tokens=8)
    got = checks(reports[T])
    assert code == EXIT_FAIL and got["conc1_equals_run"]["ok"] is False, got
    assert "(confident flip: top " in got["conc1_equals_run"]["note"], got


def test_more_than_three_excuses_in_one_answer_fail(tmp_path):
    """flip-near-ties takes the runner-up whenever it is within 4 ULPs: every such token is
    excusable, but the fourth in one answer is not excused."""
    code, reports = gate(tmp_path, "--targets", T, "--scenarios", "conc1_equals_run",
                         "--server-flags", "--fault flip-near-ties", max_tokens=40)
    r = reports[T]
    got = checks(r)
    assert code == EXIT_FAIL and got["conc1_equals_run"]["ok"] is False, got
    answers = got["conc1_equals_run"]["note"].split("; prompt ")
    assert any(a.count("(near-tie: top ") >= 4 for a in answers), answers
    assert r["near_ties"]["conc1_equals_run"] >= 3


def test_a_probe_that_disagrees_with_the_reference_fails(tmp_path):
    """A model.py whose logits sit 3 ULPs above the runtime's (its answers unchanged): at the
    near-tie the probe disagrees with it, so nothing is excused."""
    src = (ROOT / "toy" / "model.py").read_text()
    old = "    return [int(b) for b in float_logits(acc, s)]"
    assert old in src
    model = tmp_path / "model.py"
    model.write_text(src.replace(old, "    return [int(b) + 3 for b in float_logits(acc, s)]"))
    code, reports = gate(tmp_path, "--targets", T, "--scenarios", "conc1_equals_run", "--reference", str(model),
                         max_tokens=20)
    got = checks(reports[T])
    assert code == EXIT_FAIL and got["conc1_equals_run"]["ok"] is False, got
    assert "no evidence (the probe disagrees with the reference: token " in got["conc1_equals_run"]["note"], got
