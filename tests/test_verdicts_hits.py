"""`turn2_hit` (reference/kern-e2e.md §2.4)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from verdicts import turn2_hit


def identity(n: int) -> int:
    return n


def pages16(n: int) -> int:
    return (n - 1) // 16 * 16


# the first four gate prompts' lengths; conc1 is req-0..11, the repeat req-12..15
LENS = [110, 90, 104, 80]


def first_turns(i: int) -> list[str]:
    return [f"req-{i}", f"req-{i + 12}"]


@pytest.mark.parametrize(
    "cached, floor, unkept, hit",
    [
        # reference §2.4 (floor = identity)
        pytest.param([(0, 90, ["r1", "r13"])], identity, {"r2"}, False, id="zero-other-unkept"),
        pytest.param([(96, 90, ["r0", "r12"]), (0, 90, ["r1", "r13"])], identity, {"r1", "r13"}, True,
                     id="zero-own-unkept"),
        pytest.param([(0, 90, ["r1", "r13"])], identity, {"r1", "r13"}, False, id="all-zero"),
        pytest.param([(80, 90, ["r0", "r12"])], identity, set(), False, id="below-floor"),
        # our own
        pytest.param([], identity, set(), False, id="nothing-cached"),
        pytest.param([(96, 90, ["r0"]), (0, 90, ["r1", "r13"])], identity, {"r1"}, False, id="zero-partly-unkept"),
        pytest.param([(96, 90, ["r0"]), (0, 90, ["r1"])], identity, set(), False, id="zero-kept"),
        pytest.param([(96, 90, ["r0"]), (50, 90, ["r1"])], identity, {"r1"}, False, id="short-hit-not-excused"),
        pytest.param([(90, 90, ["r0"])], identity, set(), True, id="exactly-floor"),
        pytest.param([(80, 90, ["r0"])], pages16, set(), True, id="whole-pages-floor"),
        pytest.param([(79, 90, ["r0"])], pages16, set(), False, id="below-whole-pages"),
        # recorded toy gate results (SPEC §10)
        pytest.param([(c, n, first_turns(i)) for i, (c, n) in enumerate(zip([144, 160, 112, 176], LENS))],
                     pages16, set(), True, id="toy-paged-record"),
        pytest.param([(c, n, first_turns(i)) for i, (c, n) in enumerate(zip([117, 220, 0, 0], LENS))],
                     identity, {"req-2", "req-3", "req-14", "req-15"}, True, id="toy-stateful-spec-record"),
        pytest.param([(c, n, first_turns(i)) for i, (c, n) in enumerate(zip([117, 220, 0, 0], LENS))],
                     identity, {"req-2", "req-3", "req-14"}, False, id="toy-stateful-spec-one-kept"),
    ],
)
def test_turn2_hit(
    cached: list[tuple[int, int, list[str]]], floor: Callable[[int], int], unkept: set[str], hit: bool
) -> None:
    assert turn2_hit(cached, floor, unkept) is hit


def test_floor_gets_the_first_prompt_length() -> None:
    seen: list[int] = []

    def floor(n: int) -> int:
        seen.append(n)
        return 0

    assert turn2_hit([(5, 110, ["a"]), (7, 90, ["b"])], floor, set())
    assert seen == [110, 90]
