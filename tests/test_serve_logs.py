"""The per-reason log limiter (serve/common/logs.py `Limiter`): under a flood of one reason the log holds the
first occurrence and then one count per interval; distinct reasons never hide one another; no
occurrence is lost from the counts."""

from __future__ import annotations

from serve.common.logs import Limiter


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _limiter(interval: float = 10.0):
    lines: list[tuple[str, str, dict]] = []
    clock = Clock()
    limit = Limiter(interval, write=lambda name, level, **f: lines.append((name, level, f)), clock=clock)
    return limit, lines, clock


def test_first_occurrence_is_written_then_counted():
    limit, lines, clock = _limiter()
    assert limit("client disconnected", reason="mid-body", path="/v1/completions")
    for _ in range(999):
        clock.t += 0.001
        assert not limit("client disconnected", reason="mid-body", path="/v1/completions")
    assert len(lines) == 1 and "repeated" not in lines[0][2]
    clock.t += 10.0
    assert limit("client disconnected", reason="mid-body", path="/tokenize")
    summary, fresh = lines[1:]
    assert summary[2]["repeated"] == 999 and summary[2]["reason"] == "mid-body"
    assert fresh[2] == {"reason": "mid-body", "path": "/tokenize"}


def test_flood_is_bounded_per_interval():
    """Property: N occurrences over T seconds write at most 2 lines per started interval, and the
    written line count plus the repeated counts equals N."""
    limit, lines, clock = _limiter(interval=1.0)
    n = 0
    for i in range(20000):
        clock.t += 0.0005  # 10 s of one reason at 2000/s
        limit("rejected", "WARN", reason="too_many_connections")
        n += 1
    limit.flush()
    assert len(lines) <= 2 * 11
    written = sum(1 for _, _, f in lines if "repeated" not in f)
    counted = sum(f.get("repeated", 0) for _, _, f in lines)
    assert written + counted == n


def test_reasons_are_independent_and_flush_writes_counts():
    limit, lines, clock = _limiter()
    assert limit("closed", reason="header_timeout")
    assert limit("closed", reason="body_timeout")
    assert not limit("closed", reason="header_timeout")
    assert not limit("closed", reason="header_timeout")
    limit.flush()
    assert [f.get("repeated") for _, _, f in lines] == [None, None, 2]
    limit.flush()  # nothing held: nothing written
    assert len(lines) == 3


def test_reason_defaults_to_the_event_name():
    limit, lines, _ = _limiter()
    assert limit("accept failed", "ERROR", error="EMFILE")
    assert not limit("accept failed", "ERROR", error="EMFILE")
    assert limit("other", "ERROR")
    assert [name for name, _, _ in lines] == ["accept failed", "other"]
