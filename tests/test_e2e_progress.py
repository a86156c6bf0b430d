"""e2e/progress.py: the gate is never silent for longer than its heartbeat, and says what runs."""

from __future__ import annotations

import io

from e2e.progress import Progress


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_silent_gate_beats_every_period_naming_what_runs_longest_first():
    clock, out = Clock(), io.StringIO()
    p = Progress(every=10, stream=out, tty=False, clock=clock)
    p.echo("first")
    p.busy("toy-paged/default", "step conc1")
    clock.t = 3
    p.busy("zygote", "compiling toy-spec")
    clock.t = 9.9
    p.tick()
    assert out.getvalue() == "first\n"  # not yet silent for 10 s
    clock.t = 10.0
    p.tick()
    beat = out.getvalue().splitlines()[-1]
    assert beat == "  ... 10s: toy-paged/default: step conc1 (10s); zygote: compiling toy-spec (7s)"
    clock.t = 15
    p.tick()
    assert len(out.getvalue().splitlines()) == 2  # the next beat waits its period
    clock.t = 20
    p.tick()
    assert len(out.getvalue().splitlines()) == 3


def test_lines_that_flow_keep_the_heartbeat_quiet_and_done_work_is_not_named():
    clock, out = Clock(), io.StringIO()
    p = Progress(every=10, stream=out, tty=False, clock=clock)
    p.busy("a", "step x")
    for t in range(1, 40):
        clock.t = t
        if t % 5 == 0:
            p.echo(f"line {t}")
        p.tick()
    assert "..." not in out.getvalue()
    p.done("a")
    clock.t = 60
    p.tick()
    assert out.getvalue().splitlines()[-1] == "  ... 60s: working"


def test_on_a_terminal_the_status_line_is_rewritten_and_cleared_before_a_real_line():
    clock, out = Clock(), io.StringIO()
    p = Progress(every=10, stream=out, tty=True, clock=clock)
    p.busy("z", "compiling")
    clock.t = 2.5
    p.tick()
    assert out.getvalue().startswith("\r\x1b[K  ... 2s: z: compiling")
    p.echo("real")
    assert out.getvalue().endswith("\r\x1b[Kreal\n")


def test_a_stopping_gate_prints_nothing_more():
    out, stopping = io.StringIO(), [False]
    p = Progress(every=10, stream=out, tty=False, clock=Clock(), suppress=lambda: stopping[0])
    p.echo("before")
    stopping[0] = True
    p.echo("  [FAIL] concurrent: server exited")
    assert out.getvalue() == "before\n"
