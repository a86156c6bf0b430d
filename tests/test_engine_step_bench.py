"""bench/engine_step.py's steady figure (issue 43): the median over the measured rounds with its spread,
and the flags that make it steady refused by name when wrong. Timing is never asserted: the figures are
computed from rounds given here, so each can be checked by hand."""

from __future__ import annotations

import pytest

from conftest import bench_module


def _round(tokens: int, wall: float, steps: int, step_s: float, kernel_s: float) -> dict:
    """A round whose decode steps took `step_s` in all outside the kernel's own time, split evenly."""
    es = bench_module("engine_step")
    parts = [k for k in es.PARTS if k != "kernel"]
    return {"tokens": tokens, "wall": wall, "steps": steps, "kernel": kernel_s,
            **{k: step_s / len(parts) for k in parts}}


def test_the_steady_line_is_the_median_of_the_rounds_with_their_least_and_most():
    es = bench_module("engine_step")
    rounds = [_round(1000, 0.010, 10, 0.010, 0.004), _round(1000, 0.020, 10, 0.030, 0.005),
              _round(1000, 0.040, 10, 0.020, 0.010)]
    line = es.steady(rounds)
    assert "median of 3 rounds" in line
    assert "tok/s 50,000 (25,000-100,000)" in line  # 1000 tokens over 0.02 s, the middle wall
    assert "step ms 2.000 (1.000-3.000)" in line
    assert "kernel ms 0.500 (0.400-1.000)" in line
    assert "step/kernel 2.50 (2.00-6.00)" in line  # each round's own ratio: 1.0/0.4, 3.0/0.5, 2.0/1.0


def test_a_round_with_no_kernel_time_gives_no_ratio():
    es = bench_module("engine_step")
    line = es.steady([_round(100, 0.01, 5, 0.005, 0.0)])
    assert "step/kernel" not in line and "step ms 1.000 (1.000-1.000)" in line


@pytest.mark.parametrize("args, says", [(["--warmup", "-1"], "--warmup -1 must be >= 0"),
                                        (["--rounds", "0"], "--rounds 0 must be >= 1"),
                                        (["--pin", "x"], "--pin 'x'")])
def test_flags_out_of_range_are_refused_by_name(args, says, capsys):
    es = bench_module("engine_step")
    with pytest.raises(SystemExit) as exc:
        es.main(args)
    assert exc.value.code == 2 and says in capsys.readouterr().err
