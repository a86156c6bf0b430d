"""`Same` and `divergence` (reference/kern-e2e.md §2.1), against a scripted oracle."""

from __future__ import annotations

import pytest

from verdicts import EXCUSED_MAX, Same, divergence

PROMPT = [1, 2, 3]
WANT = [10, 11, 12, 13, 14, 15]


class Scripted:
    """Near-tie when ``len(context)`` is in `ties`; `run` replays `WANT` from the context's position."""

    def __init__(self, ties: set[int] | frozenset[int] | range = frozenset(), run_none: bool = False) -> None:
        self.ties = ties
        self.run_none = run_none
        self.probes: list[tuple[list[int], int, int, int]] = []
        self.runs: list[tuple[list[int], int, int]] = []

    def near_tie(self, context: list[int], a: int, b: int, rows: int) -> str | None:
        self.probes.append((list(context), a, b, rows))
        kind = "near-tie" if len(context) in self.ties else "confident flip"
        return f"{kind}: scripted at {len(context)}"

    def run(self, ids: list[int], steps: int, rows: int) -> list[int] | None:
        self.runs.append((list(ids), steps, rows))
        if self.run_none:
            return None
        return WANT[len(ids) - len(PROMPT):][:steps]


class Exact(Scripted):
    """The reference oracle: exact, so every divergence is a confident flip."""

    def near_tie(self, context: list[int], a: int, b: int, rows: int) -> str | None:
        self.probes.append((list(context), a, b, rows))
        return f"confident flip: the reference says {b}"


class Silent(Scripted):
    """An oracle with no evidence to give (multi-rank, no spare GPU, not bf16)."""

    def near_tie(self, context: list[int], a: int, b: int, rows: int) -> str | None:
        self.probes.append((list(context), a, b, rows))
        return None


ALL = range(0, 20)

# (oracle, got, ok, excused, same, matched, probes, runs)
CASES = [
    # reference §2.1 table
    pytest.param(Scripted({5}), [10, 11, 99, 13, 14, 77], False, 1, 0, 0, 2, 1, id="near-tie-then-flip"),
    pytest.param(Scripted({5}), [10, 11, 99, 13, 14, 15], True, 1, 0, 1, 1, 1, id="near-tie-excused"),
    pytest.param(Scripted(range(3, 20)), [90, 91, 92, 93, 94, 95], False, 3, 0, 0, 4, 3, id="all-different-capped"),
    pytest.param(Exact(), [10, 11, 99, 13, 14, 15], False, 0, 0, 0, 1, 0, id="exact-oracle-excuses-nothing"),
    pytest.param(Exact(), [90, 91, 92, 93, 94, 95], False, 0, 0, 0, 1, 0, id="exact-oracle-all-different"),
    # our own
    pytest.param(Scripted(ALL), list(WANT), True, 0, 1, 0, 0, 0, id="identical-asks-nothing"),
    pytest.param(Scripted(ALL), WANT[:4], False, 0, 0, 0, 0, 0, id="short-never-excused"),
    pytest.param(Scripted(ALL), WANT + [16], False, 0, 0, 0, 0, 0, id="long-never-excused"),
    pytest.param(Scripted(ALL), [], False, 0, 0, 0, 0, 0, id="empty-answer-never-excused"),
    pytest.param(Silent(), [10, 11, 99, 13, 14, 15], False, 0, 0, 0, 1, 0, id="no-evidence-not-excused"),
    pytest.param(Scripted(), [10, 11, 99, 13, 14, 15], False, 0, 0, 0, 1, 0, id="confident-flip"),
    pytest.param(Scripted({8}), [10, 11, 12, 13, 14, 99], True, 1, 0, 1, 1, 0, id="last-token-needs-no-run"),
    pytest.param(Scripted({3, 5, 7}), [90, 11, 91, 13, 92, 15], True, 3, 0, 1, 3, 3, id="three-excused-match"),
    pytest.param(Scripted({3, 5, 7, 8}), [90, 11, 91, 13, 92, 93], False, 3, 0, 0, 4, 3, id="fourth-not-excused"),
    pytest.param(Scripted({5}), [10, 11, 99, 13], False, 1, 0, 0, 1, 1, id="near-tie-then-length"),
    pytest.param(Scripted({5}, run_none=True), [10, 11, 99, 13, 14, 15], False, 1, 0, 0, 1, 1, id="no-continuation"),
]


@pytest.mark.parametrize("oracle, got, ok, excused, same, matched, probes, runs", CASES)
def test_same_add(
    oracle: Scripted, got: list[int], ok: bool, excused: int, same: int, matched: int, probes: int, runs: int
) -> None:
    s = Same(oracle, rows=1)
    assert s.add("p", PROMPT, got, list(WANT)) is ok
    assert (s.ok, s.excused, s.same, s.matched, s.n) == (ok, excused, same, matched, 1)
    assert (len(oracle.probes), len(oracle.runs)) == (probes, runs)
    assert bool(s.notes) is not (same == 1)
    assert s.excused <= EXCUSED_MAX


def test_probe_context_is_the_agreed_prefix_and_rows_pass_through() -> None:
    oracle = Scripted({5})
    Same(oracle, rows=4).add("p", PROMPT, [10, 11, 99, 13, 14, 77], WANT)
    # first probe: prompt + agreed tokens; server's token vs the oracle's
    assert oracle.probes[0] == ([1, 2, 3, 10, 11], 99, 12, 4)
    # the continuation runs from the server's token and keeps the total length
    assert oracle.runs == [([1, 2, 3, 10, 11, 99], 3, 4)]
    # the second probe is judged on the sequence the server ran
    assert oracle.probes[1] == ([1, 2, 3, 10, 11, 99, 13, 14], 77, 15, 4)


def test_notes_joined_with_then_under_label() -> None:
    s = Same(Scripted({5}), rows=1)
    s.add("prompt 3", PROMPT, [10, 11, 99, 13, 14, 77], WANT)
    assert s.notes == [
        "prompt 3: first differs at token 2 (got 6 tokens, want 6): got [99, 13, 14, 77] want [12, 13, 14, 15] (near-tie: scripted at 5)"
        "; then first differs at token 5 (got 6 tokens, want 6): got [77] want [15] (confident flip: scripted at 8)"
    ]


def test_length_note_has_no_verdict() -> None:
    s = Same(Scripted(ALL), rows=1)
    s.add("p1", PROMPT, WANT[:4], WANT)
    assert s.notes == ["p1: first differs at token 4 (got 4 tokens, want 6): got [] want [14, 15]"]


def test_no_evidence_note_has_no_parentheses() -> None:
    s = Same(Silent(), rows=1)
    s.add("p1", PROMPT, [10, 11, 99, 13, 14, 15], WANT)
    assert s.notes == ["p1: first differs at token 2 (got 6 tokens, want 6): got [99, 13, 14, 15] want [12, 13, 14, 15]"]


def test_no_continuation_is_noted() -> None:
    s = Same(Scripted({5}, run_none=True), rows=1)
    s.add("p1", PROMPT, [10, 11, 99, 13, 14, 15], WANT)
    assert s.notes[0].endswith("; then no continuation from the oracle")


def test_cap_is_per_answer_total_is_not() -> None:
    oracle = Scripted({3, 5})
    s = Same(oracle, rows=1)
    for label in ("a", "b"):
        assert s.add(label, PROMPT, [90, 11, 91, 13, 14, 15], WANT)
    assert (s.ok, s.n, s.same, s.matched, s.excused) == (True, 2, 0, 2, 4)


def test_same_and_matched_counted_apart() -> None:
    s = Same(Scripted({5}), rows=1)
    s.add("a", PROMPT, WANT, WANT)
    s.add("b", PROMPT, [10, 11, 99, 13, 14, 15], WANT)
    assert (s.ok, s.same, s.matched) == (True, 1, 1)
    s.add("c", PROMPT, [10, 11, 99, 13, 14, 77], WANT)
    assert (s.ok, s.n, s.same, s.matched, s.excused) == (False, 3, 1, 1, 2)


@pytest.mark.parametrize(
    "answers, text",
    [
        pytest.param([], "0/0 identical", id="nothing-added"),
        pytest.param([WANT, WANT], "2/2 identical", id="all-identical"),
        pytest.param(
            [WANT, [10, 11, 99, 13, 14, 15]],
            "1/2 identical, 1 after 1 near-tie tokens; b: first differs at token 2 (got 6 tokens, want 6): got [99, 13, 14, 15] want "
            "[12, 13, 14, 15] (near-tie: scripted at 5)",
            id="excused-shown",
        ),
        pytest.param(
            [WANT[:5], [10, 11, 12, 77, 14, 15]],
            "0/2 identical; a: first differs at token 5 (got 5 tokens, want 6): got [] want [15]; b: first differs at token 3 (got 6 tokens, "
            "want 6): got [77, 14, 15] want [13, 14, 15] (confident flip: scripted at 6)",
            id="notes-of-each-answer",
        ),
    ],
)
def test_str(answers: list[list[int]], text: str) -> None:
    s = Same(Scripted({5}), rows=1)
    for label, got in zip("abcdef", answers):
        s.add(label, PROMPT, got, WANT)
    assert str(s) == text


def test_inputs_not_mutated_and_sequences_accepted() -> None:
    want = list(WANT)
    got = (10, 11, 99, 13, 14, 15)
    s = Same(Scripted({5}), rows=1)
    assert s.add("p", tuple(PROMPT), got, want)
    assert want == WANT


@pytest.mark.parametrize(
    "a, b, text",
    [
        pytest.param([1, 2, 3], [1, 2, 3], "identical (3 tokens)", id="identical"),
        pytest.param([], [], "identical (0 tokens)", id="both-empty"),
        pytest.param(
            [1, 2, 3, 4, 5, 6], [1, 9, 3, 4, 5, 6], "first differs at token 1 (got 6 tokens, want 6): got [2, 3, 4, 5] want [9, 3, 4, 5]",
            id="first-mismatch-four-of-context",
        ),
        pytest.param([1, 2], [1, 2, 3], "first differs at token 2 (got 2 tokens, want 3): got [] want [3]", id="a-shorter"),
        pytest.param(
            [1, 2, 3, 4, 5, 6, 7], [1, 2], "first differs at token 2 (got 7 tokens, want 2): got [3, 4, 5, 6] want []", id="b-shorter"
        ),
        pytest.param([5, 2], [1, 2, 3], "first differs at token 0 (got 2 tokens, want 3): got [5, 2] want [1, 2, 3]", id="mismatch-before-end"),
        pytest.param([], [7], "first differs at token 0 (got 0 tokens, want 1): got [] want [7]", id="a-empty"),
    ],
)
def test_divergence(a: list[int], b: list[int], text: str) -> None:
    assert divergence(a, b) == text


class Moved:
    """An oracle whose answer from the prompt stops after 3 tokens, and whose continuation after the
    server's near-tie token 99 is `after` (a near-tie can move where an answer stops)."""

    def __init__(self, after: list[int]):
        self.after = after
        self.runs: list[tuple[list[int], int]] = []

    def near_tie(self, context, a, b, rows):
        return "near-tie: scripted"

    def run(self, ids, steps, rows):
        self.runs.append((list(ids), steps))
        return self.after[:steps]


def test_a_near_tie_may_move_where_the_answer_stops() -> None:
    """After an excused token the oracle continues as far as the longer answer: the server's longer
    answer matches when the oracle's continuation stops where the server's did, and fails when it
    stops elsewhere (a length mismatch, never excused)."""
    s = Same(Moved([20, 21, 22]), rows=1)
    assert s.add("later", PROMPT, [10, 99, 20, 21, 22], [10, 11, 12])
    assert s.matched == 1 and s.oracle.runs == [([1, 2, 3, 10, 99], 3)]
    s = Same(Moved([20, 21]), rows=1)
    assert not s.add("elsewhere", PROMPT, [10, 99, 20, 21, 22], [10, 11, 12])
    assert s.notes[0].endswith("; then first differs at token 4 (got 5 tokens, want 4): got [22] want []")


def test_a_servers_wrong_answer_says_what_it_was_served_from_and_its_prompt():
    s = Same(Exact(), rows=1)
    assert s.add("p0", [1, 2], [10, 11], [10, 11], (0, None))
    assert not s.add("p1", list(b"hello"), [12, 13], [12, 14], (4, "host"))
    assert not s.add("p2", [300, 1], [1], [2], (None, None))
    assert s.notes[0].startswith("p1 [served from cached_tokens 4, tier host; prompt (5 tokens) 'hello']: first differs")
    assert s.notes[1].startswith("p2 [served from cached_tokens not told; prompt (2 tokens) [300, 1]]: first differs")
    assert s.first == {"label": "p1", "cached": 4, "tier": "host", "prompt": "prompt (5 tokens) 'hello'",
                       "divergence": "first differs at token 1 (got 2 tokens, want 2): got [13] want [14] "
                                     "(confident flip: the reference says 14)"}
