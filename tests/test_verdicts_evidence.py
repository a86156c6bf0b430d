"""`verdicts.evidence`: the verdict on one disputed token from a probe's logits, and the probe's
agreement with the reference's logits."""

from __future__ import annotations

import pytest

from verdicts import PROBE_AGREE_ULPS, Same, evidence, probe_disagreement

# top 29.25 (ULP 0.125): 29.125 is 1 ULP down, 28.75 4 ULPs, 28.625 5 ULPs
PROBE = [29.25, 29.125, 28.75, 28.625, 3.0]


@pytest.mark.parametrize("a,b,verdict", [
    (0, 1, "near-tie"),          # the top and 1 ULP down
    (1, 2, "near-tie"),          # 1 and 4 ULPs down: the limit is inclusive
    (0, 3, "confident flip"),    # 5 ULPs down
    (4, 0, "confident flip"),    # far below
])
def test_the_four_ulp_rule_on_the_probe(a, b, verdict):
    text = evidence(PROBE, a, b)
    assert text.startswith(verdict + ":"), text
    assert f"server's {a} #" in text and f"oracle's {b} #" in text


def test_a_probe_that_disagrees_with_the_reference_is_no_evidence():
    """Every logit within PROBE_AGREE_ULPS ULPs of the top is agreement; one logit further off
    (or another vocabulary) makes the evidence void, near-tie or not."""
    ok = [x + PROBE_AGREE_ULPS * 0.125 for x in PROBE]
    assert probe_disagreement(PROBE, ok) is None
    assert evidence(PROBE, 0, 1, ok).startswith("near-tie")
    off = list(PROBE)
    off[3] += (PROBE_AGREE_ULPS + 1) * 0.125
    assert probe_disagreement(PROBE, off) == (3, PROBE_AGREE_ULPS + 1)
    text = evidence(PROBE, 0, 1, off)
    assert text.startswith("no evidence (the probe disagrees with the reference: token 3 is 3.0 ULPs off")
    assert evidence(PROBE, 0, 1, PROBE[:-1]).startswith("no evidence")


def test_tokens_outside_the_probe_are_no_evidence():
    assert evidence(PROBE, 0, 9).startswith("no evidence")


class ProbeOracle:
    """An oracle whose answer is `want`, with the probe's logits as its evidence at every step."""

    def __init__(self, prompt, want, logits):
        self.prompt, self.want, self.logits = prompt, want, logits

    def near_tie(self, context, a, b, rows):
        return evidence(self.logits, a, b)

    def run(self, ids, steps, rows):
        return self.want[len(ids) - len(self.prompt):][:steps]


def test_same_excuses_on_probe_evidence_and_only_three_per_answer():
    """Tokens 0 and 1 are a near-tie, 0 and 3 are not: a flip 0→1 is excused, 0→3 is not, and a
    fourth excusable flip in one answer fails it."""
    prompt = [7]
    same = Same(ProbeOracle(prompt, [0, 0, 0, 0, 0], PROBE), 1)
    assert same.add("one", prompt, [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]) and same.excused == 1
    assert not same.add("confident", prompt, [0, 3, 0, 0, 0], [0, 0, 0, 0, 0])
    four = Same(ProbeOracle(prompt, [0, 0, 0, 0, 0], PROBE), 1)
    assert not four.add("four", prompt, [1, 1, 1, 1, 0], [0, 0, 0, 0, 0]) and four.excused == 3
    assert "near-tie" in four.notes[0].split("; then ")[-1]
